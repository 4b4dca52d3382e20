package nats

import (
	"sync/atomic"
	"testing"
	"time"

	natsio "github.com/nats-io/nats.go"
)

// Close waits for the running handler, and no handler starts once Close
// has begun: later messages go to the closed function.
func TestGateCloseDrains(t *testing.T) {
	var g Gate
	var calls, late atomic.Int32
	entered, release := make(chan struct{}), make(chan struct{})
	h := g.Wrap(func(*natsio.Msg) {
		if calls.Add(1) == 1 {
			close(entered)
			<-release
		}
	}, func(*natsio.Msg) { late.Add(1) })
	go h(&natsio.Msg{})
	<-entered
	closed := make(chan struct{})
	go func() { g.Close(); close(closed) }()
	for {
		g.mu.Lock()
		c := g.closed
		g.mu.Unlock()
		if c {
			break
		}
		time.Sleep(time.Millisecond)
	}
	h(&natsio.Msg{}) // arrives after Close began
	if calls.Load() != 1 || late.Load() != 1 {
		t.Fatalf("after Close: %d handler calls, %d late answers; want 1 and 1", calls.Load(), late.Load())
	}
	select {
	case <-closed:
		t.Fatal("Close returned while a handler was running")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-closed
	h(&natsio.Msg{})
	if calls.Load() != 1 || late.Load() != 2 {
		t.Fatalf("after Close returned: %d handler calls, %d late answers; want 1 and 2", calls.Load(), late.Load())
	}
}
