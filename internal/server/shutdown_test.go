package server

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// stoppable is a Server with only its loops and engines: what Shutdown
// waits for once the listener and the gateway are gone.
func stoppable() *Server {
	s := &Server{log: slog.New(slog.DiscardHandler)}
	s.bgCtx, s.bgCancel = context.WithCancel(context.Background())
	return s
}

// TestShutdownBoundedByContext: a loop that outlives the context does not
// hold Shutdown past it; the stop finishes in the background, closing the
// engines after the loop ends, and a later Shutdown returns its result.
func TestShutdownBoundedByContext(t *testing.T) {
	s := stoppable()
	release := make(chan struct{})
	var loopDone, closed atomic.Bool
	s.runLoop(func(ctx context.Context) {
		<-ctx.Done()
		<-release // a loop slow to end
		loopDone.Store(true)
	})
	engineErr := errors.New("engine close failed")
	s.onClose(func() error {
		if !loopDone.Load() {
			t.Error("an engine closed before the server's loops ended")
		}
		closed.Store(true)
		return engineErr
	})

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := s.Shutdown(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown with a loop still running = %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Shutdown took %v past a 50ms context", d)
	}
	if closed.Load() {
		t.Fatal("engines closed while a loop was still running")
	}

	close(release)
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := s.Shutdown(wctx); !errors.Is(err, engineErr) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Shutdown = %v, want the stop's own error %v", err, engineErr)
	}
	if !closed.Load() {
		t.Fatal("engines not closed after the stop finished")
	}
	if err := s.Shutdown(context.Background()); !errors.Is(err, engineErr) {
		t.Fatalf("third Shutdown = %v, want the same %v", err, engineErr)
	}
}

// TestShutdownIdempotent: concurrent calls run one stop, closing each
// engine once, and all return its result.
func TestShutdownIdempotent(t *testing.T) {
	s := stoppable()
	s.runLoop(func(ctx context.Context) { <-ctx.Done() })
	var closes atomic.Int32
	s.onClose(func() error { closes.Add(1); return nil })
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Shutdown(context.Background()); err != nil {
				t.Errorf("Shutdown = %v, want nil", err)
			}
		}()
	}
	wg.Wait()
	if n := closes.Load(); n != 1 {
		t.Fatalf("engine closed %d times, want 1", n)
	}
}
