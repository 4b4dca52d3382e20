package bench

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/internal/gateway"
	"github.com/parley-im/parley/internal/servertest"
)

// startNode runs an in-process node whose key is the development key in
// its data directory, as `parley serve` would use, so the benchmark clients
// can mint tokens from the directory.
func startNode(t *testing.T, opts ...servertest.Option) (*servertest.Server, string) {
	t.Helper()
	dir := t.TempDir()
	key, err := auth.LoadOrCreateDevKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	return servertest.Start(t, append(opts, servertest.WithKey(key))...), dir
}

func gauge(t *testing.T, srv *servertest.Server) float64 {
	t.Helper()
	m, err := ScrapeMetrics(context.Background(), http.DefaultClient, srv.HTTPURL+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	v, _ := m.Get("parley_connections")
	return v
}

func TestIdleClientHoldsConnectionsPastIdleTimeout(t *testing.T) {
	srv, dir := startNode(t, servertest.WithGateway(func(c *gateway.Config) {
		c.HeartbeatInterval = 300 * time.Millisecond
		c.IdleTimeout = 900 * time.Millisecond
	}))
	cfg := DefaultIdleClientConfig()
	cfg.Addr = strings.TrimPrefix(srv.URL, "ws://")
	cfg.DataDir, cfg.LocalIP, cfg.Prefix = dir, "127.0.0.10", "t-"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))

	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- RunIdleClient(context.Background(), cfg, inR, outW)
		outW.Close()
	}()
	out := bufio.NewScanner(outR)
	ask := func(cmd string) string {
		t.Helper()
		if _, err := io.WriteString(inW, cmd+"\n"); err != nil {
			t.Fatal(err)
		}
		if !out.Scan() {
			t.Fatalf("%s: no answer (%v)", cmd, out.Err())
		}
		return out.Text()
	}

	if got := ask("add 30"); got != "ok 30 30" {
		t.Fatalf("add 30 = %q, want %q", got, "ok 30 30")
	}
	if got := ask("add 20"); got != "ok 50 50" {
		t.Fatalf("add 20 = %q, want %q", got, "ok 50 50")
	}
	if got := gauge(t, srv); got != 50 {
		t.Fatalf("parley_connections = %v, want 50", got)
	}
	// Three idle timeouts: without pings the node would have closed them.
	time.Sleep(2700 * time.Millisecond)
	if got := ask("add 0"); got != "ok 50 50" {
		t.Fatalf("after idling: %q, want %q", got, "ok 50 50")
	}
	if got := ask("remove 3"); !strings.HasPrefix(got, "err ") {
		t.Errorf("unknown command answered %q, want an err line", got)
	}

	inW.Close()
	if err := <-done; err != nil {
		t.Fatalf("RunIdleClient: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for gauge(t, srv) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("parley_connections = %v after the client exited, want 0", gauge(t, srv))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRunSendAttached(t *testing.T) {
	srv, dir := startNode(t)
	cfg := DefaultSendConfig()
	cfg.Addr = strings.TrimPrefix(srv.URL, "ws://")
	cfg.DataDir = dir
	cfg.Pairs, cfg.Messages, cfg.Inflight, cfg.BodyBytes = 3, 40, 4, 32
	cfg.Timeout = 30 * time.Second
	cfg.Out, cfg.Stderr = io.Discard, io.Discard
	if testing.Verbose() {
		cfg.Out = os.Stdout
	}
	res, err := RunSend(context.Background(), cfg)
	if err != nil {
		t.Fatalf("RunSend: %v", err)
	}
	const n = 3 * 40
	if res.Messages != n || res.Acked != n || res.Delivered != n || res.Errors != 0 {
		t.Errorf("sent/acked/delivered/errors = %d/%d/%d/%d, want %d/%d/%d/0", res.Messages, res.Acked, res.Delivered, res.Errors, n, n, n)
	}
	if res.Stored != n {
		t.Errorf("stored increase = %v, want %d", res.Stored, n)
	}
	if res.Duration <= 0 || res.Ack.P50 <= 0 || res.Deliver.P50 <= 0 || res.Ack.P99 < res.Ack.P50 {
		t.Errorf("implausible timings: duration %v ack %+v deliver %+v", res.Duration, res.Ack, res.Deliver)
	}
	if res.Fsyncs != -1 {
		t.Errorf("Fsyncs = %d without counting, want -1", res.Fsyncs)
	}
	// The node indexes for search: every message, each with its lag.
	if res.Indexed != n || res.IndexLag.Total() != n {
		t.Errorf("indexed %v, lag observations %v, want %d", res.Indexed, res.IndexLag.Total(), n)
	}
	if p50, p99 := res.IndexLag.Quantile(0.5), res.IndexLag.Quantile(0.99); !(p50 > 0 && p99 >= p50) || math.IsInf(p99, 1) {
		t.Errorf("index lag p50 %v p99 %v", p50, p99)
	}
}

func TestHistogramDelta(t *testing.T) {
	before := Metrics{`h_bucket{le="0.1"}`: 1, `h_bucket{le="1"}`: 2, `h_bucket{le="+Inf"}`: 2}
	after := Metrics{`h_bucket{le="0.1"}`: 51, `h_bucket{le="1"}`: 101, `h_bucket{le="+Inf"}`: 102}
	h := histogramDelta(before, after, "h")
	if !slices.Equal(h.Bounds, []float64{0.1, 1, math.Inf(1)}) || !slices.Equal(h.Counts, []float64{50, 99, 100}) {
		t.Fatalf("delta %+v", h)
	}
	for q, want := range map[float64]float64{0.5: 0.1, 0.51: 1, 0.99: 1, 1: math.Inf(1)} {
		if got := h.Quantile(q); got != want {
			t.Errorf("quantile %v = %v, want %v", q, got, want)
		}
	}
	if got := h.Within(1); got != 0.99 {
		t.Errorf("within 1 = %v, want 0.99", got)
	}
	if got := (HistogramDelta{}).Quantile(0.5); !math.IsNaN(got) {
		t.Errorf("empty quantile = %v, want NaN", got)
	}
}

func TestSendConfigValidate(t *testing.T) {
	base := DefaultSendConfig()
	base.ServerBinary = "/bin/parley"
	if err := base.Validate(); err != nil {
		t.Fatalf("defaults with a binary: %v", err)
	}
	for name, mut := range map[string]func(*SendConfig){
		"no binary no addr":    func(c *SendConfig) { c.ServerBinary = "" },
		"addr without dir":     func(c *SendConfig) { c.Addr = "127.0.0.1:1" },
		"fsyncs when attached": func(c *SendConfig) { c.Addr, c.DataDir, c.Fsyncs = "127.0.0.1:1", "/tmp", true },
		"zero inflight":        func(c *SendConfig) { c.Inflight = 0 },
		"zero body":            func(c *SendConfig) { c.BodyBytes = 0 },
	} {
		c := base
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: Validate succeeded, want an error", name)
		}
	}
}

func TestIdleConfigValidate(t *testing.T) {
	base := DefaultIdleConfig()
	base.ServerBinary, base.ClientBinary = "/bin/parley", "/bin/parley-bench"
	base.ClientArgs = func(IdleClientConfig) []string { return nil }
	if err := base.Validate(); err != nil {
		t.Fatalf("defaults with a binary: %v", err)
	}
	for name, mut := range map[string]func(*IdleConfig){
		"too many per process": func(c *IdleConfig) { c.Conns, c.Procs = 30001, 2 },
		"zero step":            func(c *IdleConfig) { c.Step = 0 },
		"no server binary":     func(c *IdleConfig) { c.ServerBinary = "" },
		"no client binary":     func(c *IdleConfig) { c.ClientBinary = "" },
		"no client args":       func(c *IdleConfig) { c.ClientArgs = nil },
	} {
		c := base
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: Validate succeeded, want an error", name)
		}
	}
}
