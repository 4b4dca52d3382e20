package nats

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	natsio "github.com/nats-io/nats.go"

	"github.com/parley-im/parley/internal/bus"
	"github.com/parley-im/parley/internal/bus/bustest"
	"github.com/parley-im/parley/internal/enginetest"
)

var ctx = context.Background()

// testURL is the NATS server at $PARLEY_TEST_NATS (scripts/engines/nats.sh).
// Without it the test skips, except in CI, where a missing engine fails.
func testURL(t testing.TB) string {
	t.Helper()
	url := os.Getenv("PARLEY_TEST_NATS")
	if url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires NATS: PARLEY_TEST_NATS is unset (scripts/engines/nats.sh start)")
		}
		t.Skip("PARLEY_TEST_NATS is unset; run scripts/engines/nats.sh start")
	}
	return url
}

func connect(t testing.TB, url string) *natsio.Conn {
	t.Helper()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	nc, err := Connect(cctx, ConnConfig{URL: url, Name: t.Name(), ReconnectWait: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("NATS at %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// unique returns a name of the test's own, so tests share one server
// without seeing each other's subjects and streams.
func unique() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "t" + hex.EncodeToString(b[:])
}

func newBus(t testing.TB, nc *natsio.Conn, cfg Config) *Bus {
	t.Helper()
	b, err := New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestConformance(t *testing.T) {
	url := testURL(t)
	bustest.Run(t, func(t *testing.T) bus.Bus {
		return newBus(t, connect(t, url), Config{Subject: unique() + ".node"})
	})
}

// Publisher and subscriber on different connections, as gateway and chat
// nodes are: Subscribe must have reached the server when it returns.
func TestAcrossConnections(t *testing.T) {
	url := testURL(t)
	cfg := Config{Subject: unique() + ".node"}
	pub, sub := newBus(t, connect(t, url), cfg), newBus(t, connect(t, url), cfg)
	got := make(chan bus.Delivery, 1)
	cancel, err := sub.Subscribe(ctx, "gw-1", func(d bus.Delivery) error { got <- d; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, "gw-1", bus.Delivery{Users: []string{"u"}, Frame: []byte(`{}`), ConvID: 1, Seq: 2}); err != nil {
		t.Fatalf("first Publish right after Subscribe: %v", err)
	}
	if d := <-got; d.Seq != 2 {
		t.Fatalf("got %+v", d)
	}
	cancel()
	cancel() // idempotent
	if err := pub.Publish(ctx, "gw-1", bus.Delivery{Frame: []byte(`{}`)}); !errors.Is(err, bus.ErrNoSubscriber) {
		t.Fatalf("Publish after cancel = %v, want ErrNoSubscriber", err)
	}
}

func TestCancelWaitsForHandler(t *testing.T) {
	b := newBus(t, connect(t, testURL(t)), Config{Subject: unique() + ".node"})
	entered, release := make(chan struct{}), make(chan struct{})
	var done bool
	cancel, err := b.Subscribe(ctx, "n1", func(bus.Delivery) error {
		close(entered)
		<-release
		done = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	go b.Publish(ctx, "n1", bus.Delivery{Frame: []byte("x")})
	<-entered
	go func() { time.Sleep(50 * time.Millisecond); close(release) }()
	cancel()
	if !done {
		t.Fatal("cancel returned while the handler was still running")
	}
}

func TestPublishErrors(t *testing.T) {
	nc := connect(t, testURL(t))
	cfg := Config{Subject: unique() + ".node", AckTimeout: 200 * time.Millisecond}
	b := newBus(t, nc, cfg)
	t.Run("BadNode", func(t *testing.T) {
		for _, node := range []string{"", "a.b", "*", ">", "a b"} {
			if err := b.Publish(ctx, node, bus.Delivery{}); err == nil {
				t.Fatalf("Publish to %q succeeded", node)
			}
		}
	})
	t.Run("NoAck", func(t *testing.T) {
		// A raw subscriber that never answers stands for a stuck gateway.
		sub, err := nc.Subscribe(cfg.Subject+".stuck", func(*natsio.Msg) {})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		start := time.Now()
		err = b.Publish(ctx, "stuck", bus.Delivery{Frame: []byte("x")})
		if !errors.Is(err, ErrNoAck) {
			t.Fatalf("err = %v, want ErrNoAck", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("Publish took %s with a 200ms AckTimeout", d)
		}
	})
	t.Run("Rejected", func(t *testing.T) {
		sub, err := nc.Subscribe(cfg.Subject+".old", func(m *natsio.Msg) { m.Respond([]byte("bad envelope")) })
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		if err := b.Publish(ctx, "old", bus.Delivery{}); !errors.Is(err, ErrRejected) {
			t.Fatalf("err = %v, want ErrRejected", err)
		}
	})
	t.Run("UndecodableIsRejected", func(t *testing.T) {
		cancel, err := b.Subscribe(ctx, "n1", func(bus.Delivery) error { t.Error("handler got an undecodable delivery"); return nil })
		if err != nil {
			t.Fatal(err)
		}
		defer cancel()
		reply, err := nc.Request(cfg.Subject+".n1", []byte{42}, time.Second)
		if err != nil || !strings.Contains(string(reply.Data), "bad envelope") {
			t.Fatalf("reply %v, %v; want a rejection", reply, err)
		}
	})
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"defaults", (&Config{}).Validate()},
		{"bad subject", (&Config{Subject: "a..b"}).Validate()},
		{"wildcard subject", (&Config{Subject: "a.*"}).Validate()},
		{"no URL", (&ConnConfig{}).Validate()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantOK := tc.name == "defaults"
			if (tc.err == nil) != wantOK {
				t.Fatalf("Validate() = %v, want ok=%v", tc.err, wantOK)
			}
		})
	}
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if f() {
			return
		}
	}
	t.Fatalf("%s: not within 10s", what)
}

// The bus does not need $PARLEY_TEST_NATS here: it restarts a server of its
// own, which the shared one must not be.
func TestBusSurvivesServerRestart(t *testing.T) {
	dir := t.TempDir()
	srv := enginetest.NATS(t, 0, dir)
	url := srv.ClientURL()
	pubConn, subConn := connect(t, url), connect(t, url)
	cfg := Config{Subject: "parley.node", AckTimeout: time.Second}
	pub, sub := newBus(t, pubConn, cfg), newBus(t, subConn, cfg)
	got := make(chan bus.Delivery, 16)
	cancel, err := sub.Subscribe(ctx, "gw", func(d bus.Delivery) error { got <- d; return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	if err := pub.Publish(ctx, "gw", bus.Delivery{Seq: 1}); err != nil {
		t.Fatal(err)
	}
	<-got

	port := srv.Addr().(*net.TCPAddr).Port
	srv.Shutdown()
	srv.WaitForShutdown()
	eventually(t, "client notices the outage", func() bool { return !pubConn.IsConnected() })
	if err := pub.Publish(ctx, "gw", bus.Delivery{Seq: 2}); !errors.Is(err, ErrDisconnected) {
		t.Fatalf("Publish during the outage = %v, want ErrDisconnected at once", err)
	}

	enginetest.NATS(t, port, dir)
	// Both clients reconnect and the subscription is restored without any
	// call from the gateway.
	eventually(t, "Publish succeeds after the restart", func() bool {
		return pub.Publish(ctx, "gw", bus.Delivery{Seq: 3}) == nil
	})
	select {
	case d := <-got:
		if d.Seq != 3 {
			t.Fatalf("got seq %d, want 3 (2 was refused while disconnected)", d.Seq)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("acked delivery never reached the handler")
	}
}

// BenchmarkPublish measures one acked delivery across two connections.
func BenchmarkPublish(b *testing.B) {
	url := os.Getenv("PARLEY_TEST_NATS")
	if url == "" {
		b.Skip("PARLEY_TEST_NATS is unset")
	}
	cfg := Config{Subject: unique() + ".node"}
	pub, sub := newBus(b, connect(b, url), cfg), newBus(b, connect(b, url), cfg)
	cancel, err := sub.Subscribe(ctx, "gw", func(bus.Delivery) error { return nil })
	if err != nil {
		b.Fatal(err)
	}
	defer cancel()
	d := bus.Delivery{Users: []string{"alice", "bob", "carol"}, Frame: make([]byte, 200), ConvID: 1, Seq: 1}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := pub.Publish(ctx, "gw", d); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// lockedBuffer is a log sink safe for NATS's callback goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestCloseIsNotADisconnectWarning: closing the connection (a clean
// shutdown) logs at DEBUG, while losing the server still warns.
func TestCloseIsNotADisconnectWarning(t *testing.T) {
	srv := enginetest.NATS(t, 0, t.TempDir())
	dial := func(out *lockedBuffer) *natsio.Conn {
		log := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug}))
		nc, err := Connect(ctx, ConnConfig{URL: srv.ClientURL(), Logger: log, ReconnectWait: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return nc
	}
	var closed, lost lockedBuffer
	nc := dial(&closed)
	other := dial(&lost)
	defer other.Close()
	nc.Close()
	eventually(t, "the close is logged", func() bool { return strings.Contains(closed.String(), "nats connection closed") })
	if s := closed.String(); strings.Contains(s, "level=WARN") {
		t.Fatalf("a clean close logged a warning:\n%s", s)
	}
	srv.Shutdown()
	eventually(t, "the lost server is logged", func() bool { return strings.Contains(lost.String(), "level=WARN msg=\"nats disconnected\"") })
}
