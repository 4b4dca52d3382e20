package clustertest

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-im/parley/protocol"
)

// ws is a minimal synchronous client for these tests.
type ws struct {
	t   *testing.T
	c   *websocket.Conn
	in  chan protocol.Frame
	rid int
}

func dial(t *testing.T, c *Cluster, g *Proc, user, device string) *ws {
	t.Helper()
	h := http.Header{"Authorization": {"Bearer " + c.Token(user)}}
	conn, _, err := websocket.DefaultDialer.Dial(g.URL()+"/v1/ws?device="+device, h)
	if err != nil {
		t.Fatalf("dial %s: %v", g.Name, err)
	}
	w := &ws{t: t, c: conn, in: make(chan protocol.Frame, 1024)}
	go func() {
		defer close(w.in)
		for {
			var f protocol.Frame
			if err := conn.ReadJSON(&f); err != nil {
				return
			}
			w.in <- f
		}
	}()
	t.Cleanup(func() { conn.Close() })
	w.next(protocol.TypeHello, 10*time.Second)
	return w
}

func (w *ws) next(typ string, d time.Duration) *protocol.Frame {
	w.t.Helper()
	timeout := time.After(d)
	for {
		select {
		case f, ok := <-w.in:
			if !ok {
				w.t.Fatalf("connection closed waiting for %s", typ)
			}
			if f.Type == typ {
				return &f
			}
		case <-timeout:
			w.t.Fatalf("no %s within %v", typ, d)
		}
	}
}

func (w *ws) call(f protocol.Frame) *protocol.Frame {
	w.t.Helper()
	w.rid++
	f.RID = string(rune('a'+w.rid%26)) + time.Now().Format("150405.000000000")
	if err := w.c.WriteJSON(f); err != nil {
		w.t.Fatal(err)
	}
	timeout := time.After(20 * time.Second)
	for {
		select {
		case r, ok := <-w.in:
			if !ok {
				w.t.Fatalf("connection closed waiting for %s", f.Type)
			}
			if r.RID == f.RID {
				return &r
			}
		case <-timeout:
			w.t.Fatalf("no answer to %s", f.Type)
		}
	}
}

func must(t *testing.T, f *protocol.Frame, typ string) *protocol.Frame {
	t.Helper()
	if f.Type != typ {
		b, _ := json.Marshal(f)
		t.Fatalf("got %s, want %s", b, typ)
	}
	return f
}

// TestClusterSmoke: two users on different gateways, two chat processes.
func TestClusterSmoke(t *testing.T) {
	c := Start(t, Options{Gateways: 2, Chats: 2})
	alice := dial(t, c, c.Gateways[0], "alice", "d")
	bob := dial(t, c, c.Gateways[1], "bob", "d")
	conv := must(t, alice.call(protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "bob"}), protocol.TypeConv).Conv.ConvID
	for i := 0; i < 5; i++ {
		must(t, alice.call(protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: string(rune('a' + i)), Body: "hi"}), protocol.TypeAck)
	}
	for i := uint64(1); i <= 5; {
		m := bob.next(protocol.TypeMsg, 10*time.Second).Message
		if m.Seq == i {
			i++
		}
	}
	_ = context.Background()
}
