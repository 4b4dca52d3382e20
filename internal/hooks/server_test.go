package hooks_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/hooks"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
	"github.com/parley-im/parley/webhook"
)

// wsConn is a synchronous client that ignores pushes.
type wsConn struct {
	t   *testing.T
	ws  *websocket.Conn
	rid int
}

func dial(t *testing.T, s *servertest.Server, user string) *wsConn {
	t.Helper()
	h := http.Header{"Authorization": {"Bearer " + s.Token(user)}}
	ws, _, err := websocket.DefaultDialer.Dial(s.URL+"/v1/ws?device=d1", h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	return &wsConn{t: t, ws: ws}
}

func (c *wsConn) call(f protocol.Frame) *protocol.Frame {
	c.t.Helper()
	c.rid++
	f.RID = fmt.Sprint(c.rid)
	if err := c.ws.WriteJSON(f); err != nil {
		c.t.Fatal(err)
	}
	_ = c.ws.SetReadDeadline(time.Now().Add(20 * time.Second))
	for {
		_, data, err := c.ws.ReadMessage()
		if err != nil {
			c.t.Fatal(err)
		}
		var r protocol.Frame
		if err := json.Unmarshal(data, &r); err != nil {
			c.t.Fatal(err)
		}
		if r.RID == f.RID {
			if r.Type == protocol.TypeError {
				c.t.Fatalf("%s: %s %s", f.Type, r.Code, r.Error)
			}
			return &r
		}
	}
}

// TestServerStalledReceiverDoesNotSlowSends: with the endpoint's receiver
// blocked, every send is acknowledged (the fan-out only queues); once it
// answers, every event arrives signed, in per-conversation order, with the
// offline recipients and the membership changes made through the client
// protocol.
func TestServerStalledReceiverDoesNotSlowSends(t *testing.T) {
	const secret = "server-test-secret"
	release := make(chan struct{})
	var (
		mu       sync.Mutex
		started  int
		answered int
		arrivals = map[uint64][]webhook.Event{}
		acked    = map[string]webhook.Event{}
		bad      []error
	)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ev, _, err := webhook.VerifyRequest(r, []byte(secret))
		mu.Lock()
		started++
		if err != nil {
			bad = append(bad, err)
		} else {
			arrivals[ev.ConvID] = append(arrivals[ev.ConvID], ev)
		}
		mu.Unlock()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		mu.Lock()
		answered++
		if err == nil {
			acked[ev.ID] = ev
		}
		mu.Unlock()
	}))
	defer recv.Close()
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock()

	s := servertest.Start(t, servertest.WithConfig(func(c *config.Config) {
		c.Webhooks = hooks.Config{MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, Endpoints: []hooks.Endpoint{{
			Name: "bots", URL: recv.URL, Secret: secret, Timeout: time.Minute, Preview: hooks.PreviewFull,
		}}}
	}))
	alice := dial(t, s, "alice")
	direct := alice.call(protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "bob"}).Conv.ConvID
	group := alice.call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: "g", Members: []string{"bob", "carol"}}).Conv.ConvID
	alice.call(protocol.Frame{Type: protocol.TypeAddMembers, ConvID: group, Members: []string{"dave"}})
	alice.call(protocol.Frame{Type: protocol.TypeRemove, ConvID: group, Members: []string{"carol"}})

	const n = 60
	texts := map[uint64][]uint64{}
	for i := range n {
		for _, conv := range []uint64{direct, group} {
			a := alice.call(protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: fmt.Sprintf("m-%d-%d", conv, i), Body: fmt.Sprintf("hello %d", i)})
			if a.Type != protocol.TypeAck {
				t.Fatalf("send answered %s", a.Type)
			}
			texts[conv] = append(texts[conv], a.Seq)
		}
	}
	// Every send was acknowledged while the receiver held its requests.
	mu.Lock()
	st, an := started, answered
	mu.Unlock()
	if an != 0 {
		t.Fatalf("%d webhook requests answered before the receiver was released", an)
	}
	deadline := time.Now().Add(20 * time.Second)
	for st == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		mu.Lock()
		st = started
		mu.Unlock()
	}
	if st == 0 {
		t.Fatal("no webhook request reached the receiver")
	}
	unblock()

	var want []string
	for conv, seqs := range texts {
		for _, seq := range seqs {
			want = append(want, webhook.ID(conv, seq, webhook.MessageCreated), webhook.ID(conv, seq, webhook.RecipientOffline))
		}
	}
	deadline = time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		missing := 0
		for _, id := range want {
			if _, ok := acked[id]; !ok {
				missing++
			}
		}
		mu.Unlock()
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events not delivered", missing, len(want))
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Fatalf("signature verification failed: %v", bad)
	}
	for conv, evs := range arrivals {
		for i := 1; i < len(evs); i++ {
			a, b := evs[i-1], evs[i]
			if a.Seq > b.Seq || (a.Seq == b.Seq && slices.Index(webhook.Types, a.Type) > slices.Index(webhook.Types, b.Type)) {
				t.Fatalf("conv %d: %s arrived after %s", conv, b.ID, a.ID)
			}
		}
	}
	offline := func(conv, seq uint64) webhook.OfflineData {
		var d webhook.OfflineData
		if err := json.Unmarshal(acked[webhook.ID(conv, seq, webhook.RecipientOffline)].Data, &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := offline(direct, texts[direct][0]); !slices.Equal(d.Users, []string{"bob"}) || d.Preview == nil || d.Preview.Body != "hello 0" {
		t.Fatalf("direct recipient.offline %+v", d)
	}
	if d := offline(group, texts[group][n-1]); !slices.Equal(d.Users, []string{"bob", "dave"}) {
		t.Fatalf("group recipient.offline users %v, want [bob dave] (carol was removed)", d.Users)
	}
	var created webhook.MessageData
	if err := json.Unmarshal(acked[webhook.ID(group, texts[group][3], webhook.MessageCreated)].Data, &created); err != nil ||
		created.Message.Body != "hello 3" || created.Message.Sender != "alice" || created.ConvKind != protocol.ConvGroup {
		t.Fatalf("message.created %+v (%v)", created, err)
	}
	var added, removed bool
	for _, ev := range acked {
		var d webhook.MemberData
		_ = json.Unmarshal(ev.Data, &d)
		switch {
		case ev.Type == webhook.MemberAdded && ev.ConvID == group && slices.Equal(d.Users, []string{"dave"}) && d.Actor == "alice":
			added = true
		case ev.Type == webhook.MemberRemoved && ev.ConvID == group && slices.Equal(d.Users, []string{"carol"}) && d.Actor == "alice":
			removed = true
		}
	}
	if !added || !removed {
		t.Fatalf("membership events: added %v removed %v", added, removed)
	}
}
