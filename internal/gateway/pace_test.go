package gateway

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"
)

func TestPacerPerSource(t *testing.T) {
	p := &pacer{rate: 10, burst: 3, maxHeld: 100, sources: map[netip.Addr]*sourceBudget{}}
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")
	now := time.Unix(1000, 0)
	// The burst goes on at once.
	for i := range 3 {
		if wait, ok := p.reserve(a, now); !ok || wait != 0 {
			t.Fatalf("connection %d of the burst: wait %v ok %v, want 0 true", i, wait, ok)
		}
	}
	// Then each waits one more tenth of a second, in order, up to a
	// burst's worth waiting.
	for i := 1; i <= 3; i++ {
		wait, ok := p.reserve(a, now)
		if want := time.Duration(i) * 100 * time.Millisecond; !ok || wait != want {
			t.Fatalf("waiting connection %d: wait %v ok %v, want %v true", i, wait, ok, want)
		}
	}
	if _, ok := p.reserve(a, now); ok {
		t.Fatal("a source with a burst's worth waiting was not refused")
	}
	// Another source has its own budget.
	if wait, ok := p.reserve(b, now); !ok || wait != 0 {
		t.Fatalf("other source: wait %v ok %v", wait, ok)
	}
	// Waiting connections that went on free their places; time refills.
	for range 3 {
		p.released()
	}
	later := now.Add(time.Second) // +10 tokens: back to the burst, less nothing owed
	if wait, ok := p.reserve(a, later); !ok || wait != 0 {
		t.Fatalf("after a second: wait %v ok %v, want 0 true", wait, ok)
	}
	if p.held != 0 {
		t.Fatalf("held = %d after every waiting connection went on", p.held)
	}
	// The node-wide bound on waiting connections.
	q := &pacer{rate: 1, burst: 1, maxHeld: 2, sources: map[netip.Addr]*sourceBudget{}}
	for i := range 3 {
		src := netip.AddrFrom4([4]byte{10, 0, 0, byte(i)})
		q.reserve(src, now) // the burst
		if _, ok := q.reserve(src, now); ok != (i < 2) {
			t.Fatalf("source %d waiting: ok %v with %d held of %d", i, ok, q.held, q.maxHeld)
		}
	}
}

func TestPacerForgetsFullSources(t *testing.T) {
	p := &pacer{rate: 1, burst: 1, maxHeld: 10, sources: map[netip.Addr]*sourceBudget{}}
	now := time.Unix(1000, 0)
	for i := range maxSources {
		p.reserve(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), now)
	}
	// All budgets are spent: a new source is let through untracked.
	fresh := netip.MustParseAddr("192.0.2.9")
	if wait, ok := p.reserve(fresh, now); !ok || wait != 0 || len(p.sources) != maxSources {
		t.Fatalf("new source with the table full: wait %v ok %v, %d sources", wait, ok, len(p.sources))
	}
	// Once they have refilled they are dropped to make room.
	if _, ok := p.reserve(fresh, now.Add(2*time.Second)); !ok || len(p.sources) != 1 {
		t.Fatalf("after the refill: ok %v, %d sources kept, want 1", ok, len(p.sources))
	}
}

// TestPacedListener: the listener hands on a source's burst, holds the next
// connection unread, and resets those past what may wait; Close resets the
// waiting ones.
func TestPacedListener(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.SourceAcceptRate, cfg.SourceAcceptBurst = 0.001, 1 // one now, one waits ~17 min
	ln := PaceSources(raw, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	first := dial()
	got := <-accepted
	if got.RemoteAddr().String() != first.LocalAddr().String() {
		t.Fatalf("accepted %v, want the first connection %v", got.RemoteAddr(), first.LocalAddr())
	}
	_ = got.Close()
	waiting := dial()
	// Past what may wait: reset, maybe before connect even returns.
	refused, err := net.Dial("tcp", raw.Addr().String())
	if err == nil {
		defer refused.Close()
		_ = refused.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = refused.Read(make([]byte, 1))
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("connection past what may wait: error %v, want a reset", err)
	}
	select {
	case c := <-accepted:
		t.Fatalf("connection %v handed on before its turn", c.RemoteAddr())
	default:
	}
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	// The waiting connection is reset with the listener, never handed on.
	_ = waiting.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := waiting.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("waiting connection after Close: read error %v, want a reset", err)
	}
	if c, ok := <-accepted; ok {
		t.Fatalf("accepted %v after Close", c.RemoteAddr())
	}
}
