package gateway

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Every task runs, a blocked task holds up no other one, idle workers are
// reused, and a panic is logged without ending the process.
func TestExecutorRunsEveryTaskWithoutWaiting(t *testing.T) {
	var logged atomic.Int32
	e := newExecutor(func(string, ...any) { logged.Add(1) })
	release := make(chan struct{})
	var blocked sync.WaitGroup
	blocked.Add(3)
	for range 3 {
		e.Go(func() { blocked.Done(); <-release })
	}
	blocked.Wait() // three workers are busy
	var ran sync.WaitGroup
	ran.Add(100)
	for range 100 {
		e.Go(ran.Done)
	}
	ran.Wait() // while the first three still block
	close(release)
	e.Go(func() { panic("boom") })
	deadline := time.Now().Add(10 * time.Second)
	for logged.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if logged.Load() != 1 {
		t.Fatalf("panic logged %d times, want 1", logged.Load())
	}
	done := make(chan struct{})
	e.Go(func() { close(done) })
	<-done
}
