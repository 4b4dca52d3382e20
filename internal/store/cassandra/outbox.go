package cassandra

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/parley-im/parley/internal/store"
)

// The fan-out outbox (docs/decisions.md "Cassandra outbox in time
// buckets"). An entry (conv, seq) is a row of fanout_outbox in the
// partition (shard, bucket): shard = conv mod outboxShards, bucket = the
// writer's clock in minutes when it wrote the entry. fanout_buckets lists
// each shard's buckets that may hold entries: a writer upserts the row of
// (shard, bucket) before its first entry there (once per process and
// bucket). Pending reads the index and scans only the listed buckets, and
// removes the index row of a bucket it found empty once the bucket is
// older than outboxGrace (no writer with a clock within the grace writes
// there any more). Every fanned-out entry leaves a tombstone in its bucket
// only, so a scan reads the tombstones of the buckets younger than the
// grace (about outboxGrace+1 minutes of the shard's messages), not those
// of every message fanned out within gc_grace_seconds, as a scan of one
// table of all entries (fanout_pending, below) does.
//
// FanoutDone is given (conv, seq) only: the bucket of an entry is known
// to the process that wrote it or listed it in Pending (by far the usual
// case: the owner fans out what it wrote, a scanner what it listed);
// otherwise the delete goes to every bucket of the shard the index lists
// (a tombstone in each).
//
// fanout_pending, the table of before migration 7, is read by Pending
// too until it is found empty (then again every outboxRecheck, for the
// entries of processes of the previous version during a rolling upgrade),
// so the entries an upgrade finds there are fanned out and deleted.

const (
	// outboxShards spread the outbox over partitions.
	outboxShards = 16
	// outboxBucket is the time span of one bucket partition.
	outboxBucket = time.Minute
	// outboxGrace: a bucket older than this (by the scanner's clock)
	// found empty leaves the index. It covers clock skew between chat
	// processes and a write that lands late (requests time out in
	// seconds).
	outboxGrace = 3 * time.Minute
	// outboxRecheck is how often fanout_pending is read again once
	// found empty.
	outboxRecheck = 10 * time.Minute
	// outboxForget: a remembered bucket of an entry older than this is
	// forgotten (it was fanned out by another process); a later
	// FanoutDone of it falls back to every listed bucket.
	outboxForget = 30 * time.Minute
	// legacyBucket marks an entry of fanout_pending.
	legacyBucket = int64(-1)
)

func outboxShard(conv uint64) int { return int(conv % outboxShards) }

// outboxState is the outbox's in-process state; the zero value is ready.
type outboxState struct {
	mu sync.Mutex
	// now is the clock (tests); nil: time.Now.
	now func() time.Time
	// indexed: the (shard, bucket) index rows this process wrote.
	indexed map[[2]int64]bool
	// at: the buckets an entry is known to be in (written or listed).
	at map[store.Pending][]int64
	// live: each shard's buckets as the last index read listed them.
	live [outboxShards][]int64
	// legacyEmpty: when fanout_pending was last found empty (zero: not
	// yet).
	legacyEmpty time.Time
	pruned      time.Time
}

func (o *outboxState) clock() time.Time {
	if o.now != nil {
		return o.now()
	}
	return time.Now()
}

func bucketOf(t time.Time) int64 { return t.UnixMilli() / outboxBucket.Milliseconds() }

// rememberLocked records that the entry p may be in bucket b.
func (o *outboxState) rememberLocked(p store.Pending, b int64) {
	if o.at == nil {
		o.at = make(map[store.Pending][]int64)
	}
	if !slices.Contains(o.at[p], b) {
		o.at[p] = append(o.at[p], b)
	}
}

// outboxEntries returns the writes of the outbox entries of conv's seqs,
// after making sure the index lists their bucket (a failure to write the
// index row is returned: an entry in an unlisted bucket would never be
// scanned).
func (s *Store) outboxEntries(ctx context.Context, conv uint64, seqs ...uint64) ([]stmt, error) {
	o := &s.ob
	shard := outboxShard(conv)
	o.mu.Lock()
	b := bucketOf(o.clock())
	key := [2]int64{int64(shard), b}
	done := o.indexed[key]
	o.mu.Unlock()
	if !done {
		if err := s.q(ctx, `INSERT INTO fanout_buckets (shard, bucket) VALUES (?, ?)`, shard, b).Exec(); err != nil {
			return nil, fmt.Errorf("outbox index: %w", err)
		}
		o.mu.Lock()
		if o.indexed == nil {
			o.indexed = make(map[[2]int64]bool)
		}
		for k := range o.indexed {
			if k[1] < b-1 {
				delete(o.indexed, k)
			}
		}
		o.indexed[key] = true
		o.mu.Unlock()
	}
	out := make([]stmt, len(seqs))
	o.mu.Lock()
	for i, seq := range seqs {
		o.rememberLocked(store.Pending{ConvID: conv, Seq: seq}, b)
		out[i] = stmt{`INSERT INTO fanout_outbox (shard, bucket, conv_id, seq) VALUES (?, ?, ?, ?)`,
			[]any{shard, b, i64(conv), i64(seq)}}
	}
	o.mu.Unlock()
	return out, nil
}

// Pending lists up to limit outbox entries: fanout_pending's (until found
// empty), then shard by shard, bucket by bucket, fanout_outbox's. An entry
// is written after its seq is claimed, so every one is a stored message.
func (s *Store) Pending(ctx context.Context, limit int) ([]store.Pending, error) {
	const op = "pending"
	o := &s.ob
	o.mu.Lock()
	now := o.clock()
	readLegacy := o.legacyEmpty.IsZero() || now.Sub(o.legacyEmpty) >= outboxRecheck
	o.mu.Unlock()

	var out []store.Pending
	found := map[store.Pending][]int64{}
	add := func(p store.Pending, b int64) {
		if _, dup := found[p]; !dup {
			out = append(out, p)
		}
		found[p] = append(found[p], b)
	}
	if readLegacy {
		legacy, err := s.legacyPending(ctx, limit)
		if err != nil {
			// The old table may be past Cassandra's tombstone limit;
			// the new one is served all the same.
			s.log.Warn("cassandra: reading fanout_pending (the outbox before migration 7) failed; retrying at the next scan", logKeyErr, err)
		} else {
			for _, p := range legacy {
				add(p, legacyBucket)
			}
			if len(legacy) == 0 {
				o.mu.Lock()
				o.legacyEmpty = now
				o.mu.Unlock()
			}
		}
	}

	buckets := make([][]int64, outboxShards)
	iter := s.q(ctx, `SELECT shard, bucket FROM fanout_buckets WHERE shard IN ?`, allShards).Iter()
	var shard int
	var b int64
	for iter.Scan(&shard, &b) {
		if shard >= 0 && shard < outboxShards {
			buckets[shard] = append(buckets[shard], b)
		}
	}
	if err := iter.Close(); err != nil {
		return nil, fmt.Errorf("cassandra: %s: index: %w", op, err)
	}
	o.mu.Lock()
	for i := range buckets {
		o.live[i] = buckets[i]
	}
	o.mu.Unlock()

	old := bucketOf(now.Add(-outboxGrace))
	per := make([][]store.Pending, outboxShards)
	perB := make([][]int64, outboxShards)
	want := max(limit-len(out), 0)
	err := s.each(ctx, outboxShards, func(ctx context.Context, shard int) error {
		for _, b := range buckets[shard] { // ascending: a clustering column
			if len(per[shard]) >= want {
				return nil
			}
			iter := s.q(ctx, `SELECT conv_id, seq FROM fanout_outbox WHERE shard = ? AND bucket = ? LIMIT ?`,
				shard, b, want-len(per[shard])).Iter()
			var conv, seq int64
			n := 0
			for iter.Scan(&conv, &seq) {
				per[shard] = append(per[shard], store.Pending{ConvID: u64(conv), Seq: u64(seq)})
				perB[shard] = append(perB[shard], b)
				n++
			}
			if err := iter.Close(); err != nil {
				return err
			}
			if n == 0 && b < old {
				// Empty, and no writer within the grace writes there.
				if err := s.q(ctx, `DELETE FROM fanout_buckets WHERE shard = ? AND bucket = ?`, shard, b).Exec(); err != nil {
					s.log.Warn("cassandra: removing an empty outbox bucket from the index failed", logKeyErr, err)
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cassandra: %s: %w", op, err)
	}
	for shard := range per {
		for i, p := range per[shard] {
			if len(out) >= limit {
				break
			}
			add(p, perB[shard][i])
		}
	}

	o.mu.Lock()
	if now.Sub(o.pruned) >= outboxForget/3 {
		o.pruned = now
		cut := bucketOf(now.Add(-outboxForget))
		for p, bs := range o.at {
			if slices.Max(bs) < cut {
				delete(o.at, p)
			}
		}
	}
	for p, bs := range found {
		for _, b := range bs {
			o.rememberLocked(p, b)
		}
	}
	o.mu.Unlock()
	return out, nil
}

var allShards = func() []int {
	out := make([]int, outboxShards)
	for i := range out {
		out[i] = i
	}
	return out
}()

// legacyPending lists up to limit entries of fanout_pending.
func (s *Store) legacyPending(ctx context.Context, limit int) ([]store.Pending, error) {
	var out []store.Pending
	for shard := 0; shard < outboxShards && len(out) < limit; shard++ {
		iter := s.q(ctx, `SELECT conv_id, seq FROM fanout_pending WHERE shard = ? LIMIT ?`, shard, limit-len(out)).Iter()
		var conv, seq int64
		for iter.Scan(&conv, &seq) {
			out = append(out, store.Pending{ConvID: u64(conv), Seq: u64(seq)})
		}
		if err := iter.Close(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// FanoutDone deletes the outbox entries of seqs.
func (s *Store) FanoutDone(ctx context.Context, convID uint64, seqs []uint64) error {
	const op = "fanout done"
	err := func() error {
		if err := s.check(ctx, convID); err != nil {
			return err
		}
		stmts, err := s.outboxDeletes(ctx, convID, seqs)
		if err != nil {
			return err
		}
		// Group-committed (commit.go): the deletes of every conversation
		// fanned out meanwhile share a batch.
		return s.commit.exec(ctx, stmts)
	}()
	if err != nil {
		return fmt.Errorf("cassandra: %s %d: %w", op, convID, err)
	}
	return nil
}

// outboxDeletes returns the deletes of the entries of conv's seqs: in the
// buckets each is known to be in, else in every bucket of the shard the
// index lists (and in fanout_pending until it was found empty).
func (s *Store) outboxDeletes(ctx context.Context, conv uint64, seqs []uint64) ([]stmt, error) {
	o := &s.ob
	shard := outboxShard(conv)
	var stmts []stmt
	var unknown []uint64
	o.mu.Lock()
	for _, seq := range seqs {
		p := store.Pending{ConvID: conv, Seq: seq}
		bs, ok := o.at[p]
		if !ok {
			unknown = append(unknown, seq)
			continue
		}
		delete(o.at, p)
		for _, b := range bs {
			stmts = append(stmts, deleteStmt(shard, b, conv, seq))
		}
	}
	live := slices.Clone(o.live[shard])
	for k := range o.indexed {
		if k[0] == int64(shard) && !slices.Contains(live, k[1]) {
			live = append(live, k[1])
		}
	}
	legacy := o.legacyEmpty.IsZero()
	o.mu.Unlock()
	if len(unknown) == 0 {
		return stmts, nil
	}
	if len(live) == 0 {
		// Nothing known of the shard: read its index.
		iter := s.q(ctx, `SELECT bucket FROM fanout_buckets WHERE shard = ?`, shard).Iter()
		var b int64
		for iter.Scan(&b) {
			live = append(live, b)
		}
		if err := iter.Close(); err != nil {
			return nil, fmt.Errorf("outbox index: %w", err)
		}
	}
	if legacy {
		live = append(live, legacyBucket)
	}
	for _, seq := range unknown {
		for _, b := range live {
			stmts = append(stmts, deleteStmt(shard, b, conv, seq))
		}
	}
	return stmts, nil
}

func deleteStmt(shard int, b int64, conv, seq uint64) stmt {
	if b == legacyBucket {
		return stmt{`DELETE FROM fanout_pending WHERE shard = ? AND conv_id = ? AND seq = ?`,
			[]any{shard, i64(conv), i64(seq)}}
	}
	return stmt{`DELETE FROM fanout_outbox WHERE shard = ? AND bucket = ? AND conv_id = ? AND seq = ?`,
		[]any{shard, b, i64(conv), i64(seq)}}
}
