package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	natsio "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	goredis "github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/internal/enginetest"
	"github.com/parley-im/parley/internal/snowflake"
)

// redisT returns a client of the test Redis ($PARLEY_TEST_REDIS) and a
// fresh namespace, or skips (fails under CI).
func redisT(t *testing.T) (*goredis.Client, string) {
	t.Helper()
	addr := os.Getenv("PARLEY_TEST_REDIS")
	if addr == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires PARLEY_TEST_REDIS")
		}
		t.Skip("PARLEY_TEST_REDIS not set")
	}
	rdb := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	ns := "owner_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx := context.Background()
		keys, _ := rdb.Keys(ctx, ns+":*").Result()
		if len(keys) > 0 {
			rdb.Del(ctx, keys...)
		}
	})
	return rdb, ns
}

// engine is one lease store under the conformance tests, with the test's
// handles on its state.
type engine struct {
	// store opens another Store on the same leases (another process).
	store func() Store
	// set writes partition p's lease as val ("node/epoch") behind the
	// owners' backs.
	set func(p int, val string)
	// get reads partition p's lease ("" when free).
	get func(p int) string
	// lose loses every lease and epoch (a store restarted empty) and
	// returns a Store on what is left.
	lose func() Store
	// dead returns a Store whose engine cannot be reached.
	dead func() Store
}

// engines are the lease stores every conformance test runs on: Redis
// ($PARLEY_TEST_REDIS) and NATS JetStream KV (a real NATS server with
// JetStream in the test process).
var engines = map[string]func(t *testing.T) engine{
	"redis": func(t *testing.T) engine {
		rdb, ns := redisT(t)
		rs := NewRedisStore(rdb, ns)
		return engine{
			store: func() Store { return NewRedisStore(rdb, ns) },
			set: func(p int, val string) {
				if node, _, _ := parseLease(val); node == "" { // released: no key
					rdb.Del(context.Background(), rs.key(p))
					return
				}
				if err := rdb.Set(context.Background(), rs.key(p), val, time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
			},
			get: func(p int) string {
				v, _ := rdb.Get(context.Background(), rs.key(p)).Result()
				return v
			},
			lose: func() Store {
				keys, _ := rdb.Keys(context.Background(), ns+":*").Result()
				if len(keys) > 0 {
					rdb.Del(context.Background(), keys...)
				}
				return rs
			},
			dead: func() Store {
				dead := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 50 * time.Millisecond})
				t.Cleanup(func() { _ = dead.Close() })
				return NewRedisStore(dead, ns)
			},
		}
	},
	"nats": func(t *testing.T) engine {
		srv := enginetest.NATS(t, 0, t.TempDir())
		connect := func() *natsio.Conn {
			nc, err := natsio.Connect(srv.ClientURL())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			return nc
		}
		bucket := "leases"
		open := func(nc *natsio.Conn) *KVStore {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := OpenKVStore(ctx, nc, KVConfig{Bucket: bucket})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		}
		nc := connect()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		first := open(nc)
		kv := first.kv
		return engine{
			store: func() Store { return open(connect()) },
			set: func(p int, val string) {
				if _, err := kv.Put(context.Background(), partKey(p), []byte(val)); err != nil {
					t.Fatal(err)
				}
			},
			get: func(p int) string {
				e, err := kv.Get(context.Background(), partKey(p))
				if err != nil {
					return ""
				}
				if node, _, _ := parseLease(string(e.Value())); node == "" {
					return ""
				}
				return string(e.Value())
			},
			lose: func() Store {
				if err := js.DeleteKeyValue(context.Background(), bucket); err != nil {
					t.Fatal(err)
				}
				s := open(nc)
				kv = s.kv
				return s
			},
			dead: func() Store {
				nc := connect()
				s := open(nc)
				nc.Close()
				return s
			},
		}
	},
}

// forEngines runs f as a subtest on every lease store.
func forEngines(t *testing.T, f func(t *testing.T, e engine)) {
	for name, open := range engines {
		t.Run(name, func(t *testing.T) { f(t, open(t)) })
	}
}

// run starts o until the test ends (or stop is called).
func run(t *testing.T, o *Owner) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { o.Run(ctx) })
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// convIn returns a conversation id of partition p.
func convIn(p, n int) uint64 {
	for c := uint64(1); ; c++ {
		if Partition(c, n) == p {
			return c
		}
	}
}

// TestOwnersShareAndTakeOver: two owners split the partitions, each
// partition held by exactly one, leases renewed (held well past the TTL);
// when one stops, the other takes its partitions at higher epochs, and
// the stopped one's epochs no longer confirm.
func TestOwnersShareAndTakeOver(t *testing.T) { forEngines(t, testOwnersShareAndTakeOver) }

func testOwnersShareAndTakeOver(t *testing.T, e engine) {
	const n = 16
	ttl := 2 * time.Second
	a := NewOwner(e.store(), OwnerConfig{Node: "a", Partitions: n, LeaseTTL: ttl})
	b := NewOwner(e.store(), OwnerConfig{Node: "b", Partitions: n, LeaseTTL: ttl})
	stopA := run(t, a)
	run(t, b)
	split := func() bool {
		ha, hb := a.Held(), b.Held()
		return len(ha) > 0 && len(hb) > 0 && len(ha)+len(hb) == n
	}
	waitFor(t, "the partitions to be split", split)
	// Held over several TTLs: renewals work, nothing flaps.
	epochs := map[int]uint64{}
	for p := range n {
		conv := convIn(p, n)
		ea, oka := a.Epoch(conv)
		eb, okb := b.Epoch(conv)
		if oka == okb {
			t.Fatalf("partition %d: held by a %v, by b %v", p, oka, okb)
		}
		epochs[p] = ea + eb
	}
	// Held over several TTLs: renewals keep the leases. (A round delayed
	// past the TTL on a starved machine may lose one and take it again at
	// a higher epoch: logged, not failed — timing is not asserted.)
	time.Sleep(2 * ttl)
	flaps := 0
	for p := range n {
		conv := convIn(p, n)
		waitFor(t, "partition held", func() bool {
			_, oka := a.Epoch(conv)
			_, okb := b.Epoch(conv)
			return oka != okb
		})
		ea, _ := a.Epoch(conv)
		eb, _ := b.Epoch(conv)
		switch {
		case ea+eb < epochs[p]:
			t.Errorf("partition %d: epoch went down, %d → %d", p, epochs[p], ea+eb)
		case ea+eb > epochs[p]:
			flaps++
		}
		epochs[p] = ea + eb
		o := a
		if eb != 0 {
			o = b
		}
		if err := o.Confirm(context.Background(), conv, epochs[p]); err != nil {
			t.Errorf("partition %d: Confirm: %v", p, err)
		}
	}
	if flaps > 0 {
		t.Logf("%d of %d partitions changed epoch while both owners ran (starved rounds)", flaps, n)
	}
	heldA := a.Held()
	stopA() // releases: b takes over without waiting for the TTL
	waitFor(t, "b to hold every partition", func() bool { return len(b.Held()) == n })
	for _, p := range heldA {
		conv := convIn(p, n)
		eb, ok := b.Epoch(conv)
		if !ok || eb <= epochs[p] {
			t.Errorf("partition %d: b's epoch %d (held %v), a's was %d", p, eb, ok, epochs[p])
		}
		if err := a.Confirm(context.Background(), conv, epochs[p]); !errors.Is(err, ErrLeaseLost) {
			t.Errorf("partition %d: a's old epoch confirms: %v", p, err)
		}
	}
}

// TestOwnerStopsWritingBeforeExpiry: an owner cut off from Redis stops
// claiming its partitions before its lease can have expired, and a new
// lease after the keys are lost (a Redis restart) has a higher epoch.
func TestOwnerStopsWritingBeforeExpiry(t *testing.T) {
	forEngines(t, testOwnerStopsWritingBeforeExpiry)
}

func testOwnerStopsWritingBeforeExpiry(t *testing.T, e engine) {
	ttl := 800 * time.Millisecond
	live, dead := e.store(), e.dead()
	o := NewOwner(live, OwnerConfig{Node: "a", Partitions: 1, LeaseTTL: ttl})
	o.round(context.Background())
	e1, ok := o.Epoch(7)
	if !ok {
		t.Fatal("no lease after a round on an empty namespace")
	}
	taken := time.Now()
	// Redis becomes unreachable: renewals fail. Whatever the rounds do,
	// by the time the lease could have expired in Redis the owner has
	// stopped claiming the partition.
	o.st = dead
	for time.Since(taken) < ttl {
		o.round(context.Background())
		time.Sleep(20 * time.Millisecond)
	}
	if _, ok := o.Epoch(7); ok {
		t.Errorf("still claims the partition %v after taking the lease, TTL %v", time.Since(taken), ttl)
	}
	// The store loses every key (restart): the next lease's epoch is
	// higher.
	o.st = e.lose()
	o.round(context.Background())
	e2, ok := o.Epoch(7)
	if !ok || e2 <= e1 {
		t.Fatalf("epoch after the keys were lost: %d (held %v), before %d", e2, ok, e1)
	}
}

// TestConfirmWithinDeadline: with the leases in the JetStream KV bucket
// (acknowledged grants never lost), a write under a lease still before its
// local deadline confirms without reaching the store, so a lease store
// outage shorter than the deadline does not stop acknowledgements; past
// the deadline, or at an epoch not held, Confirm asks the store, which
// cannot answer. On Redis (a failover can lose a grant) every Confirm is a
// read: unreachable Redis fails it at once.
func TestConfirmWithinDeadline(t *testing.T) { forEngines(t, testConfirmWithinDeadline) }

func testConfirmWithinDeadline(t *testing.T, e engine) {
	ttl := 1200 * time.Millisecond
	st := e.store()
	o := NewOwner(st, OwnerConfig{Node: "a", Partitions: 1, LeaseTTL: ttl})
	sent := time.Now()
	o.round(context.Background())
	e1, ok := o.Epoch(7)
	if !ok {
		t.Fatal("no lease after a round on an empty namespace")
	}
	_, local := st.(durable)
	o.st = e.dead()
	err := o.Confirm(context.Background(), 7, e1)
	switch {
	case !time.Now().Before(sent.Add(ttl - ttl/4)):
		t.Skipf("the round took %v, past the local deadline (starved machine)", time.Since(sent))
	case local && err != nil:
		t.Errorf("Confirm within the deadline with the store unreachable: %v", err)
	case local && o.localConfirms.Load() != 1:
		t.Errorf("Confirm within the deadline: %d local confirmations, want 1", o.localConfirms.Load())
	case !local && err == nil:
		t.Error("Confirm on unreachable Redis succeeded: Redis's Confirm must be a read")
	}
	if err := o.Confirm(context.Background(), 7, e1-1); err == nil {
		t.Error("Confirm of an epoch not held succeeded with the store unreachable")
	}
	o.mu.Lock()
	until := o.held[0].until
	o.mu.Unlock()
	time.Sleep(time.Until(until) + 20*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := o.Confirm(ctx, 7, e1); err == nil {
		t.Error("Confirm past the local deadline succeeded with the store unreachable")
	}
}

// TestNodeNumbersLeased: a configured node number held by another live
// node refuses the lease (the process does not start); the same node
// restarting takes its number back; without a configured number two nodes
// whose names hash to the same number get different ones.
func TestNodeNumbersLeased(t *testing.T) {
	rdb, ns := redisT(t)
	ctx := context.Background()
	a, err := TakeNodeNumber(ctx, rdb, ns, "a", 5, nil)
	if err != nil || a.Number() != 5 {
		t.Fatalf("lease 5 for a: %v, %v", a, err)
	}
	if _, err := TakeNodeNumber(ctx, rdb, ns, "b", 5, nil); !errors.Is(err, ErrNodeNumberTaken) {
		t.Fatalf("lease 5 for b while a holds it: %v, want ErrNodeNumberTaken", err)
	}
	if again, err := TakeNodeNumber(ctx, rdb, ns, "a", 5, nil); err != nil || again.Number() != 5 {
		t.Fatalf("a restarting takes 5 back: %v, %v", again, err)
	}
	// Two names with the same hashed number.
	first := "n0"
	var twin string
	for i := 1; twin == ""; i++ {
		if name := fmt.Sprintf("n%d", i); snowflake.NodeNumber(name) == snowflake.NodeNumber(first) {
			twin = name
		}
	}
	x, err := TakeNodeNumber(ctx, rdb, ns, first, -1, nil)
	if err != nil {
		t.Fatal(err)
	}
	y, err := TakeNodeNumber(ctx, rdb, ns, twin, -1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if x.Number() == y.Number() {
		t.Fatalf("%s and %s (same hash) both got node number %d", first, twin, x.Number())
	}
	// Released at the end of Run: another node may take it.
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { x.Run(runCtx); close(done) }()
	cancel()
	<-done
	if z, err := TakeNodeNumber(ctx, rdb, ns, "z", int(x.Number()), nil); err != nil {
		t.Fatalf("number %d after its holder stopped: %v, %v", x.Number(), z, err)
	}
}

// TestReepoch: a holder re-claims its own lease at a new, higher epoch and
// keeps the partition (its old epoch no longer confirms, the new one
// does); a second call for the old epoch returns the new one; it is
// refused, and the partition given up, when the lease in Redis is held by
// another node or at another epoch.
func TestReepoch(t *testing.T) { forEngines(t, testReepoch) }

func testReepoch(t *testing.T, e engine) {
	ctx := context.Background()
	o := NewOwner(e.store(), OwnerConfig{Node: "a", Partitions: 1, LeaseTTL: time.Minute})
	o.round(ctx)
	e1, ok := o.Epoch(7)
	if !ok {
		t.Fatal("no lease after a round on an empty namespace")
	}
	e2, ok, err := o.Reepoch(ctx, 7, e1)
	if err != nil || !ok || e2 <= e1 {
		t.Fatalf("Reepoch(%d) = %d, %v, %v; want a higher epoch", e1, e2, ok, err)
	}
	if got, held := o.Epoch(7); !held || got != e2 {
		t.Fatalf("Epoch after Reepoch = %d, %v; want %d", got, held, e2)
	}
	if err := o.Confirm(ctx, 7, e2); err != nil {
		t.Fatalf("Confirm(new epoch): %v", err)
	}
	if v := e.get(0); v != fmt.Sprintf("a/%d", e2) {
		t.Errorf("lease in the store after Reepoch = %q, want a/%d", v, e2)
	}
	// Asked again for the old epoch (another conversation of the
	// partition): the new one, no new claim.
	if again, ok, err := o.Reepoch(ctx, 7, e1); err != nil || !ok || again != e2 {
		t.Fatalf("second Reepoch(%d) = %d, %v, %v; want %d", e1, again, ok, err, e2)
	}
	if err := o.Confirm(ctx, 7, e1); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Confirm(old epoch) after Reepoch: %v, want ErrLeaseLost", err)
	}
	if _, held := o.Epoch(7); !held {
		t.Fatal("a failed Confirm of the old epoch gave up the partition held at the new one")
	}
	// Renewals go on under the new epoch.
	o.round(ctx)
	if got, held := o.Epoch(7); !held || got != e2 {
		t.Fatalf("Epoch after a round = %d, %v; want %d", got, held, e2)
	}

	// The epoch moved in Redis behind the holder's back (the same node
	// name re-took it elsewhere): refused, the partition given up.
	e.set(0, fmt.Sprintf("a/%d", e2+5))
	if got, ok, err := o.Reepoch(ctx, 7, e2); err != nil || ok {
		t.Fatalf("Reepoch with the epoch moved in Redis = %d, %v, %v; want refused", got, ok, err)
	}
	if _, held := o.Epoch(7); held {
		t.Error("still claims the partition after a refused Reepoch")
	}
	if v := e.get(0); v != fmt.Sprintf("a/%d", e2+5) {
		t.Errorf("lease in the store after a refused Reepoch = %q", v)
	}

	// Another node holds it: refused, nothing changed in the store.
	e.set(0, fmt.Sprintf("/%d", e2+5)) // released
	b := NewOwner(e.store(), OwnerConfig{Node: "b", Partitions: 1, LeaseTTL: time.Minute})
	b.round(ctx)
	eb, ok := b.Epoch(7)
	if !ok || eb <= e2 {
		t.Fatalf("b's lease = %d, %v; want above %d", eb, ok, e2)
	}
	o.round(ctx) // a cannot take it
	a := NewOwner(e.store(), OwnerConfig{Node: "a", Partitions: 1, LeaseTTL: time.Minute})
	a.mu.Lock()
	a.held[0] = &lease{epoch: eb, until: time.Now().Add(time.Minute)} // a believes it holds b's epoch
	a.mu.Unlock()
	if got, ok, err := a.Reepoch(ctx, 7, eb); err != nil || ok {
		t.Fatalf("Reepoch of a lease b holds = %d, %v, %v; want refused", got, ok, err)
	}
	if v := e.get(0); v != fmt.Sprintf("b/%d", eb) {
		t.Errorf("b's lease after a's refused Reepoch = %q", v)
	}
	if err := b.Confirm(ctx, 7, eb); err != nil {
		t.Errorf("b's lease after a's refused Reepoch: %v", err)
	}
}

// TestAcquireRace: many processes that all see a partition free try to
// take it at once; exactly one gets it, and only its epoch confirms.
func TestAcquireRace(t *testing.T) { forEngines(t, testAcquireRace) }

func testAcquireRace(t *testing.T, e engine) {
	ctx := context.Background()
	const racers = 8
	stores := make([]Store, racers)
	for i := range stores {
		stores[i] = e.store()
	}
	var (
		mu  sync.Mutex
		won []int
		eps = make([]uint64, racers)
		wg  sync.WaitGroup
	)
	for i, s := range stores {
		wg.Go(func() {
			ep, ok, err := s.Acquire(ctx, 3, fmt.Sprintf("n%d", i), time.Minute)
			if err != nil {
				t.Errorf("n%d: %v", i, err)
			}
			if ok {
				mu.Lock()
				won = append(won, i)
				eps[i] = ep
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(won) != 1 {
		t.Fatalf("%d processes took the partition (%v), want 1", len(won), won)
	}
	w := won[0]
	for i, s := range stores {
		ok, cur, err := s.Confirm(ctx, 3, fmt.Sprintf("n%d", i), eps[w])
		if err != nil || ok != (i == w) {
			t.Errorf("n%d confirms the winner's epoch: %v (lease %q), %v", i, ok, cur, err)
		}
	}
	if holders, _ := stores[(w+1)%racers].Holders(ctx, 4, time.Minute); holders[3] != fmt.Sprintf("n%d", w) {
		t.Errorf("holders seen by another process: %q, want n%d at partition 3", holders, w)
	}
}

// TestReleasedLeaseKeepsEpoch: a released partition is free at once, and
// the next lease's epoch is above the released one.
func TestReleasedLeaseKeepsEpoch(t *testing.T) { forEngines(t, testReleasedLeaseKeepsEpoch) }

func testReleasedLeaseKeepsEpoch(t *testing.T, e engine) {
	ctx := context.Background()
	a, b := e.store(), e.store()
	ea, ok, err := a.Acquire(ctx, 0, "a", time.Minute)
	if err != nil || !ok {
		t.Fatalf("a takes 0: %v, %v", ok, err)
	}
	if _, ok, _ := b.Acquire(ctx, 0, "b", time.Minute); ok {
		t.Fatal("b took a partition a holds")
	}
	next, ok, err := a.Reepoch(ctx, 0, "a", ea, time.Minute)
	if err != nil || !ok || next <= ea {
		t.Fatalf("reepoch: %d, %v, %v", next, ok, err)
	}
	if err := a.Release(ctx, "a", map[int]uint64{0: next}); err != nil {
		t.Fatal(err)
	}
	if v := e.get(0); v != "" {
		t.Fatalf("lease after release = %q, want free", v)
	}
	waitFor(t, "b to see the partition free", func() bool {
		h, err := b.Holders(ctx, 1, time.Minute)
		return err == nil && h[0] == ""
	})
	eb, ok, err := b.Acquire(ctx, 0, "b", time.Minute)
	if err != nil || !ok {
		t.Fatalf("b takes the released partition: %v, %v", ok, err)
	}
	if eb <= next {
		t.Errorf("epoch after release %d, released %d", eb, next)
	}
}
