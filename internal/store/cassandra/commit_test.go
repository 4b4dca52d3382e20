package cassandra

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/store"
)

// queueAll puts reqs on c's queue, in order, while every flush slot looks busy, then
// lets one flusher drain it: the groups it forms depend only on the
// queue, not on timing.
func queueAll(t *testing.T, c *committer, reqs [][]stmt) []error {
	t.Helper()
	c.mu.Lock()
	c.inflight = maxInflight
	c.mu.Unlock()
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		// One at a time, so the queue holds them in order.
		wg.Go(func() { errs[i] = c.exec(context.Background(), r) })
		for deadline := time.Now().Add(time.Minute); ; {
			c.mu.Lock()
			n := len(c.queue)
			c.mu.Unlock()
			if n == i+1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d requests queued", n, i+1)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	c.mu.Lock()
	c.inflight = 1
	c.mu.Unlock()
	go c.run()
	wg.Wait()
	// The flusher finds the queue empty and stops.
	for deadline := time.Now().Add(time.Minute); ; {
		c.mu.Lock()
		n, q := c.inflight, len(c.queue)
		c.mu.Unlock()
		if n == 0 && q == 0 {
			return errs
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the flush: %d in flight, %d queued", n, q)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestGroupCommit(t *testing.T) {
	s := openT(t, fresh(t))
	c := s.commit
	ins := func(conv, seq int64) stmt {
		return stmt{`INSERT INTO fanout_pending (shard, conv_id, seq) VALUES (?, ?, ?) USING TIMESTAMP ?`,
			[]any{int(conv % outboxShards), conv, seq, 1000 + seq}}
	}
	count := func() (n int) {
		for shard := range outboxShards {
			iter := s.q(context.Background(), `SELECT seq FROM fanout_pending WHERE shard = ?`, shard).Iter()
			var seq int64
			for iter.Scan(&seq) {
				n++
			}
			if err := iter.Close(); err != nil {
				t.Fatal(err)
			}
		}
		return n
	}

	t.Run("groups", func(t *testing.T) {
		// 200 requests of 2 statements (different partitions): groups of
		// 32 requests, 64 statements.
		var reqs [][]stmt
		for i := range int64(200) {
			reqs = append(reqs, []stmt{ins(i, 1), ins(i, 2)})
		}
		b0, s0 := c.batches, c.stmts
		for i, err := range queueAll(t, c, reqs) {
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
		}
		if got, want := c.batches-b0, uint64(7); got != want {
			t.Errorf("%d batches, want %d (200 × 2 statements, %d a batch)", got, want, maxGroupStmts)
		}
		if got := c.stmts - s0; got != 400 {
			t.Errorf("%d statements sent, want 400", got)
		}
		if n := count(); n != 400 {
			t.Errorf("%d rows written, want 400", n)
		}
	})

	t.Run("timestamps", func(t *testing.T) {
		up := func(conv, ts int64) stmt {
			return stmt{`UPDATE conversations USING TIMESTAMP ? SET last_seq = ? WHERE conv_id = ?`, []any{ts, ts, conv}}
		}
		// A lower timestamp queued after a higher one loses, in one batch.
		for i, err := range queueAll(t, c, [][]stmt{{up(1, 50)}, {up(1, 40), up(2, 7)}}) {
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
		}
		for conv, want := range map[int64]int64{1: 50, 2: 7} {
			var got, wt int64
			if err := s.q(context.Background(), `SELECT last_seq, WRITETIME(last_seq) FROM conversations WHERE conv_id = ?`, conv).Scan(&got, &wt); err != nil {
				t.Fatal(err)
			}
			if got != want || wt != want {
				t.Errorf("conv %d: last_seq %d written at %d, want %d at %d", conv, got, wt, want, want)
			}
		}
	})

	t.Run("size", func(t *testing.T) {
		// Requests whose values together exceed maxGroupBytes go in
		// separate batches; one over it alone still goes, alone.
		big := strings.Repeat("x", maxGroupBytes/3)
		body := func(id int64, b string) []stmt {
			return []stmt{{`INSERT INTO messages (conv_id, bucket, message_id, body) VALUES (?, ?, ?, ?)`, []any{int64(9), int32(0), id, b}}}
		}
		b0 := c.batches
		errs := queueAll(t, c, [][]stmt{body(1, big), body(2, big), body(3, big), body(4, big), body(5, strings.Repeat("y", maxGroupBytes+1))})
		for i, err := range errs {
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
		}
		// 3 of a third fit only if the estimate's overhead does not push
		// them over: 2 per batch, then 2, then the oversized one.
		if got := c.batches - b0; got != 3 {
			t.Errorf("%d batches, want 3", got)
		}
	})

	t.Run("errors", func(t *testing.T) {
		// A batch that cannot be written (here: a value the driver cannot
		// encode) fails every request in it, and only those.
		bad := stmt{`INSERT INTO fanout_pending (shard, conv_id, seq) VALUES (?, ?, ?)`, []any{"not an int", int64(1), int64(1)}}
		reqs := [][]stmt{{ins(300, 1)}, {bad}}
		for range 70 {
			reqs = append(reqs, []stmt{ins(301, 1)})
		}
		errs := queueAll(t, c, reqs)
		for i, err := range errs {
			if inFirst := i < maxGroupStmts; inFirst != (err != nil) {
				t.Errorf("request %d: err %v (in the refused batch: %v)", i, err, inFirst)
			}
		}
	})

	t.Run("caller gone", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := c.exec(ctx, []stmt{ins(400, 1)}); err == nil {
			t.Fatalf("exec with a cancelled context: no error")
		}
		// The write goes on without its caller.
		for deadline := time.Now().Add(time.Minute); ; {
			var seq int64
			err := s.q(context.Background(), `SELECT seq FROM fanout_pending WHERE shard = ? AND conv_id = ? AND seq = ?`,
				int(400%outboxShards), int64(400), int64(1)).Scan(&seq)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the abandoned write never landed: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// TestRaiseDelivered: bulk raises are max-registers like SetDelivered,
// whatever order and batch they come in.
func TestRaiseDelivered(t *testing.T) {
	s := openT(t, fresh(t))
	ctx := context.Background()
	if _, err := s.SetDelivered(ctx, "u0", 1, 50); err != nil {
		t.Fatal(err)
	}
	var ps []store.Delivered
	for i := range 100 {
		ps = append(ps, store.Delivered{User: fmt.Sprint("u", i%10), ConvID: 1, Seq: uint64(1 + i)})
	}
	ps = append(ps, store.Delivered{User: "u3", ConvID: 2, Seq: 0}) // nothing to raise
	if err := s.RaiseDelivered(ctx, ps); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		want := uint64(91 + i) // the highest of u<i>'s
		if got, err := s.Delivered(ctx, fmt.Sprint("u", i), 1); err != nil || got != want {
			t.Errorf("u%d: delivered %d, %v; want %d", i, got, err, want)
		}
	}
	if got, _ := s.Delivered(ctx, "u3", 2); got != 0 {
		t.Errorf("a zero seq raised the position to %d", got)
	}
	// Lower raises never lower a position.
	if err := s.RaiseDelivered(ctx, []store.Delivered{{User: "u0", ConvID: 1, Seq: 7}}); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Delivered(ctx, "u0", 1); got != 91 {
		t.Errorf("u0 after a lower raise: %d, want 91", got)
	}
}
