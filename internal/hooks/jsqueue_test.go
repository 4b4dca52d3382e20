package hooks

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsio "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/webhook"
)

func TestHeaderKey(t *testing.T) {
	h := natsio.Header{}
	h.Set(hdrConv, "386123681175511040")
	h.Set(hdrSeq, "42")
	h.Set(hdrType, "1")
	if k, ok := headerKey(h); !ok || k != (qkey{conv: 386123681175511040, seq: 42, typ: 1}) {
		t.Fatalf("%+v %v", k, ok)
	}
	for _, bad := range [][3]string{
		{"", "1", "0"}, {"1", "x", "0"}, {"1", "1", "-1"}, {"1", "1", strconv.Itoa(len(webhook.Types))}, {"-1", "1", "0"},
	} {
		h := natsio.Header{}
		h.Set(hdrConv, bad[0])
		h.Set(hdrSeq, bad[1])
		h.Set(hdrType, bad[2])
		if k, ok := headerKey(h); ok {
			t.Errorf("%v accepted as %+v", bad, k)
		}
	}
}

// FuzzHeaderKey: the queued event's key decoder never panics and accepts
// only a known type.
func FuzzHeaderKey(f *testing.F) {
	f.Add("1", "2", "0")
	f.Add("18446744073709551615", "0", "7")
	f.Fuzz(func(t *testing.T, conv, seq, typ string) {
		h := natsio.Header{}
		h.Set(hdrConv, conv)
		h.Set(hdrSeq, seq)
		h.Set(hdrType, typ)
		if k, ok := headerKey(h); ok && int(k.typ) >= len(webhook.Types) {
			t.Fatalf("type %d accepted", k.typ)
		}
	})
}

// fakeOwner holds the partitions a test says (the lease logic has its own
// tests in internal/cluster/lease).
type fakeOwner struct {
	n    int
	mu   sync.Mutex
	held map[int]bool
}

func holdingAll(n int) *fakeOwner {
	o := &fakeOwner{n: n, held: map[int]bool{}}
	for p := range n {
		o.held[p] = true
	}
	return o
}

func (o *fakeOwner) Partitions() int { return o.n }
func (o *fakeOwner) Holds(p int) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.held[p]
}
func (o *fakeOwner) Watch(f func(int, bool)) {
	for p := range o.n {
		if o.Holds(p) {
			f(p, true)
		}
	}
}

func natsURL(t *testing.T) string {
	u := os.Getenv("PARLEY_TEST_NATS")
	if u == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires PARLEY_TEST_NATS")
		}
		t.Skip("PARLEY_TEST_NATS not set")
	}
	return u
}

// TestJetStreamQueue: the cluster-mode queue on a real NATS JetStream. A
// process produces events (one conversation's two fan-outs finishing out
// of seq order among them) while the receiver is down, and stops without
// delivering any; another process, owning the partitions now, takes the
// consumers over and delivers every event in per-conversation order; an
// event the receiver always refuses becomes a dead letter in the shared
// dead-letter stream, and the conversation goes on.
func TestJetStreamQueue(t *testing.T) {
	nc, err := natsio.Connect(natsURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ns := fmt.Sprintf("hk%d", time.Now().UnixNano())
	var down atomic.Bool
	down.Store(true)
	poisoned := webhook.ID(3, 5, webhook.MessageCreated)
	rcv := newReceiver(t, func(ev webhook.Event, _ int) int {
		switch {
		case down.Load():
			return http.StatusServiceUnavailable
		case ev.ID == poisoned:
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	run := func(cfg Config, node string) (*Hooks, func()) {
		h, err := New(cfg, Options{Cluster: &Cluster{NATS: nc, Namespace: ns, Owner: holdingAll(4), Node: node}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { h.Run(ctx); close(done) }()
		var once sync.Once
		stop := func() { once.Do(func() { cancel(); <-done }) }
		t.Cleanup(stop)
		return h, stop
	}
	defer func() {
		js, _ := jetstream.New(nc)
		for _, s := range []string{strings.ToUpper(ns) + "_HOOKS", strings.ToUpper(ns) + "_HOOKS_DEAD"} {
			_ = js.DeleteStream(context.Background(), s)
		}
	}()

	cfg := testConfig(rcv.srv.URL)
	h1, stop1 := run(cfg, "a")
	want := produce(t, h1, 6, 12)
	group := store.Conversation{ID: 7, Kind: store.Group}
	for _, seq := range []uint64{2, 1} { // fan-outs that finished out of seq order
		if err := h1.Fanned(context.Background(), fanout.Fanned{Msg: textMsg(7, seq, "alice", "x"), Conv: group,
			Recipients: []string{"alice"}, AllRecipients: true, Reached: []string{"alice"}}); err != nil {
			t.Fatal(err)
		}
		want = append(want, webhook.ID(7, seq, webhook.MessageCreated))
	}
	// The first process attempts (and fails) for a while, then is gone.
	time.Sleep(500 * time.Millisecond)
	stop1()
	if h1.Stats()[0].Delivered != 0 {
		t.Fatal("delivered while the receiver was down")
	}

	cfg.MaxAttempts = 4
	h2, _ := run(cfg, "b")
	down.Store(false)
	rcv.waitAcked(t, slices.DeleteFunc(want, func(id string) bool { return id == poisoned }), 30*time.Second)
	rcv.checkOrder(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := h2.Stats()[0]
		if st.Dead == 1 && st.Backlog == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v, want 1 dead and no backlog", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	dead, err := h2.Dead("ep")
	if err != nil || len(dead) != 1 {
		t.Fatalf("dead letters %d (%v), want 1", len(dead), err)
	}
	var ev webhook.Event
	if err := json.Unmarshal(dead[0], &ev); err != nil || ev.ID != poisoned {
		t.Fatalf("dead letter %s (%v), want %s", dead[0], err, poisoned)
	}
}
