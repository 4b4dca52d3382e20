package server_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/servertest"
)

// TestShutdownExpiredContext: a real node given an already ended context
// returns at once with the context's error (or nil, if the stop won the
// race), the stop completes in the background, and a later Shutdown
// returns its result with the listener closed.
func TestShutdownExpiredContext(t *testing.T) {
	srv := servertest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if err := srv.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown(ended context) = %v, want context.Canceled or nil", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Shutdown(ended context) took %v", d)
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if err := srv.Shutdown(wctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("second Shutdown = %v", err)
	}
	if c, err := net.DialTimeout("tcp", srv.Addr(), time.Second); err == nil {
		c.Close()
		t.Fatal("the listener still accepts after Shutdown")
	}
}
