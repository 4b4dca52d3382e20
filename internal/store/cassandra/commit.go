package cassandra

import (
	"context"
	"sync"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
)

// Group commit (docs/decisions.md "Group commit of the owned path's
// writes"): the owned path's plain writes of concurrent appends — slots,
// idempotency records, outbox entries and their deletes, read positions,
// members' rows — go to Cassandra as shared UNLOGGED batches instead of
// one request each. A request costs the node far more than a row of a
// batch (tools/cassfloor), and with many conversations in flight the
// per-request cost is what a message pays most of.
//
// A write waits for no timer: the first one finds the committer idle and
// is sent at once; those that arrive while maxInflight batches are in
// flight queue, and the next free slot takes all of them (up to
// maxGroupStmts statements and maxGroupBytes of arguments) as one batch.
// Every caller of a batch gets the batch's outcome. An UNLOGGED batch is
// applied atomically per partition (and only so): each group keeps a
// caller's statements of one partition together — a batch of slots is
// never split — and callers that need atomicity across partitions do not
// use it. Each statement carries its own USING TIMESTAMP where it needs
// one (a batch's statements may, when the batch sets none).
const (
	maxInflight   = 4
	maxGroupStmts = 64
	// maxGroupBytes keeps a batch well under Cassandra's default
	// batch_size_fail_threshold (50 KiB).
	maxGroupBytes = 24 << 10
)

// stmt is one CQL write of a group.
type stmt struct {
	cql  string
	args []any
}

// size estimates what stmt's values weigh in a batch.
func (s stmt) size() int {
	n := 0
	for _, a := range s.args {
		switch v := a.(type) {
		case string:
			n += len(v) + 4
		case []byte:
			n += len(v) + 4
		case []string:
			for _, e := range v {
				n += len(e) + 4
			}
		default:
			n += 12
		}
	}
	return n
}

type commitReq struct {
	stmts []stmt
	bytes int
	err   error
	done  chan struct{}
}

// committer groups writes (see above); the zero value is not usable: see
// newCommitter.
type committer struct {
	s *Store

	mu       sync.Mutex
	queue    []*commitReq
	inflight int
	// batches and stmts count what was sent (tests and benchmarks).
	batches, stmts uint64
}

func newCommitter(s *Store) *committer { return &committer{s: s} }

// exec writes stmts, in one batch with other callers' writes if they
// queue up, and returns the batch's outcome: on an error none, some or all
// of stmts may be applied (each partition's share atomically). ctx bounds
// the wait; a batch under way goes on without the caller.
func (c *committer) exec(ctx context.Context, stmts []stmt) error {
	if len(stmts) == 0 {
		return nil
	}
	r := &commitReq{stmts: stmts, done: make(chan struct{})}
	for _, st := range stmts {
		r.bytes += st.size()
	}
	c.mu.Lock()
	c.queue = append(c.queue, r)
	start := c.inflight < maxInflight
	if start {
		c.inflight++
	}
	c.mu.Unlock()
	if start {
		go c.run()
	}
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// execSplit writes stmts as independent requests of at most maxGroupStmts
// statements and maxGroupBytes each (a statement over it alone), in
// parallel, and returns the first error. For writes that need no
// atomicity: a request of several partitions over Cassandra's
// batch_size_fail_threshold would be refused whole ("Batch too large"),
// and the committer sends an oversized request as it is.
func (c *committer) execSplit(ctx context.Context, stmts []stmt) error {
	var parts [][]stmt
	start, bytes := 0, 0
	for i, st := range stmts {
		n := st.size()
		if i > start && (i-start >= maxGroupStmts || bytes+n > maxGroupBytes) {
			parts = append(parts, stmts[start:i])
			start, bytes = i, 0
		}
		bytes += n
	}
	if start < len(stmts) {
		parts = append(parts, stmts[start:])
	}
	return c.s.each(ctx, len(parts), func(ctx context.Context, i int) error { return c.exec(ctx, parts[i]) })
}

// run sends batches of the queue until it is empty.
func (c *committer) run() {
	for {
		c.mu.Lock()
		if len(c.queue) == 0 {
			c.inflight--
			c.mu.Unlock()
			return
		}
		n, stmts, bytes := 0, 0, 0
		for n < len(c.queue) {
			r := c.queue[n]
			if n > 0 && (stmts+len(r.stmts) > maxGroupStmts || bytes+r.bytes > maxGroupBytes) {
				break
			}
			n, stmts, bytes = n+1, stmts+len(r.stmts), bytes+r.bytes
		}
		group := c.queue[:n:n]
		c.queue = c.queue[n:]
		c.batches++
		c.stmts += uint64(stmts)
		c.mu.Unlock()

		err := c.write(group)
		for _, r := range group {
			r.err = err
			close(r.done)
		}
	}
}

func (c *committer) write(group []*commitReq) error {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	if len(group) == 1 && len(group[0].stmts) == 1 {
		st := group[0].stmts[0]
		return c.s.q(ctx, st.cql, st.args...).Exec()
	}
	b := c.s.sess.Batch(gocql.UnloggedBatch).WithContext(ctx).Consistency(c.s.cons)
	for _, r := range group {
		for _, st := range r.stmts {
			b.Entries = append(b.Entries, gocql.BatchEntry{Stmt: st.cql, Args: st.args, Idempotent: true})
		}
	}
	return b.Exec()
}
