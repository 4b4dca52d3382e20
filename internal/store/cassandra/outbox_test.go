package cassandra

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/store"
)

// testClock is an outbox clock the test moves.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// openClock opens a Store whose outbox runs on clk.
func openClock(t *testing.T, cfg Config, clk *testClock) *Store {
	t.Helper()
	s := openT(t, cfg)
	s.ob.now = clk.now
	return s
}

func groupConv(t *testing.T, s *Store, id uint64) {
	t.Helper()
	c := store.Conversation{ID: id, Kind: store.Group, Name: "outbox", CreatedAt: time.Now().UnixMilli()}
	if err := s.CreateConversation(context.Background(), c, []store.Member{{UserID: "alice", Role: store.RoleMember}}); err != nil {
		t.Fatalf("CreateConversation(%d): %v", id, err)
	}
}

// writeEntries writes the outbox entries of conv's seqs as an append does.
func writeEntries(t *testing.T, s *Store, conv uint64, seqs ...uint64) {
	t.Helper()
	ctx := context.Background()
	entries, err := s.outboxEntries(ctx, conv, seqs...)
	if err != nil {
		t.Fatalf("outbox entries: %v", err)
	}
	if err := s.commit.execSplit(ctx, entries); err != nil {
		t.Fatalf("write outbox entries: %v", err)
	}
}

func pendingT(t *testing.T, s *Store) []store.Pending {
	t.Helper()
	ps, err := s.Pending(context.Background(), 10000)
	if err != nil {
		t.Fatalf("Pending: %v", err)
	}
	slices.SortFunc(ps, func(a, b store.Pending) int {
		if a.ConvID != b.ConvID {
			return int(a.ConvID) - int(b.ConvID)
		}
		return int(a.Seq) - int(b.Seq)
	})
	return ps
}

func indexOf(t *testing.T, shard int) []int64 {
	t.Helper()
	iter := suite.admin.Query(`SELECT bucket FROM fanout_buckets WHERE shard = ?`, shard).Iter()
	var out []int64
	var b int64
	for iter.Scan(&b) {
		out = append(out, b)
	}
	if err := iter.Close(); err != nil {
		t.Fatalf("read index: %v", err)
	}
	return out
}

// TestOutboxTombstones fans out 110,000 messages of one shard over 11
// minutes (as the outbox workers do: FanoutDone in small batches, a scan
// between) and checks that Pending still answers and finds an entry
// written after them. With every entry in one partition per shard (the
// fanout_pending of before migration 7) the scan reads 110,000 tombstones
// and Cassandra fails it (tombstone_failure_threshold 100,000).
func TestOutboxTombstones(t *testing.T) {
	cfg := fresh(t)
	clk := &testClock{t: time.Now().Add(-30 * time.Minute)}
	s := openClock(t, cfg, clk)
	ctx := context.Background()
	const conv = 16 // shard 0
	groupConv(t, s, conv)
	const rounds, per, chunk = 11, 10_000, 64
	for r := range rounds {
		seqs := make([]uint64, per)
		for i := range seqs {
			seqs[i] = uint64(r*per + i + 1)
		}
		writeEntries(t, s, conv, seqs...)
		n := (per + chunk - 1) / chunk
		err := s.each(ctx, n, func(ctx context.Context, i int) error {
			return s.FanoutDone(ctx, conv, seqs[i*chunk:min((i+1)*chunk, per)])
		})
		if err != nil {
			t.Fatalf("round %d: FanoutDone: %v", r, err)
		}
		if ps := pendingT(t, s); len(ps) != 0 {
			t.Fatalf("round %d: %d entries left after their fan-out, first %v", r, len(ps), ps[0])
		}
		clk.advance(time.Minute)
	}
	writeEntries(t, s, conv, 1_000_000)
	want := []store.Pending{{ConvID: conv, Seq: 1_000_000}}
	if ps := pendingT(t, s); !slices.Equal(ps, want) {
		t.Fatalf("Pending = %v, want %v", ps, want)
	}
	// A process with no memory of the entries reads the same.
	if ps := pendingT(t, openClock(t, cfg, clk)); !slices.Equal(ps, want) {
		t.Fatalf("Pending of another Store = %v, want %v", ps, want)
	}
	// The index lists only the buckets within the grace and the live one.
	if idx := indexOf(t, 0); len(idx) > int(outboxGrace/outboxBucket)+2 {
		t.Errorf("index of shard 0 lists %d buckets: %v", len(idx), idx)
	}
}

// TestOutboxBucketIndex: a bucket older than the grace found empty leaves
// the index; a bucket with an entry, and an empty one within the grace,
// stay; an entry is found and deleted by a process that did not write it,
// whether it listed it (Pending) or not.
func TestOutboxBucketIndex(t *testing.T) {
	cfg := fresh(t)
	clk := &testClock{t: time.Now()}
	w := openClock(t, cfg, clk)
	ctx := context.Background()
	for _, c := range []uint64{1, 17, 33} { // all shard 1
		groupConv(t, w, c)
	}
	t0 := bucketOf(clk.now())
	writeEntries(t, w, 1, 1) // bucket t0, fanned out below
	if err := w.FanoutDone(ctx, 1, []uint64{1}); err != nil {
		t.Fatal(err)
	}
	clk.advance(time.Minute)
	writeEntries(t, w, 17, 1) // bucket t0+1, stays
	clk.advance(outboxGrace + time.Minute)
	writeEntries(t, w, 33, 1) // bucket t0+5, fanned out below
	if err := w.FanoutDone(ctx, 33, []uint64{1}); err != nil {
		t.Fatal(err)
	}
	if idx := indexOf(t, 1); !slices.Equal(idx, []int64{t0, t0 + 1, t0 + 5}) {
		t.Fatalf("index before a scan = %v, want %v", idx, []int64{t0, t0 + 1, t0 + 5})
	}

	r := openClock(t, cfg, clk) // another process
	want := []store.Pending{{ConvID: 17, Seq: 1}}
	if ps := pendingT(t, r); !slices.Equal(ps, want) {
		t.Fatalf("Pending = %v, want %v", ps, want)
	}
	// t0 is past the grace and empty: gone; t0+1 holds an entry; t0+5 is
	// within the grace.
	if idx := indexOf(t, 1); !slices.Equal(idx, []int64{t0 + 1, t0 + 5}) {
		t.Fatalf("index after a scan = %v, want %v", idx, []int64{t0 + 1, t0 + 5})
	}
	if err := r.FanoutDone(ctx, 17, []uint64{1}); err != nil {
		t.Fatal(err)
	}
	if ps := pendingT(t, r); len(ps) != 0 {
		t.Fatalf("Pending after FanoutDone by the scanner = %v", ps)
	}
	if idx := indexOf(t, 1); !slices.Equal(idx, []int64{t0 + 5}) {
		t.Fatalf("index after the entry's fan-out = %v, want %v", idx, []int64{t0 + 5})
	}

	// An entry fanned out by a process that neither wrote nor listed it.
	writeEntries(t, w, 33, 2)
	other := openClock(t, cfg, clk)
	if err := other.FanoutDone(ctx, 33, []uint64{2}); err != nil {
		t.Fatal(err)
	}
	if ps := pendingT(t, r); len(ps) != 0 {
		t.Fatalf("Pending after FanoutDone by a third process = %v", ps)
	}
	clk.advance(outboxGrace + time.Minute)
	if ps := pendingT(t, r); len(ps) != 0 {
		t.Fatalf("Pending = %v", ps)
	}
	if idx := indexOf(t, 1); len(idx) != 0 {
		t.Fatalf("index once every bucket is old and empty = %v", idx)
	}
}

// TestOutboxLegacyDrain: the entries of fanout_pending (the outbox before
// migration 7) are listed and deleted like the others, by the process that
// listed them and by one that did not, and fanout_pending is read again
// outboxRecheck after it was found empty (entries of a process of the
// previous version during a rolling upgrade).
func TestOutboxLegacyDrain(t *testing.T) {
	cfg := fresh(t)
	clk := &testClock{t: time.Now()}
	s := openClock(t, cfg, clk)
	ctx := context.Background()
	groupConv(t, s, 5)
	legacy := func(seq int64) {
		t.Helper()
		if err := suite.admin.Query(`INSERT INTO fanout_pending (shard, conv_id, seq) VALUES (?, ?, ?)`,
			outboxShard(5), int64(5), seq).Exec(); err != nil {
			t.Fatal(err)
		}
	}
	legacy(1)
	legacy(2)
	writeEntries(t, s, 5, 3)
	want := []store.Pending{{ConvID: 5, Seq: 1}, {ConvID: 5, Seq: 2}, {ConvID: 5, Seq: 3}}
	if ps := pendingT(t, s); !slices.Equal(ps, want) {
		t.Fatalf("Pending = %v, want %v", ps, want)
	}
	if err := s.FanoutDone(ctx, 5, []uint64{1}); err != nil {
		t.Fatal(err)
	}
	// Seq 2 is fanned out by a process that never scanned.
	if err := openClock(t, cfg, clk).FanoutDone(ctx, 5, []uint64{2}); err != nil {
		t.Fatal(err)
	}
	want = want[2:]
	if ps := pendingT(t, s); !slices.Equal(ps, want) {
		t.Fatalf("Pending after the old entries' fan-out = %v, want %v", ps, want)
	}
	s.ob.mu.Lock()
	empty := !s.ob.legacyEmpty.IsZero()
	s.ob.mu.Unlock()
	if !empty {
		t.Fatal("fanout_pending not recorded as found empty")
	}
	legacy(4) // an old process's, after the table was found empty
	if ps := pendingT(t, s); !slices.Equal(ps, want) {
		t.Fatalf("Pending before the recheck = %v, want %v", ps, want)
	}
	clk.advance(outboxRecheck)
	want = []store.Pending{{ConvID: 5, Seq: 3}, {ConvID: 5, Seq: 4}}
	if ps := pendingT(t, s); !slices.Equal(ps, want) {
		t.Fatalf("Pending after the recheck = %v, want %v", ps, want)
	}
	if err := s.FanoutDone(ctx, 5, []uint64{3, 4}); err != nil {
		t.Fatal(err)
	}
	if ps := pendingT(t, s); len(ps) != 0 {
		t.Fatalf("Pending at the end = %v", ps)
	}
}
