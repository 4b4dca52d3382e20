package push

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/hooks"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// sendMention is rig.send with mentions.
func (r *rig) sendMention(c store.Conversation, sender, body string, members, online, mentions []string) store.Message {
	r.t.Helper()
	res, err := r.st.Append(context.Background(), store.Append{Rows: true, Msg: store.Message{ConvID: c.ID, MsgID: r.ids.Add(1), Sender: sender,
		ClientMsgID: fmt.Sprint("c", r.ids.Load()), Kind: protocol.KindText, Body: body, ServerTime: time.Now().UnixMilli(), Mentions: mentions}})
	if err != nil {
		r.t.Fatal(err)
	}
	if err := r.p.Fanned(context.Background(), fanout.Fanned{Msg: res.Msg, Conv: c, Recipients: members, AllRecipients: true, Reached: online}); err != nil {
		r.t.Fatal(err)
	}
	return res.Msg
}

// quietFor waits until the queue is empty and checks that the providers
// got no request beyond the first n.
func (r *rig) quietFor(n int, what string) {
	r.t.Helper()
	waitFor(r.t, func() bool { b, _ := r.p.Backlog(); return b == 0 }, what+": the queue empties")
	time.Sleep(300 * time.Millisecond)
	if got := r.prov.requests(); len(got) != n {
		r.t.Fatalf("%s: %d requests, want %d: %+v", what, len(got), n, got[n:])
	}
}

// TestPusherMuteAndDND: a conversation the user muted produces no
// notification (but a mention of them by name does, and @everyone does
// not), and once unmuted the next carries the count of every unread
// message, muted ones included; do-not-disturb — until a time, or a
// daily window holding now — sends nothing, even for a mention; each
// suppressed notification is counted by reason.
func TestPusherMuteAndDND(t *testing.T) {
	eachEngine(t, func(t *testing.T, queue func(*testing.T) hooks.Queue) {
		r := newRig(t, queue, func(c *Config) { c.Burst = 20 * time.Millisecond })
		ctx := context.Background()
		r.register(store.PushReg{UserID: "bob", DeviceID: "phone", Provider: "apns", Token: "b0b0", Topic: "im.parley.app"})
		r.register(store.PushReg{UserID: "carol", DeviceID: "phone", Provider: "fcm", Token: "carol-fcm"})
		g := r.conv(7, store.Group, false, "alice", "bob", "carol")
		all, online := []string{"alice", "bob", "carol"}, []string{"alice"}

		if err := r.st.SetConvMute(ctx, "bob", g.ID, store.MuteForever); err != nil {
			t.Fatal(err)
		}
		r.send(g, "alice", "one", all, online)
		reqs := r.wait(1)
		if len(reqs) != 1 || reqs[0].Token != "carol-fcm" {
			t.Fatalf("bob muted the group: requests %+v, want carol's only", reqs)
		}
		r.sendMention(g, "alice", "everyone!", all, online, nil) // no names
		r.quietFor(2, "muted, a message without bob's name")
		m := r.sendMention(g, "alice", "@bob look", all, online, []string{"bob"})
		reqs = r.wait(4)
		if b := byProvider(reqs, "b0b0"); len(b) != 1 || b[0].Payload["seq"] != float64(m.Seq) || b[0].Payload["count"] != 3.0 {
			t.Fatalf("a mention of bob in the group he muted: %+v, want one notification of seq %d with count 3", b, m.Seq)
		}
		if muted, _ := r.p.Suppressed(); muted != 2 {
			t.Errorf("suppressed for a mute: %d, want 2", muted)
		}

		// A mute until a time: muted until then.
		if err := r.st.SetConvMute(ctx, "bob", g.ID, time.Now().Add(time.Hour).UnixMilli()); err != nil {
			t.Fatal(err)
		}
		r.send(g, "alice", "four", all, online)
		r.quietFor(5, "muted for an hour")
		// Unmuted: the next one counts all five, the muted ones included.
		if err := r.st.SetConvMute(ctx, "bob", g.ID, 0); err != nil {
			t.Fatal(err)
		}
		m = r.send(g, "alice", "five", all, online)
		reqs = r.wait(7)
		b := byProvider(reqs, "b0b0")
		if len(b) != 2 || b[1].Payload["seq"] != float64(m.Seq) || b[1].Payload["count"] != 5.0 || b[1].Payload["aps"].(map[string]any)["badge"] != 5.0 {
			t.Fatalf("after unmute: bob's %+v, want a second notification of seq %d with count and badge 5", b, m.Seq)
		}
		// A mute that has passed is no mute.
		if err := r.st.SetConvMute(ctx, "bob", g.ID, time.Now().Add(-time.Second).UnixMilli()); err != nil {
			t.Fatal(err)
		}
		r.send(g, "alice", "six", all, online)
		r.wait(9)

		// Do-not-disturb until a time: nothing, a mention neither.
		if err := r.st.SetDND(ctx, "bob", store.DND{Until: time.Now().Add(time.Hour).UnixMilli()}); err != nil {
			t.Fatal(err)
		}
		r.sendMention(g, "alice", "@bob dnd?", all, online, []string{"bob"})
		r.quietFor(10, "bob in do-not-disturb")
		if b := byProvider(r.prov.requests(), "b0b0"); len(b) != 3 {
			t.Fatalf("bob in do-not-disturb got %d notifications, want still 3", len(b))
		}
		// A daily window holding now (in bob's UTC offset), its until passed.
		now := time.Now().UTC().Add(5 * time.Hour)
		start := (now.Hour()*60 + now.Minute() + 1440 - 30) % 1440
		if err := r.st.SetDND(ctx, "bob", store.DND{Until: 1, Daily: true, Start: start, End: (start + 60) % 1440, Offset: 300}); err != nil {
			t.Fatal(err)
		}
		r.send(g, "alice", "eight", all, online)
		r.quietFor(11, "bob in his daily window")
		if _, dnd := r.p.Suppressed(); dnd != 2 {
			t.Errorf("suppressed for do-not-disturb: %d, want 2", dnd)
		}
		// Off: notified again.
		if err := r.st.SetDND(ctx, "bob", store.DND{}); err != nil {
			t.Fatal(err)
		}
		m = r.send(g, "alice", "nine", all, online)
		reqs = r.wait(13)
		if b := byProvider(reqs, "b0b0"); len(b) != 4 || b[3].Payload["seq"] != float64(m.Seq) || b[3].Payload["count"] != 9.0 {
			t.Fatalf("after do-not-disturb: bob's %+v, want a fourth of seq %d counting 9", b, m.Seq)
		}
	})
}

// TestPusherDeviceRateLimit: a flood of ten conversations' messages to
// one device within its rate (3 per 6 s) sends three at once; the other
// seven are held, not dropped: once the device has room one notification
// goes, the latest held, with coalesced 6 (the held ones it stands for)
// and the badge of all ten; each held one is counted. The next after
// that, with room again, carries no coalesced. Another device of another
// user is not held by the first's flood.
func TestPusherDeviceRateLimit(t *testing.T) {
	eachEngine(t, func(t *testing.T, queue func(*testing.T) hooks.Queue) {
		r := newRig(t, queue, func(c *Config) {
			c.Burst = 10 * time.Millisecond
			c.DeviceRate, c.DeviceInterval = 3, 6*time.Second
		})
		r.register(store.PushReg{UserID: "bob", DeviceID: "phone", Provider: "apns", Token: "b0b0", Topic: "im.parley.app"})
		r.register(store.PushReg{UserID: "dave", DeviceID: "phone", Provider: "fcm", Token: "dave-fcm"})
		var convs []store.Conversation
		for i := range 10 {
			convs = append(convs, r.conv(uint64(100+i), store.Direct, false, "alice", "bob"))
		}
		start := time.Now()
		for _, c := range convs {
			r.send(c, "alice", "flood", []string{"alice", "bob"}, []string{"alice"})
		}
		dc := r.conv(200, store.Direct, false, "alice", "dave")
		r.send(dc, "alice", "not flooded", []string{"alice", "dave"}, []string{"alice"})
		reqs := r.wait(4)
		if d := byProvider(reqs, "dave-fcm"); len(d) != 1 {
			t.Fatalf("dave's device: %d notifications, want 1 (bob's flood is bob's)", len(d))
		}
		if b := byProvider(reqs, "b0b0"); len(b) != 3 || time.Since(start) > 2*time.Second {
			t.Fatalf("bob's device got %d notifications in the first %v, want 3", len(b), time.Since(start))
		}
		for _, q := range byProvider(reqs, "b0b0") {
			if q.Payload["coalesced"] != nil {
				t.Errorf("a notification within the rate carries coalesced: %v", q.Payload)
			}
		}
		if got := r.p.RateLimited(); got != 7 {
			t.Errorf("held: %d, want 7", got)
		}
		reqs = r.wait(5)
		b := byProvider(reqs, "b0b0")
		if len(b) != 4 {
			t.Fatalf("bob's device: %d notifications, want 4", len(b))
		}
		held := b[3]
		if held.Payload["coalesced"] != 6.0 || held.Payload["aps"].(map[string]any)["badge"] != 10.0 || held.Payload["count"] != 1.0 {
			t.Fatalf("the held notification %v, want coalesced 6, badge 10, count 1", held.Payload)
		}
		if wait := held.At.Sub(b[2].At); wait < time.Second || wait > 4*time.Second {
			t.Errorf("the held one went %v after the third, want about 2 s (a token every 2 s)", wait)
		}
		time.Sleep(2500 * time.Millisecond) // a token again
		m := r.send(convs[0], "alice", "later", []string{"alice", "bob"}, []string{"alice"})
		reqs = r.wait(6)
		last := byProvider(reqs, "b0b0")[4]
		if last.Payload["coalesced"] != nil || last.Payload["seq"] != float64(m.Seq) || last.Payload["count"] != 2.0 {
			t.Fatalf("the next notification %v, want seq %d, count 2, no coalesced", last.Payload, m.Seq)
		}
		if b, d := r.p.Backlog(); b != 0 || d != 0 {
			t.Errorf("backlog %d, dead %d", b, d)
		}
	})
}

// TestLimiterReplacesHeld: a notification within the rate while one is
// held stands for the held ones, which are then never sent.
func TestLimiterReplacesHeld(t *testing.T) {
	l := newLimiter(2, time.Second)
	now := time.Unix(1000, 0)
	for i := range 2 {
		if ok, _ := l.take("d", now); !ok {
			t.Fatalf("take %d within the rate refused", i)
		}
	}
	if ok, _ := l.take("d", now); ok {
		t.Fatal("a third within the second passed")
	}
	l.hold("d", "bob", note{seq: 3}, now)
	l.hold("d", "bob", note{seq: 4}, now)
	if out, next := l.due(now); len(out) != 0 || !next.Equal(now.Add(500*time.Millisecond)) {
		t.Fatalf("due now: %d, next %v; want none before %v", len(out), next, now.Add(500*time.Millisecond))
	}
	ok, coalesced := l.take("d", now.Add(600*time.Millisecond))
	if !ok || coalesced != 2 {
		t.Fatalf("take with room: %v, coalesced %d; want true, 2", ok, coalesced)
	}
	if out, _ := l.due(now.Add(2 * time.Second)); len(out) != 0 {
		t.Fatalf("the replaced held notification was still due: %+v", out[0])
	}
	if len(l.mu.devs) != 0 {
		t.Errorf("a full bucket with nothing held is kept: %d devices", len(l.mu.devs))
	}
	l.hold("e", "carol", note{seq: 9}, now) // a fresh device holds only when told
	if out, _ := l.due(now); len(out) != 1 || out[0].n.seq != 9 || out[0].count != 1 {
		t.Fatalf("a device with room: due %+v, want its held one at once", out)
	}
}
