package fanout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/parley-im/parley/internal/bus"
	"github.com/parley-im/parley/internal/bus/local"
	lpebble "github.com/parley-im/parley/internal/ledger/pebble"
	"github.com/parley-im/parley/internal/registry"
	"github.com/parley-im/parley/internal/registry/memory"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/pebble"
	"github.com/parley-im/parley/protocol"
)

// fanRig is a fan-out on real in-memory engines: a Pebble store and
// ledger, the in-process registry and bus.
type fanRig struct {
	st     store.Store
	led    Ledger
	reg    registry.Registry
	b      bus.Bus
	online *Online
	msgID  uint64
}

func newFanRig(t *testing.T) *fanRig {
	t.Helper()
	ctx := context.Background()
	st, err := pebble.Open(ctx, pebble.Config{Dir: "db", FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	led, err := lpebble.Open(lpebble.Config{Dir: "ledger", FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { led.Close() })
	return &fanRig{st: st, led: led, reg: memory.New(), b: local.New(), online: NewOnline(st)}
}

func (r *fanRig) fanout(t *testing.T, cfg Config, tiers Tiers, consumers ...Consumer) *Fanout {
	t.Helper()
	f, err := New(cfg, Deps{Store: r.st, Registry: r.reg, Bus: r.b, Ledger: r.led, Online: r.online,
		Tiers: tiers, Consumers: consumers})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (r *fanRig) conv(t *testing.T, id uint64, kind store.ConvKind, users ...string) {
	t.Helper()
	members := make([]store.Member, len(users))
	for i, u := range users {
		members[i] = store.Member{UserID: u}
	}
	if err := r.st.CreateConversation(context.Background(), store.Conversation{ID: id, Kind: kind, Name: "c"}, members); err != nil {
		t.Fatal(err)
	}
}

func (r *fanRig) connect(t *testing.T, user, node string) {
	t.Helper()
	ctx := context.Background()
	if _, err := r.reg.Register(ctx, registry.Entry{User: user, Device: "d", Node: node, Session: user}); err != nil {
		t.Fatal(err)
	}
	r.online.Connected(ctx, user)
}

func (r *fanRig) append(t *testing.T, conv uint64, sender string) store.Message {
	t.Helper()
	r.msgID++
	res, err := r.st.Append(context.Background(), store.Append{Msg: store.Message{
		ConvID: conv, MsgID: r.msgID, Sender: sender, ClientMsgID: fmt.Sprint("c", r.msgID), Kind: protocol.KindText, Body: "x", ServerTime: 1,
	}})
	if err != nil {
		t.Fatal(err)
	}
	return res.Msg
}

var chatTiers = Tiers{SmallBelow: 200, LargeAbove: 2000, Hysteresis: 0.1}

func TestTiersFor(t *testing.T) {
	tests := []struct {
		cur  uint8
		n    int
		want uint8
	}{
		{0, 2, TierSmall}, {0, 199, TierSmall}, {0, 200, TierMedium}, {0, 2000, TierMedium}, {0, 2001, TierLarge},
		{TierSmall, 200, TierMedium}, {TierSmall, 5000, TierLarge},
		{TierMedium, 190, TierMedium}, {TierMedium, 179, TierSmall},
		{TierLarge, 1900, TierLarge}, {TierLarge, 1799, TierMedium}, {TierLarge, 10, TierSmall},
	}
	for _, tc := range tests {
		if got := chatTiers.For(tc.cur, tc.n); got != tc.want {
			t.Errorf("For(%s, %d) = %s, want %s", TierName(tc.cur), tc.n, TierName(got), TierName(tc.want))
		}
	}
}

// TestPushIsOneDeliveryPerNode: members spread over three gateway nodes get
// one bus delivery per node, carrying the message once with the node's
// local recipients.
func TestPushIsOneDeliveryPerNode(t *testing.T) {
	ctx := context.Background()
	r := newFanRig(t)
	var mu sync.Mutex
	got := map[string][]bus.Delivery{}
	for _, n := range []string{"n1", "n2", "n3"} {
		cancel, _ := r.b.Subscribe(ctx, n, func(d bus.Delivery) error {
			mu.Lock()
			got[n] = append(got[n], d)
			mu.Unlock()
			return nil
		})
		defer cancel()
	}
	r.conv(t, 1, store.Group, "a", "b", "c", "d", "e", "f")
	nodes := map[string]string{"a": "n1", "b": "n1", "c": "n2", "d": "n2", "e": "n3"} // f offline
	for u, n := range nodes {
		r.connect(t, u, n)
	}
	f := r.fanout(t, Config{}, chatTiers)
	m := r.append(t, 1, "a")
	if err := f.FanOut(ctx, Job{Msg: m}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n == 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	want := map[string]int{"n1": 2, "n2": 2, "n3": 1}
	for n, users := range want {
		if len(got[n]) != 1 || len(got[n][0].Users) != users || got[n][0].Seq != m.Seq {
			t.Fatalf("node %s got %+v, want one delivery for %d users", n, got[n], users)
		}
	}
	var fr protocol.Frame
	if err := json.Unmarshal(got["n1"][0].Frame, &fr); err != nil || fr.Type != protocol.TypeMsg || fr.Message == nil || fr.Message.Seq != m.Seq {
		t.Fatalf("pushed frame %s (%v), want the message", got["n1"][0].Frame, err)
	}
}

type wantsReached bool

func (w wantsReached) WantsReached() bool                 { return bool(w) }
func (wantsReached) Fanned(context.Context, Fanned) error { return nil }

// TestNoConsumerCostsNothing: without a consumer that wants the users a
// push reached, the fan-out collects nothing and allocates nothing for
// them.
func TestNoConsumerCostsNothing(t *testing.T) {
	m := store.Message{ConvID: 1, Seq: 2, Kind: protocol.KindText}
	users := []string{"a", "b"}
	for _, f := range []*Fanout{{}, {consumers: []Consumer{wantsReached(false)}}} {
		if n := testing.AllocsPerRun(100, func() {
			rc := f.collectReached(m)
			rc.add(users)
		}); n != 0 {
			t.Fatalf("consumers %v: %v allocations per message", f.consumers, n)
		}
		if f.collectReached(m) != nil {
			t.Fatal("collecting reached users no consumer wants")
		}
	}
	f := &Fanout{consumers: []Consumer{wantsReached(false), wantsReached(true)}}
	rc := f.collectReached(m)
	rc.add(users)
	if rc == nil || len(rc.users) != 2 {
		t.Fatalf("collected %v", rc)
	}
	m.Kind = protocol.KindSystem
	if f.collectReached(m) != nil {
		t.Fatal("collecting for a system message")
	}
}

// recorder is a consumer that records what it is handed and fails the
// first attempt at each message fail picks.
type recorder struct {
	mu       sync.Mutex
	fail     func(Fanned) bool
	failed   map[store.Pending]bool
	attempts int
	got      map[uint64][]Fanned // conv → what Fanned accepted, in order
}

func (c *recorder) WantsReached() bool { return true }

func (c *recorder) Fanned(_ context.Context, f Fanned) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.attempts++
	k := store.Pending{ConvID: f.Msg.ConvID, Seq: f.Msg.Seq}
	if c.fail(f) && !c.failed[k] {
		c.failed[k] = true
		return errors.New("consumer down")
	}
	c.got[f.Msg.ConvID] = append(c.got[f.Msg.ConvID], f)
	return nil
}

func (c *recorder) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, fs := range c.got {
		n += len(fs)
	}
	return n
}

// TestConsumerGetsEveryMessage: a consumer given in Deps receives every
// fanned-out message, per conversation in seq order, with the recipients
// of its tier (all members of a direct conversation and a small group, the
// members online of a medium one) and the users reached; a consumer error
// keeps the message and retries its fan-out, so none is lost, skipped or
// overtaken by a later one of its conversation.
func TestConsumerGetsEveryMessage(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	r := newFanRig(t)
	r.conv(t, 1, store.Group, "a", "b", "c")           // small
	r.conv(t, 2, store.Direct, "a", "b")               // direct
	r.conv(t, 3, store.Group, "a", "b", "c", "d", "e") // medium: a and b online
	r.connect(t, "a", "n1")
	r.connect(t, "b", "n2")
	for _, n := range []string{"n1", "n2"} {
		stop, err := r.b.Subscribe(ctx, n, func(bus.Delivery) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
	}
	c := &recorder{fail: func(f Fanned) bool { return f.Msg.Seq%4 == 2 }, failed: map[store.Pending]bool{}, got: map[uint64][]Fanned{}}
	f := r.fanout(t, Config{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}, Tiers{SmallBelow: 4, LargeAbove: 100}, c)
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	const perConv = 12
	for range perConv {
		for _, conv := range []uint64{1, 2, 3} {
			f.Enqueue(Job{Msg: r.append(t, conv, "a")})
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for c.count() < 3*perConv || f.Backlog() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("consumer accepted %d messages, want %d (backlog %d)", c.count(), 3*perConv, f.Backlog())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if pending, err := r.st.Pending(ctx, 100); err != nil || len(pending) != 0 {
		t.Fatalf("outbox entries left: %v, %v", pending, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	want := map[uint64]struct {
		recipients []string
		all        bool
	}{1: {[]string{"a", "b", "c"}, true}, 2: {[]string{"a", "b"}, true}, 3: {[]string{"a", "b"}, false}}
	for conv, w := range want {
		var seqs []uint64
		for _, fd := range c.got[conv] {
			seqs = append(seqs, fd.Msg.Seq)
			rec := slices.Sorted(slices.Values(fd.Recipients))
			if !slices.Equal(rec, w.recipients) || fd.AllRecipients != w.all || fd.Conv.ID != conv {
				t.Errorf("conv %d seq %d: recipients %v (all %v), want %v (all %v)", conv, fd.Msg.Seq, rec, fd.AllRecipients, w.recipients, w.all)
			}
			if reached := slices.Sorted(slices.Values(fd.Reached)); !slices.Equal(reached, []string{"a", "b"}) {
				t.Errorf("conv %d seq %d: reached %v, want the online a and b", conv, fd.Msg.Seq, reached)
			}
		}
		wantSeqs := make([]uint64, perConv)
		for i := range wantSeqs {
			wantSeqs[i] = uint64(i + 1)
		}
		if !slices.Equal(seqs, wantSeqs) {
			t.Errorf("conv %d: consumer got seqs %v, want %v once each, in order", conv, seqs, wantSeqs)
		}
	}
	if c.attempts != 3*perConv+len(c.failed) || len(c.failed) != 9 {
		t.Errorf("%d attempts for %d messages and %d injected failures", c.attempts, 3*perConv, len(c.failed))
	}
	if s := f.Stats(); s.Failed == 0 {
		t.Errorf("stats %+v: the failures were not retried by the outbox", s)
	}
}
