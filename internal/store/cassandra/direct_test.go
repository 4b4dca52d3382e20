package cassandra

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

// pauseAt makes s's next call that reaches point stop there until release
// is called; reached is closed when it gets there. Later calls pass.
func pauseAt(s *Store, point string) (reached <-chan struct{}, release func()) {
	at, rel := make(chan struct{}), make(chan struct{})
	var once sync.Once
	f := func(p string) error {
		if p != point {
			return nil
		}
		first := false
		once.Do(func() { first = true })
		if first {
			close(at)
			<-rel
		}
		return nil
	}
	s.faultHook.Store(&f)
	return at, sync.OnceFunc(func() { close(rel) })
}

type directResult struct {
	c   store.Conversation
	err error
}

// TestStaleOwnerDirectFenced: with owned appends the pair's conversation
// is decided by the owner of the pair's partition with plain writes
// fenced by its epoch (direct.go). A stale owner (one that lost its lease
// without noticing) never gets a pair acknowledged, and none of its pair
// writes — landed late, or in flight while a newer owner answers — ever
// changes a pair's answered conversation; within one epoch a write of
// unknown outcome is shadowed by the retry's.
func TestStaleOwnerDirectFenced(t *testing.T) {
	cfg := fresh(t)
	ctx := context.Background()
	var leases leaseTable
	cfgA := cfg
	cfgA.Lease = leases.grant()
	a := openT(t, cfgA)

	pairRow := func(x, y string) uint64 {
		t.Helper()
		lo, hi := pairKey(x, y)
		var id int64
		if err := a.sess.Query(`SELECT conv_id FROM direct_pairs WHERE user_lo = ? AND user_hi = ?`, lo, hi).Scan(&id); err != nil {
			t.Fatalf("pair row of %s, %s: %v", x, y, err)
		}
		return u64(id)
	}
	convsOf := func(s *Store, u string) []uint64 {
		t.Helper()
		rows, err := s.UserConversations(ctx, u)
		if err != nil {
			t.Fatalf("UserConversations(%s): %v", u, err)
		}
		var ids []uint64
		for _, r := range rows {
			ids = append(ids, r.ConvID)
		}
		slices.Sort(ids)
		return ids
	}
	open := func(s *Store, x, y string, id uint64) (store.Conversation, error) {
		return s.Direct(ctx, x, y, id, baseTime)
	}
	mustOpen := func(s *Store, x, y string, id, want uint64) {
		t.Helper()
		c, err := open(s, x, y, id)
		if err != nil || c.ID != want || c.Kind != store.Direct || c.Members != 2 {
			t.Fatalf("Direct(%s, %s) = %+v, %v; want conversation %d", x, y, c, err, want)
		}
	}
	inBackground := func(s *Store, x, y string, id uint64) <-chan directResult {
		ch := make(chan directResult, 1)
		go func() {
			c, err := open(s, x, y, id)
			ch <- directResult{c, err}
		}()
		return ch
	}
	wantNotOwner := func(what string, r directResult) {
		t.Helper()
		if !errors.Is(r.err, store.ErrNotOwner) {
			t.Errorf("%s = %+v, %v; want ErrNotOwner (never acknowledged)", what, r.c, r.err)
		}
	}

	// A (the first owner) opens alice-bob: 100.
	mustOpen(a, "alice", "bob", 100, 100)
	// A decides carol-dave (no pair yet: 200) and stalls before writing.
	reached, releaseA := pauseAt(a, "direct.write")
	lateA := inBackground(a, "carol", "dave", 200)
	<-reached

	// Takeover: B holds a newer epoch. alice-bob stays 100; the stale A
	// is refused even where it only reads.
	cfgB := cfg
	cfgB.Lease = leases.grant()
	b := openT(t, cfgB)
	mustOpen(b, "bob", "alice", 101, 100)
	c, err := open(a, "alice", "bob", 102)
	wantNotOwner("stale owner's reopen of alice-bob", directResult{c, err})
	// B answers carol-dave: 201. Then A's write lands, below B's
	// timestamp: not acknowledged, and the pair stays 201.
	mustOpen(b, "dave", "carol", 201, 201)
	releaseA()
	wantNotOwner("stale owner's carol-dave that landed after the new owner's", <-lateA)
	if got := pairRow("carol", "dave"); got != 201 {
		t.Errorf("carol-dave's pair row names %d after the stale write, want 201", got)
	}
	mustOpen(b, "carol", "dave", 202, 201)
	for _, u := range []string{"carol", "dave"} {
		if got := convsOf(b, u); !slices.Equal(got, []uint64{201}) {
			t.Errorf("%s's conversations %v, want [201] (nothing of the stale owner's 200)", u, got)
		}
	}

	// A stale write that lands before the new owner reads the pair: not
	// acknowledged, and what B adopts (with the users' rows A never wrote).
	r, err := open(a, "erin", "frank", 300)
	wantNotOwner("stale owner's erin-frank", directResult{r, err})
	if got := convsOf(b, "erin"); len(got) != 0 {
		t.Errorf("erin's conversations %v before any acknowledged open, want none", got)
	}
	mustOpen(b, "frank", "erin", 301, 300)
	for _, u := range []string{"erin", "frank"} {
		if got := convsOf(b, u); !slices.Equal(got, []uint64{300}) {
			t.Errorf("%s's conversations %v, want [300]", u, got)
		}
	}

	// Two stale writes in flight at once: A's (oldest epoch) and B's
	// (newer) for gina-hank, both decided on "no pair yet". A's lands;
	// then C (newest) answers it — and must write it again at its own
	// timestamp, or B's write, landing after, would replace the answer.
	reachedA, releaseA2 := pauseAt(a, "direct.write")
	inflightA := inBackground(a, "gina", "hank", 400)
	<-reachedA
	reachedB, releaseB := pauseAt(b, "direct.write")
	inflightB := inBackground(b, "gina", "hank", 401)
	<-reachedB
	releaseA2()
	wantNotOwner("A's gina-hank", <-inflightA)
	cfgC := cfg
	holderC := leases.grant()
	cfgC.Lease = holderC
	cs := openT(t, cfgC)
	mustOpen(cs, "hank", "gina", 402, 400)
	releaseB()
	wantNotOwner("B's gina-hank (in flight across C's answer)", <-inflightB)
	if got := pairRow("gina", "hank"); got != 400 {
		t.Errorf("gina-hank's pair row names %d, want 400 (C's answer)", got)
	}
	mustOpen(cs, "gina", "hank", 403, 400)
	mustOpen(cs, "alice", "bob", 404, 100)
	mustOpen(cs, "carol", "dave", 405, 201)

	// Within C's epoch: a pair write lost on its way (it may still land)
	// moves the pair to the next generation, so the retry's write wins
	// over its late arrival even where the late one's id is higher.
	var failOnce sync.Once
	f := func(p string) error {
		var err error
		if p == "direct.lost" {
			failOnce.Do(func() { err = errors.New("injected: write lost") })
		}
		return err
	}
	cs.faultHook.Store(&f)
	if _, err := open(cs, "ivan", "judy", 600); err == nil {
		t.Fatal("Direct with its write lost succeeded")
	}
	mustOpen(cs, "judy", "ivan", 501, 501)
	lo, hi := pairKey("ivan", "judy")
	epochC, _ := holderC.Epoch(0)
	if err := cs.sess.Query(`INSERT INTO direct_pairs (user_lo, user_hi, conv_id) VALUES (?, ?, ?) USING TIMESTAMP ?`,
		lo, hi, i64(600), writeTS(epochC, 0)).Exec(); err != nil {
		t.Fatalf("the lost write's late arrival: %v", err)
	}
	if got := pairRow("ivan", "judy"); got != 501 {
		t.Errorf("ivan-judy's pair row names %d after the lost write's late arrival, want 501", got)
	}
	mustOpen(cs, "ivan", "judy", 502, 501)

	// Every answered pair, from a fresh view (the state in memory gone).
	fresh := cfg
	fresh.Lease = holderC
	d := openT(t, fresh)
	for _, p := range []struct {
		x, y string
		id   uint64
	}{{"alice", "bob", 100}, {"carol", "dave", 201}, {"erin", "frank", 300}, {"gina", "hank", 400}, {"ivan", "judy", 501}} {
		mustOpen(d, p.y, p.x, 999, p.id)
		for _, u := range []string{p.x, p.y} {
			if got := convsOf(d, u); !slices.Contains(got, p.id) {
				t.Errorf("%s's conversations %v lack %d", u, got, p.id)
			}
		}
	}
}

// lostWrites makes s's pair writes get lost (an unknown outcome, nothing
// written) while on is set.
func lostWrites(s *Store) *atomic.Bool {
	var on atomic.Bool
	f := func(p string) error {
		if p == "direct.lost" && on.Load() {
			return errors.New("injected: write lost")
		}
		return nil
	}
	s.faultHook.Store(&f)
	return &on
}

// TestPairGenerationsExhausted: a pair whose writes keep getting lost
// moves to a new generation each time; past maxGen the lease moves to a
// new epoch (Lease.Reepoch), so the write that finally goes through is
// above every lost one, however late they land.
func TestPairGenerationsExhausted(t *testing.T) {
	cfg := fresh(t)
	ctx := context.Background()
	var leases leaseTable
	holder := leases.grant()
	cfg.Lease = holder
	s := openT(t, cfg)
	first, _ := holder.Epoch(0)
	lost := lostWrites(s)
	lost.Store(true)
	for i := range maxGen + 1 {
		if _, err := s.Direct(ctx, "alice", "bob", uint64(1000+i), baseTime); err == nil {
			t.Fatalf("attempt %d with its write lost succeeded", i)
		}
	}
	lost.Store(false)
	c, err := s.Direct(ctx, "bob", "alice", 10, baseTime)
	if err != nil || c.ID != 10 {
		t.Fatalf("Direct after %d lost writes = %+v, %v; want 10", maxGen+1, c, err)
	}
	if now, _ := holder.Epoch(0); now <= first {
		t.Fatalf("epoch %d after the generations ran out, want above %d", now, first)
	}
	// The last lost write lands now, at the last generation of the first
	// epoch (the highest timestamp any lost write had).
	lo, hi := pairKey("alice", "bob")
	if err := s.sess.Query(`INSERT INTO direct_pairs (user_lo, user_hi, conv_id) VALUES (?, ?, ?) USING TIMESTAMP ?`,
		lo, hi, i64(1000+maxGen), writeTS(first, maxGen)).Exec(); err != nil {
		t.Fatal(err)
	}
	if c, err := s.Direct(ctx, "alice", "bob", 11, baseTime); err != nil || c.ID != 10 {
		t.Fatalf("Direct after the late write = %+v, %v; want 10", c, err)
	}
}

// TestPairFailuresBounded: the pairs remembered with a lost write are
// bounded; past the bound a new pair is refused (nothing written) while
// the remembered ones go on, and an entry goes once its pair's write is
// confirmed or its epoch is superseded.
func TestPairFailuresBounded(t *testing.T) {
	defer func(n int) { maxPairFails = n }(maxPairFails)
	maxPairFails = 2
	cfg := fresh(t)
	ctx := context.Background()
	var leases leaseTable
	holder := leases.grant()
	cfg.Lease = holder
	s := openT(t, cfg)
	lost := lostWrites(s)
	lost.Store(true)
	for i, p := range [][2]string{{"a", "b"}, {"c", "d"}} {
		if _, err := s.Direct(ctx, p[0], p[1], uint64(100+i), baseTime); err == nil {
			t.Fatalf("Direct%v with its write lost succeeded", p)
		}
	}
	lost.Store(false)
	if _, err := s.Direct(ctx, "e", "f", 200, baseTime); err == nil || errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("a new pair past the bound: %v, want a retryable refusal", err)
	}
	if _, err := s.Conversation(ctx, 200); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the refused pair's conversation: %v, want none written", err)
	}
	// A remembered pair goes on, and its confirmed write frees its entry.
	if c, err := s.Direct(ctx, "b", "a", 201, baseTime); err != nil || c.ID != 201 {
		t.Fatalf("Direct(b, a) = %+v, %v; want 201", c, err)
	}
	if c, err := s.Direct(ctx, "e", "f", 202, baseTime); err != nil || c.ID != 202 {
		t.Fatalf("Direct(e, f) after an entry went = %+v, %v; want 202", c, err)
	}
	// Entries of a superseded epoch are dropped when the map is full.
	lost.Store(true)
	if _, err := s.Direct(ctx, "g", "h", 300, baseTime); err == nil {
		t.Fatal("Direct(g, h) with its write lost succeeded")
	}
	lost.Store(false)
	epoch, _ := holder.Epoch(0)
	if _, ok, err := holder.Reepoch(ctx, 0, epoch); !ok || err != nil {
		t.Fatalf("Reepoch: %v, %v", ok, err)
	}
	if c, err := s.Direct(ctx, "i", "j", 301, baseTime); err != nil || c.ID != 301 {
		t.Fatalf("Direct(i, j) after the epoch moved = %+v, %v; want 301", c, err)
	}
}
