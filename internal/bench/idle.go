package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/parley-im/parley/internal/auth"
)

// MaxConnsPerClient is the most connections one idle-client process holds:
// the per-process open-file limit on the benchmark machine is 20,000.
const MaxConnsPerClient = 15000

// IdleConfig configures the idle-connection benchmark.
type IdleConfig struct {
	ServerBinary string // the parley executable, started as the server
	// ClientBinary is started as the idle-client processes: the
	// benchmark's own executable.
	ClientBinary string
	Conns        int // connections in total
	Procs        int // client processes sharing them
	Step         int // connections added between RSS checkpoints
	// Settle is the pause before each sample, so handshake garbage and
	// in-flight frames are not counted as per-connection cost.
	Settle time.Duration
	// ClientArgs returns the arguments after ClientBinary that start one
	// idle-client process (`idle-client` and its flags).
	ClientArgs func(IdleClientConfig) []string
	Out        io.Writer // the report
	Stderr     io.Writer // children's logs
	Logger     *slog.Logger
}

// DefaultIdleConfig returns the defaults used by `parley-bench idle`.
func DefaultIdleConfig() IdleConfig {
	return IdleConfig{
		Conns: 18000, Procs: 3, Step: 3000, Settle: 5 * time.Second,
		Out: os.Stdout, Stderr: os.Stderr, Logger: slog.Default(),
	}
}

// Validate reports a configuration the benchmark cannot run with.
func (c IdleConfig) Validate() error {
	var errs []error
	if c.ServerBinary == "" || c.ClientBinary == "" {
		errs = append(errs, errors.New("server and client binaries are required"))
	}
	if c.Conns < 1 || c.Procs < 1 || c.Step < 1 {
		errs = append(errs, fmt.Errorf("conns, procs and step must be positive, got %d, %d, %d", c.Conns, c.Procs, c.Step))
	}
	if c.Procs > 200 {
		// Source addresses are 127.0.0.10 up to 127.0.0.209.
		errs = append(errs, fmt.Errorf("procs must be at most 200, got %d", c.Procs))
	}
	if c.Procs > 0 && (c.Conns+c.Procs-1)/c.Procs > MaxConnsPerClient {
		errs = append(errs, fmt.Errorf("%d connections over %d processes exceeds %d per process; raise -procs", c.Conns, c.Procs, MaxConnsPerClient))
	}
	if c.Settle < 0 {
		errs = append(errs, fmt.Errorf("settle must not be negative, got %v", c.Settle))
	}
	if c.ClientArgs == nil || c.Out == nil || c.Stderr == nil || c.Logger == nil {
		errs = append(errs, errors.New("client args, out, stderr and logger are required"))
	}
	return errors.Join(errs...)
}

// Checkpoint is one sample of the server during the idle benchmark.
type Checkpoint struct {
	Conns      int     // connections the clients hold
	Gauge      float64 // the server's parley_connections
	RSS        int64   // the server's VmRSS, bytes
	HeapInuse  float64 // go_memstats_heap_inuse_bytes
	Goroutines float64 // go_goroutines
}

// IdleResult is what the idle benchmark measured.
type IdleResult struct {
	Checkpoints []Checkpoint
	// RSSPerConn and HeapPerConn are least-squares slopes over the
	// checkpoints, bytes per connection.
	RSSPerConn  float64
	HeapPerConn float64
}

// RunIdle starts a server on a fresh data directory and Procs idle-client
// processes, grows the connection count by Step up to Conns, and samples
// the server at each checkpoint. It writes the report to Out.
func RunIdle(ctx context.Context, cfg IdleConfig) (res IdleResult, err error) {
	if err := cfg.Validate(); err != nil {
		return IdleResult{}, fmt.Errorf("bench idle: %w", err)
	}
	dir, err := os.MkdirTemp("", "parley-bench-idle-")
	if err != nil {
		return IdleResult{}, fmt.Errorf("bench idle: %w", err)
	}
	defer os.RemoveAll(dir)
	// The clients mint tokens from the same key, so it must exist before
	// either side starts.
	if _, err := auth.LoadOrCreateDevKey(dir); err != nil {
		return IdleResult{}, fmt.Errorf("bench idle: %w", err)
	}
	srv, err := StartServer(ctx, ServerConfig{
		Binary: cfg.ServerBinary, DataDir: dir, Stderr: cfg.Stderr,
		Args: []string{
			"--log.level", "warn",
			"--gateway.max-connections", strconv.Itoa(cfg.Conns + 1000),
			"--gateway.handshake-rate", "100000",
			"--gateway.handshake-burst", "100000",
			"--gateway.drain-timeout", "2s",
		},
	})
	if err != nil {
		return IdleResult{}, fmt.Errorf("bench idle: %w", err)
	}
	defer func() { err = errors.Join(err, srv.Stop()) }()

	fleet := &clientFleet{}
	defer func() { err = errors.Join(err, fleet.stop()) }()
	for k := range cfg.Procs {
		cc := IdleClientConfig{
			Addr: srv.Addr, DataDir: dir, LocalIP: fmt.Sprintf("127.0.0.%d", 10+k),
			Prefix: fmt.Sprintf("idle%d-", k), Concurrency: DefaultIdleClientConfig().Concurrency,
		}
		if err := fleet.start(cfg.ClientBinary, cfg.ClientArgs(cc), cfg.Stderr); err != nil {
			return IdleResult{}, fmt.Errorf("bench idle: %w", err)
		}
	}

	fmt.Fprintf(cfg.Out, "server pid %d on %s; %d connections over %d client processes, checkpoint every %d, settle %v\n",
		srv.PID(), srv.Addr, cfg.Conns, cfg.Procs, cfg.Step, cfg.Settle)
	client := &http.Client{Timeout: 10 * time.Second}
	total := 0
	for {
		if err := sleepCtx(ctx, cfg.Settle); err != nil {
			return res, fmt.Errorf("bench idle: %w", err)
		}
		cp, err := sample(ctx, client, srv, total)
		if err != nil {
			return res, fmt.Errorf("bench idle: %w", err)
		}
		res.Checkpoints = append(res.Checkpoints, cp)
		fmt.Fprintf(cfg.Out, "  %6d conns  gauge %6.0f  rss %8.1f MiB  heap in use %8.1f MiB  goroutines %5.0f\n",
			cp.Conns, cp.Gauge, mib(float64(cp.RSS)), mib(cp.HeapInuse), cp.Goroutines)
		if int(cp.Gauge) != cp.Conns {
			return res, fmt.Errorf("bench idle: server counts %.0f connections, clients hold %d", cp.Gauge, cp.Conns)
		}
		if total >= cfg.Conns {
			break
		}
		n := min(cfg.Step, cfg.Conns-total)
		started := time.Now()
		if err := fleet.add(ctx, n); err != nil {
			return res, fmt.Errorf("bench idle: %w", err)
		}
		total += n
		cfg.Logger.Info("connections added", "n", n, "total", total, "took", time.Since(started).Round(time.Millisecond))
	}
	res.fit()
	res.WriteTable(cfg.Out)
	return res, nil
}

func (r *IdleResult) fit() {
	xs := make([]float64, len(r.Checkpoints))
	rss := make([]float64, len(r.Checkpoints))
	heap := make([]float64, len(r.Checkpoints))
	for i, c := range r.Checkpoints {
		xs[i], rss[i], heap[i] = float64(c.Conns), float64(c.RSS), c.HeapInuse
	}
	if l, err := Fit(xs, rss); err == nil {
		r.RSSPerConn = l.Slope
	}
	if l, err := Fit(xs, heap); err == nil {
		r.HeapPerConn = l.Slope
	}
}

// WriteTable writes the checkpoints and slopes as a Markdown table.
func (r IdleResult) WriteTable(w io.Writer) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| connections | parley_connections | server VmRSS (MiB) | Go heap in use (MiB) | goroutines |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|")
	for _, c := range r.Checkpoints {
		fmt.Fprintf(w, "| %d | %.0f | %.1f | %.1f | %.0f |\n", c.Conns, c.Gauge, mib(float64(c.RSS)), mib(c.HeapInuse), c.Goroutines)
	}
	fmt.Fprintf(w, "\nRSS slope (least squares): %.0f bytes/connection (%.2f KiB)\n", r.RSSPerConn, r.RSSPerConn/1024)
	fmt.Fprintf(w, "Go heap-in-use slope:      %.0f bytes/connection (%.2f KiB)\n", r.HeapPerConn, r.HeapPerConn/1024)
}

func sample(ctx context.Context, client *http.Client, srv *Server, conns int) (Checkpoint, error) {
	m, err := ScrapeMetrics(ctx, client, srv.MetricsURL())
	if err != nil {
		return Checkpoint{}, err
	}
	rss, err := ReadVmRSS(srv.PID())
	if err != nil {
		return Checkpoint{}, err
	}
	cp := Checkpoint{Conns: conns, RSS: rss}
	cp.Gauge, _ = m.Get("parley_connections")
	cp.HeapInuse, _ = m.Get("go_memstats_heap_inuse_bytes")
	cp.Goroutines, _ = m.Get("go_goroutines")
	return cp, nil
}

func mib(b float64) float64 { return b / (1 << 20) }

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// clientFleet is the idle-client processes and their command pipes.
type clientFleet struct {
	procs []*clientProc
	// io tracks goroutines blocked on a client's pipes; they end when the
	// client is stopped, and stop waits for them.
	io sync.WaitGroup
}

type clientProc struct {
	c     *child
	stdin io.WriteCloser
	out   *bufio.Scanner
}

func (f *clientFleet) start(binary string, args []string, stderr io.Writer) error {
	cmd := exec.Command(binary, args...)
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	c, err := startChild(fmt.Sprintf("idle-client %d", len(f.procs)), cmd, syscall.SIGKILL)
	if err != nil {
		return err
	}
	f.procs = append(f.procs, &clientProc{c: c, stdin: stdin, out: bufio.NewScanner(stdout)})
	return nil
}

// add spreads n new connections over the clients and waits for all of them.
func (f *clientFleet) add(ctx context.Context, n int) error {
	errc := make(chan error, len(f.procs))
	for k, p := range f.procs {
		share := n / len(f.procs)
		if k < n%len(f.procs) {
			share++
		}
		f.io.Add(1)
		go func() {
			defer f.io.Done()
			errc <- p.add(share)
		}()
	}
	var errs []error
	for range f.procs {
		select {
		case err := <-errc:
			errs = append(errs, err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return errors.Join(errs...)
}

func (p *clientProc) add(n int) error {
	if _, err := fmt.Fprintf(p.stdin, "%s %d\n", cmdAdd, n); err != nil {
		return fmt.Errorf("%s: %w", p.c.name, err)
	}
	if !p.out.Scan() {
		return fmt.Errorf("%s: exited without answering (%v)", p.c.name, p.out.Err())
	}
	line := p.out.Text()
	if verb, rest, _ := strings.Cut(line, " "); verb != respOK {
		return fmt.Errorf("%s: %s", p.c.name, rest)
	}
	var opened, live int
	if _, err := fmt.Sscanf(line, respOK+" %d %d", &opened, &live); err != nil {
		return fmt.Errorf("%s: bad answer %q", p.c.name, line)
	}
	if live != opened {
		return fmt.Errorf("%s: the server closed %d of %d connections", p.c.name, opened-live, opened)
	}
	return nil
}

// stop ends every client: closing stdin asks it to close its connections
// and exit; one that does not in time is killed.
func (f *clientFleet) stop() error {
	for _, p := range f.procs {
		p.stdin.Close()
	}
	var errs []error
	for _, p := range f.procs {
		select {
		case <-p.c.done:
		case <-time.After(15 * time.Second):
		}
		errs = append(errs, p.c.stop(syscall.SIGKILL, time.Second))
	}
	f.io.Wait()
	return errors.Join(errs...)
}
