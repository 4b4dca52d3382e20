package jetstream_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	natsio "github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"

	pnats "github.com/parley-im/parley/internal/bus/nats"
	"github.com/parley-im/parley/internal/cluster/lease"
	"github.com/parley-im/parley/internal/hooks"
	"github.com/parley-im/parley/internal/hooks/hookstest"
	"github.com/parley-im/parley/internal/hooks/jetstream"
)

// natsURL is the NATS server at $PARLEY_TEST_NATS; without it the test
// skips, except in CI, where a missing engine fails.
func natsURL(t testing.TB) string {
	t.Helper()
	url := os.Getenv("PARLEY_TEST_NATS")
	if url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires NATS: PARLEY_TEST_NATS is unset (scripts/engines/up.sh)")
		}
		t.Skip("PARLEY_TEST_NATS is unset; run scripts/engines/up.sh")
	}
	return url
}

func connect(t testing.TB, url string) *natsio.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nc, err := pnats.Connect(ctx, pnats.ConnConfig{URL: url, Name: t.Name(), ReconnectWait: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return nc
}

// namespace returns a NATS namespace of the test's own, its streams
// deleted when the test ends.
func namespace(t testing.TB, url string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	ns := "hk" + hex.EncodeToString(b)
	t.Cleanup(func() {
		nc := connect(t, url)
		defer nc.Close()
		js, _ := njs.New(nc)
		for _, s := range []string{strings.ToUpper(ns) + "_HOOKS", strings.ToUpper(ns) + "_HOOKS_DEAD"} {
			_ = js.DeleteStream(context.Background(), s)
		}
	})
	return ns
}

// fakeOwner holds the partitions a test says (the lease logic has its own
// tests in internal/cluster/lease).
type fakeOwner struct {
	n       int
	mu      sync.Mutex
	held    map[int]bool
	watches []func(int, bool)
}

func holding(n int, ps ...int) *fakeOwner {
	o := &fakeOwner{n: n, held: map[int]bool{}}
	for _, p := range ps {
		o.held[p] = true
	}
	return o
}

func holdingAll(n int) *fakeOwner {
	o := holding(n)
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
	o.mu.Lock()
	o.watches = append(o.watches, f)
	o.mu.Unlock()
	for p := range o.n {
		if o.Holds(p) {
			f(p, true)
		}
	}
}

// set takes or releases p and tells the watchers, as lease.Owner does.
func (o *fakeOwner) set(p int, held bool) {
	o.mu.Lock()
	o.held[p] = held
	ws := slices.Clone(o.watches)
	o.mu.Unlock()
	for _, f := range ws {
		f(p, held)
	}
}

var _ jetstream.Owner = (*fakeOwner)(nil)

func openQueue(t testing.TB, nc *natsio.Conn, ns string, o jetstream.Owner, node string) *jetstream.Queue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q, err := jetstream.Open(ctx, jetstream.Config{NATS: nc, Namespace: ns, Owner: o, Node: node})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// Each test gets a namespace of its own; each process connects again and
// holds every partition (taking the consumers over from the last one).
func open(t testing.TB) func() hookstest.Instance {
	url := natsURL(t)
	ns := namespace(t, url)
	n := 0
	return func() hookstest.Instance {
		n++
		nc := connect(t, url)
		return hookstest.Instance{Queue: openQueue(t, nc, ns, holdingAll(4), "n"+string(rune('0'+n))), Close: nc.Close}
	}
}

func TestConformance(t *testing.T) { hookstest.Run(t, open) }

func BenchmarkProduceDeliver(b *testing.B) { hookstest.BenchmarkProduceDeliver(b, open) }

// lanes serves q and lists the conversations its lanes hand out.
func lanes(t *testing.T, q hooks.Queue) func() []uint64 {
	var mu sync.Mutex
	var ls []hooks.Lane
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		q.Serve(ctx, []string{"ep"}, func(ctx context.Context, _ string, l hooks.Lane) {
			mu.Lock()
			ls = append(ls, l)
			mu.Unlock()
			defer func() {
				mu.Lock()
				ls = slices.DeleteFunc(ls, func(x hooks.Lane) bool { return x == l })
				mu.Unlock()
			}()
			for l.Err() == nil {
				select {
				case <-ctx.Done():
					return
				case <-l.Changed():
				}
			}
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return func() []uint64 {
		mu.Lock()
		cur := slices.Clone(ls)
		mu.Unlock()
		var out []uint64
		for _, l := range cur {
			hs, _ := l.Heads(context.Background(), 0, 1<<20, func(uint64) bool { return false })
			for _, h := range hs {
				out = append(out, h.Conv)
			}
		}
		slices.Sort(out)
		return out
	}
}

// TestOwnership: each process hands out only the conversations of the
// partitions it holds; a partition that moves is handed out by its new
// owner, and its old owner's lane ends.
func TestOwnership(t *testing.T) {
	url := natsURL(t)
	ns := namespace(t, url)
	nca, ncb := connect(t, url), connect(t, url)
	defer nca.Close()
	defer ncb.Close()
	oa, ob := holding(4, 0, 1), holding(4, 2, 3)
	qa, qb := openQueue(t, nca, ns, oa, "a"), openQueue(t, ncb, ns, ob, "b")
	var evs []hooks.Event
	for c := uint64(1); c <= 24; c++ {
		evs = append(evs, hooks.Event{Endpoint: "ep", Key: hooks.Key{Conv: c, Seq: 1}, Body: []byte("{}")})
	}
	if err := qa.Put(context.Background(), evs); err != nil {
		t.Fatal(err)
	}
	in := func(ps ...int) []uint64 {
		var out []uint64
		for c := uint64(1); c <= 24; c++ {
			if slices.Contains(ps, lease.Partition(c, 4)) {
				out = append(out, c)
			}
		}
		return out
	}
	la, lb := lanes(t, qa), lanes(t, qb)
	wait := func(what string, a, b []uint64) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			ga, gb := la(), lb()
			if slices.Equal(ga, a) && slices.Equal(gb, b) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: a hands out %v, b %v; want %v and %v", what, ga, gb, a, b)
			}
		}
	}
	wait("split", in(0, 1), in(2, 3))
	oa.set(0, false)
	ob.set(0, true)
	wait("partition 0 moved to b", in(1), in(0, 2, 3))
}

// TestPutDead: a dead letter copied twice under its event's key is
// listed once, as given.
func TestPutDead(t *testing.T) {
	url := natsURL(t)
	ns := namespace(t, url)
	nc := connect(t, url)
	defer nc.Close()
	q := openQueue(t, nc, ns, holdingAll(4), "n1")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d := hooks.DeadLetter{Attempts: 10, Error: "HTTP 500", At: 1700000000000, Event: []byte(`{"id":"x"}`)}
	other := hooks.DeadLetter{Attempts: 3, Error: "timeout", At: 1700000000001, Event: []byte(`{"id":"y"}`)}
	for range 2 {
		if err := q.PutDead(ctx, "ep", hooks.Key{Conv: 5, Seq: 2}, d); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.PutDead(ctx, "ep", hooks.Key{Conv: 5, Seq: 2, Type: 1}, other); err != nil {
		t.Fatal(err)
	}
	got, err := q.Dead(ctx, "ep")
	if err != nil {
		t.Fatal(err)
	}
	if want := []hooks.DeadLetter{d, other}; !reflect.DeepEqual(got, want) {
		t.Errorf("dead letters %+v, want %+v", got, want)
	}
	if err := q.PutDead(ctx, "ep", hooks.Key{Type: 200}, d); err == nil {
		t.Error("a dead letter of an unknown event type was stored")
	}
}
