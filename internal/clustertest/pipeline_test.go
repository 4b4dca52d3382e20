package clustertest

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/parley-im/parley/protocol"
)

// TestPipelinedSendsInOrder: one connection writes its sends to one group
// back to back, without waiting for the ACKs (the gateway forwards those
// that queue behind the send in flight as one batch to the owner, which
// writes them in the order sent), with a repeated client_msg_id and a
// ping among them. Every request is answered once, in the order sent; the
// seqs follow the order of the sends, dense; the repeat is a duplicate of
// the first; the stored history holds each message once at its ACKed seq.
func TestPipelinedSendsInOrder(t *testing.T) {
	c := Start(t, Options{Gateways: 1, Chats: 2})
	g := c.Gateways[0]
	alice := dialWait(t, c, g, "alice")
	defer alice.close()
	r, err := alice.call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: "pipe", Members: []string{"bob", "carol"}}, 20*time.Second)
	if err != nil || r.Conv == nil {
		t.Fatalf("create_group: %v %+v", err, r)
	}
	conv := r.Conv.ConvID
	// The partitions shared out between the chat processes (their leases
	// settle in a few seconds); the first send makes the owner load the
	// conversation.
	time.Sleep(5 * time.Second)
	c.waitOwner(conv, "", 10*time.Second)
	if a, err := alice.call(protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: "m0", Body: "0"}, 20*time.Second); err != nil || a.Type != protocol.TypeAck || a.Seq != 1 {
		t.Fatalf("first send: %v %+v", err, a)
	}

	const n = 300
	const dupAt, pingAt = 150, 200 // frame dupAt repeats m10's client_msg_id
	type sent struct {
		rid, cmid string
		ping      bool
	}
	var frames []sent
	for i := 1; i <= n; i++ {
		f := protocol.Frame{Type: protocol.TypeSend, RID: "s" + strconv.Itoa(i), ConvID: conv, ClientMsgID: "m" + strconv.Itoa(i), Body: strconv.Itoa(i)}
		if i == dupAt {
			f.ClientMsgID, f.Body = "m10", "10"
		}
		if i == pingAt {
			f = protocol.Frame{Type: protocol.TypePing, RID: "p"}
		}
		_ = alice.ws.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if err := alice.ws.WriteJSON(f); err != nil {
			t.Fatal(err)
		}
		frames = append(frames, sent{rid: f.RID, cmid: f.ClientMsgID, ping: f.Type == protocol.TypePing})
	}

	last := uint64(1) // the seq of the last new message ACKed
	seqOf := map[string]uint64{"m0": 1}
	var refused []sent // answered with a retryable error (a partition moving): sent again below
	_ = alice.ws.SetReadDeadline(time.Now().Add(60 * time.Second))
	for _, s := range frames {
		var a protocol.Frame
		for {
			_, data, err := alice.ws.ReadMessage()
			if err != nil {
				t.Fatalf("waiting for the answer to %s: %v", s.rid, err)
			}
			if err := json.Unmarshal(data, &a); err != nil {
				t.Fatal(err)
			}
			if a.RID != "" {
				break // not a push
			}
		}
		if a.RID != s.rid {
			t.Fatalf("answer to %s (%s) where %s's was due: answers out of order", a.RID, a.Type, s.rid)
		}
		switch {
		case s.ping:
			if a.Type != protocol.TypePong {
				t.Fatalf("ping answered %+v", a)
			}
		case a.Type == protocol.TypeError && a.Code.Retryable():
			refused = append(refused, s)
		case a.Type != protocol.TypeAck:
			t.Fatalf("send %s answered %s %s: %s", s.rid, a.Type, a.Code, a.Error)
		case s.cmid == "m10" && s.rid != "s10":
			if !a.Duplicate || a.Seq != seqOf["m10"] {
				t.Fatalf("the repeat of m10: seq %d duplicate %v, want seq %d duplicate", a.Seq, a.Duplicate, seqOf["m10"])
			}
		default:
			if a.Duplicate || a.Seq <= last {
				t.Fatalf("send %s (%s): seq %d duplicate %v after seq %d: seqs out of the order sent", s.rid, s.cmid, a.Seq, a.Duplicate, last)
			}
			seqOf[s.cmid] = a.Seq
			last = a.Seq
		}
	}
	if len(refused) > 0 {
		t.Logf("%d sends refused with a retryable error, sent again", len(refused))
	}
	for _, s := range refused {
		if _, ok := seqOf[s.cmid]; ok {
			continue // the m10 repeat
		}
		var a *protocol.Frame
		for range 20 {
			a, err = alice.call(protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: s.cmid, Body: s.cmid[1:]}, 20*time.Second)
			if err == nil && a.Type == protocol.TypeAck {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if a == nil || a.Type != protocol.TypeAck {
			t.Fatalf("send %s again: %v %+v", s.cmid, err, a)
		}
		seqOf[s.cmid] = a.Seq
	}
	want := uint64(len(seqOf) + 1)

	msgs, err := readHistory(c, "bob", conv)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != int(want-1) {
		t.Fatalf("history holds %d messages, want %d", len(msgs), want-1)
	}
	for i, m := range msgs {
		if m.Seq != uint64(i+1) || seqOf[m.ClientMsgID] != m.Seq {
			t.Fatalf("history[%d]: seq %d client_msg_id %q (ACKed at %d)", i, m.Seq, m.ClientMsgID, seqOf[m.ClientMsgID])
		}
		if want := m.ClientMsgID[1:]; m.Body != want {
			t.Fatalf("seq %d: body %q, want %q", m.Seq, m.Body, want)
		}
	}
}
