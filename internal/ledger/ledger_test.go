package ledger

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

func TestRetriesUntilSuccessAndSurvivesReopen(t *testing.T) {
	fs := vfs.NewMem()
	cfg := Config{Dir: "ledger", FS: fs, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, Poll: time.Millisecond}
	l, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := uint64(1); i <= 3; i++ {
		if err := l.Record(ctx, Task{Kind: KindRows, Conv: 7, Seq: i, Users: []string{"a", "b"}}); err != nil {
			t.Fatal(err)
		}
	}
	if got := l.Backlog(); got != 3 {
		t.Fatalf("backlog = %d, want 3", got)
	}
	// Reopen: tasks are durable.
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if l, err = Open(cfg); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := l.Backlog(); got != 3 {
		t.Fatalf("backlog after reopen = %d, want 3", got)
	}
	var mu sync.Mutex
	calls := map[uint64]int{}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = l.Run(runCtx, func(_ context.Context, t Task) error {
			mu.Lock()
			defer mu.Unlock()
			calls[t.Seq]++
			if calls[t.Seq] < 3 {
				return errors.New("injected")
			}
			return nil
		})
	}()
	deadline := time.Now().Add(5 * time.Second)
	for l.Backlog() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("backlog stuck at %d", l.Backlog())
		}
		time.Sleep(2 * time.Millisecond)
	}
	cancel()
	<-done
	for seq := uint64(1); seq <= 3; seq++ {
		if calls[seq] != 3 {
			t.Fatalf("task %d ran %d times, want 3 (two failures, one success)", seq, calls[seq])
		}
	}
}
