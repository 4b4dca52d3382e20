// Package ledgertest is the conformance suite every ledger.Ledger engine
// must pass: the same retry, backoff, dead-letter and restart behaviour
// (the contract in the ledger package comment).
package ledgertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/ledger"
)

// Instance is one process's view of a ledger.
type Instance struct {
	Ledger ledger.Ledger
	// Close stops using the ledger cleanly (Run has returned by then).
	Close func()
	// Crash kills the process now: nothing it does afterwards reaches
	// the durable state, which the next reopen sees as of now. The suite
	// then stops its Run and calls Close. Nil: the crash subtest skips.
	Crash func()
}

// Open prepares durable state of the subtest's own with policy p; each
// call of reopen opens it (again: a restarted process).
type Open func(t *testing.T, p ledger.Policy) (reopen func() Instance)

// Run runs the suite.
func Run(t *testing.T, open Open) {
	fast := ledger.Policy{MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, MaxAttempts: 4, Timeout: 10 * time.Second}

	t.Run("FieldsAndIDs", func(t *testing.T) {
		l, closeL := split(open(t, fast)())
		defer closeL()
		want := []ledger.Task{
			{Kind: ledger.KindRows, Conv: 7, Seq: 3, Users: []string{"a", "b"}, Mention: true},
			{Kind: ledger.KindPush, Conv: 8, Seq: 4, Users: []string{"c"}, Node: "n1"},
		}
		for _, task := range want {
			// What the caller puts in the ledger's own fields is ignored.
			task.ID, task.Attempts, task.NextAt, task.Error = 99, 5, 1, "x"
			if err := l.Record(ctx, task); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.Record(ctx, ledger.Task{Kind: "bogus", Conv: 1}); !errors.Is(err, ledger.ErrKind) {
			t.Fatalf("Record of an unknown kind = %v, want ErrKind", err)
		}
		r := start(t, l, func(_ context.Context, task ledger.Task) error { return nil })
		got := r.waitCalls(t, 2)
		waitBacklog(t, l, 0)
		r.stop()
		slices.SortFunc(got, func(a, b ledger.Task) int { return int(a.Conv) - int(b.Conv) })
		for i, g := range got {
			w := want[i]
			if g.Kind != w.Kind || g.Conv != w.Conv || g.Seq != w.Seq || !slices.Equal(g.Users, w.Users) || g.Mention != w.Mention || g.Node != w.Node {
				t.Errorf("task %d: got %+v, want %+v", i, g, w)
			}
			if g.Attempts != 1 || g.Error != "" || g.ID == 0 || g.ID == 99 {
				t.Errorf("task %d: attempts %d, error %q, id %d; want 1, none and an id of the ledger's", i, g.Attempts, g.Error, g.ID)
			}
		}
		if got[0].ID == got[1].ID {
			t.Errorf("two tasks with id %d", got[0].ID)
		}
	})

	t.Run("RetriesWithBackoff", func(t *testing.T) {
		p := ledger.Policy{MinBackoff: 150 * time.Millisecond, MaxBackoff: 300 * time.Millisecond, MaxAttempts: 5, Timeout: 10 * time.Second}
		l, closeL := split(open(t, p)())
		defer closeL()
		if err := l.Record(ctx, ledger.Task{Kind: ledger.KindRows, Conv: 1, Seq: 1, Users: []string{"a"}}); err != nil {
			t.Fatal(err)
		}
		r := start(t, l, func(_ context.Context, task ledger.Task) error {
			if task.Attempts < 4 {
				return fmt.Errorf("fail %d", task.Attempts)
			}
			return nil
		})
		got := r.waitCalls(t, 4)
		r.mu.Lock()
		at := slices.Clone(r.at)
		r.mu.Unlock()
		for i, g := range got {
			if g.Attempts != i+1 {
				t.Fatalf("call %d had Attempts %d, want %d", i, g.Attempts, i+1)
			}
		}
		// Lower bounds only: a loaded machine can only stretch the gaps.
		for i, want := range []time.Duration{150, 300, 300} {
			want *= time.Millisecond
			if gap := at[i+1].Sub(at[i]); gap < want*9/10 {
				t.Errorf("attempt %d came %s after attempt %d, want ≥ %s (Policy.Backoff(%d))", i+2, gap, i+1, want, i+1)
			}
			if p.Backoff(i+1) != want {
				t.Errorf("Policy.Backoff(%d) = %s, want %s", i+1, p.Backoff(i+1), want)
			}
		}
		waitBacklog(t, l, 0)
		r.noMoreCalls(t, 4)
		r.stop()
		if dead, err := l.Dead(ctx, 10); err != nil || len(dead) != 0 {
			t.Fatalf("dead = %+v, %v; want none", dead, err)
		}
	})

	t.Run("DeadAfterMaxAttempts", func(t *testing.T) {
		reopen := open(t, fast)
		l, closeL := split(reopen())
		task := ledger.Task{Kind: ledger.KindPush, Conv: 5, Seq: 9, Users: []string{"u"}, Node: "n"}
		if err := l.Record(ctx, task); err != nil {
			t.Fatal(err)
		}
		r := start(t, l, func(_ context.Context, task ledger.Task) error {
			return fmt.Errorf("fail %d", task.Attempts)
		})
		r.waitCalls(t, fast.MaxAttempts)
		dead := waitDead(t, l, 1)
		d := dead[0]
		if d.Kind != task.Kind || d.Conv != task.Conv || d.Seq != task.Seq || d.Node != task.Node || !slices.Equal(d.Users, task.Users) {
			t.Fatalf("dead task %+v, want %+v", d, task)
		}
		if d.Attempts != fast.MaxAttempts || d.Error != fmt.Sprintf("fail %d", fast.MaxAttempts) {
			t.Fatalf("dead task: attempts %d, error %q; want %d, %q", d.Attempts, d.Error, fast.MaxAttempts, fmt.Sprintf("fail %d", fast.MaxAttempts))
		}
		waitBacklog(t, l, 0)
		r.noMoreCalls(t, fast.MaxAttempts)
		r.stop()
		closeL()
		// Dead tasks are durable and never run again.
		l, closeL = split(reopen())
		defer closeL()
		if again := waitDead(t, l, 1); again[0].Conv != task.Conv || again[0].Error != d.Error {
			t.Fatalf("after reopen, dead = %+v", again)
		}
		r = start(t, l, func(context.Context, ledger.Task) error { return nil })
		r.noMoreCalls(t, 0)
		r.stop()
	})

	t.Run("SurvivesReopen", func(t *testing.T) {
		reopen := open(t, fast)
		l, closeL := split(reopen())
		for i := range 3 {
			if err := l.Record(ctx, ledger.Task{Kind: ledger.KindRows, Conv: 1, Seq: uint64(i + 1), Users: []string{"a"}}); err != nil {
				t.Fatal(err)
			}
		}
		closeL()
		l, closeL = split(reopen())
		defer closeL()
		r := start(t, l, func(context.Context, ledger.Task) error { return nil })
		got := r.waitCalls(t, 3)
		waitBacklog(t, l, 0)
		r.noMoreCalls(t, 3)
		r.stop()
		var seqs []uint64
		for _, g := range got {
			seqs = append(seqs, g.Seq)
			if g.Attempts != 1 {
				t.Errorf("task %d: attempt %d after a reopen, want 1 (it never ran)", g.Seq, g.Attempts)
			}
		}
		slices.Sort(seqs)
		if !slices.Equal(seqs, []uint64{1, 2, 3}) {
			t.Fatalf("ran %v, want each of 1, 2, 3 once", seqs)
		}
	})

	// At least once: an attempt cut short by a stop counts, and the task
	// runs again after the restart.
	t.Run("InterruptedAttemptRunsAgain", func(t *testing.T) {
		reopen := open(t, fast)
		l, closeL := split(reopen())
		if err := l.Record(ctx, ledger.Task{Kind: ledger.KindRows, Conv: 2, Seq: 1, Users: []string{"a"}}); err != nil {
			t.Fatal(err)
		}
		r := start(t, l, func(hctx context.Context, _ ledger.Task) error {
			<-hctx.Done()
			return hctx.Err()
		})
		r.waitCalls(t, 1)
		r.stop()
		closeL()
		l, closeL = split(reopen())
		defer closeL()
		r = start(t, l, func(context.Context, ledger.Task) error { return nil })
		got := r.waitCalls(t, 1)
		if got[0].Attempts != 2 || got[0].Seq != 1 {
			t.Fatalf("after the restart: %+v, want attempt 2 of seq 1", got[0])
		}
		waitBacklog(t, l, 0)
		r.stop()
	})

	// A stop during the last attempt leaves the task dead, not pending.
	t.Run("InterruptedLastAttemptDies", func(t *testing.T) {
		p := fast
		p.MaxAttempts = 2
		reopen := open(t, p)
		l, closeL := split(reopen())
		if err := l.Record(ctx, ledger.Task{Kind: ledger.KindRows, Conv: 3, Seq: 1, Users: []string{"a"}}); err != nil {
			t.Fatal(err)
		}
		r := start(t, l, func(hctx context.Context, task ledger.Task) error {
			if task.Attempts == 1 {
				return errors.New("first")
			}
			<-hctx.Done()
			return errors.New("cut short")
		})
		r.waitCalls(t, 2)
		r.stop()
		closeL()
		l, closeL = split(reopen())
		defer closeL()
		r = start(t, l, func(context.Context, ledger.Task) error { return nil })
		dead := waitDead(t, l, 1)
		if dead[0].Attempts != 2 || dead[0].Error != "cut short" {
			t.Fatalf("dead %+v, want 2 attempts and the last error", dead[0])
		}
		waitBacklog(t, l, 0)
		r.noMoreCalls(t, 0)
		r.stop()
	})

	t.Run("AttemptTimeout", func(t *testing.T) {
		p := fast
		p.Timeout = 200 * time.Millisecond
		l, closeL := split(open(t, p)())
		defer closeL()
		if err := l.Record(ctx, ledger.Task{Kind: ledger.KindRows, Conv: 4, Seq: 1, Users: []string{"a"}}); err != nil {
			t.Fatal(err)
		}
		deadlines := make(chan time.Duration, 8)
		r := start(t, l, func(hctx context.Context, task ledger.Task) error {
			dl, ok := hctx.Deadline()
			if !ok {
				deadlines <- -1
				return nil
			}
			deadlines <- time.Until(dl)
			if task.Attempts == 1 {
				<-hctx.Done() // overruns: the attempt fails
				return hctx.Err()
			}
			return nil
		})
		got := r.waitCalls(t, 2)
		for range 2 {
			if d := <-deadlines; d < 0 || d > p.Timeout {
				t.Fatalf("handler ctx deadline in %s, want within Timeout %s", d, p.Timeout)
			}
		}
		if got[1].Attempts != 2 {
			t.Fatalf("second call attempt %d, want 2 (the overrun counted)", got[1].Attempts)
		}
		waitBacklog(t, l, 0)
		r.stop()
	})

	// A crash during an attempt counts it; a crash during the last one
	// leaves the task dead at the next start, without another attempt.
	t.Run("CrashedAttemptsCount", func(t *testing.T) {
		p := fast
		p.MaxAttempts, p.Timeout = 2, time.Second
		reopen := open(t, p)
		in := reopen()
		if in.Crash == nil {
			in.Close()
			t.Skip("the engine cannot simulate a crash")
		}
		task := ledger.Task{Kind: ledger.KindRows, Conv: 6, Seq: 1, Users: []string{"a"}}
		if err := in.Ledger.Record(ctx, task); err != nil {
			t.Fatal(err)
		}
		for attempt := 1; attempt <= 2; attempt++ {
			release := make(chan struct{})
			r := start(t, in.Ledger, func(context.Context, ledger.Task) error {
				<-release
				return errors.New("too late")
			})
			got := r.waitCalls(t, 1)
			if got[0].Attempts != attempt {
				t.Fatalf("call %d had Attempts %d", attempt, got[0].Attempts)
			}
			in.Crash()
			close(release)
			r.stop()
			in.Close()
			in = reopen()
		}
		defer in.Close()
		r := start(t, in.Ledger, func(context.Context, ledger.Task) error { return nil })
		dead := waitDead(t, in.Ledger, 1)
		if dead[0].Conv != task.Conv || dead[0].Attempts != 2 || dead[0].Error == "" || dead[0].Error == "too late" {
			t.Fatalf("dead %+v, want conv 6 after 2 attempts, with the interruption as its error", dead[0])
		}
		waitBacklog(t, in.Ledger, 0)
		r.noMoreCalls(t, 0)
		r.stop()
	})

	t.Run("ManyTasks", func(t *testing.T) {
		l, closeL := split(open(t, fast)())
		defer closeL()
		const n = 200
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				if err := l.Record(ctx, ledger.Task{Kind: ledger.Kinds[i%2], Conv: 9, Seq: uint64(i + 1), Users: []string{"a"}, Node: "n"}); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		var mu sync.Mutex
		fails := map[uint64]bool{}
		r := start(t, l, func(_ context.Context, task ledger.Task) error {
			mu.Lock()
			defer mu.Unlock()
			if task.Seq%3 == 0 && !fails[task.Seq] {
				fails[task.Seq] = true
				return errors.New("once")
			}
			return nil
		})
		// Every task succeeds on its first attempt, or its second for a
		// multiple of 3.
		completed := func() int {
			r.mu.Lock()
			defer r.mu.Unlock()
			done := map[uint64]bool{}
			for _, c := range r.calls {
				if c.Seq%3 != 0 || c.Attempts == 2 {
					done[c.Seq] = true
				}
			}
			return len(done)
		}
		deadline := time.Now().Add(60 * time.Second)
		for completed() != n {
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d tasks completed within 60s", completed(), n)
			}
			time.Sleep(20 * time.Millisecond)
		}
		waitBacklog(t, l, 0)
		r.stop()
	})
}

var ctx = context.Background()

func split(i Instance) (ledger.Ledger, func()) { return i.Ledger, i.Close }

// runner runs l.Run in the background and records each handler call.
type runner struct {
	mu    sync.Mutex
	calls []ledger.Task
	at    []time.Time
	more  chan struct{}
	stop  func()
}

func start(t *testing.T, l ledger.Ledger, h ledger.Handler) *runner {
	t.Helper()
	r := &runner{more: make(chan struct{}, 1)}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = l.Run(rctx, func(hctx context.Context, task ledger.Task) error {
			r.mu.Lock()
			r.calls = append(r.calls, task)
			r.at = append(r.at, time.Now())
			r.mu.Unlock()
			select {
			case r.more <- struct{}{}:
			default:
			}
			return h(hctx, task)
		})
	}()
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Error("Run did not return within 30s of its ctx ending")
			}
		})
	}
	t.Cleanup(r.stop)
	return r
}

// waitCalls waits for n handler calls and returns the first n.
func (r *runner) waitCalls(t *testing.T, n int) []ledger.Task {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		r.mu.Lock()
		if len(r.calls) >= n {
			out := slices.Clone(r.calls[:n])
			r.mu.Unlock()
			return out
		}
		got := len(r.calls)
		r.mu.Unlock()
		select {
		case <-r.more:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("%d handler calls within 30s, want %d", got, n)
		}
	}
}

// noMoreCalls checks, for a while, that no call follows the first n.
func (r *runner) noMoreCalls(t *testing.T, n int) {
	t.Helper()
	time.Sleep(500 * time.Millisecond)
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.calls) > n {
		t.Fatalf("%d handler calls, want %d: %+v", len(r.calls), n, r.calls[n:])
	}
}

func waitBacklog(t *testing.T, l ledger.Ledger, want int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for l.Backlog() != want {
		if time.Now().After(deadline) {
			t.Fatalf("backlog %d, want %d", l.Backlog(), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitDead(t *testing.T, l ledger.Ledger, n int) []ledger.Task {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		dead, err := l.Dead(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(dead) >= n {
			if len(dead) > n {
				t.Fatalf("%d dead tasks, want %d: %+v", len(dead), n, dead)
			}
			return dead
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d dead tasks within 30s, want %d", len(dead), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
