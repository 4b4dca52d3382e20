package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/protocol"
)

// FanoutClientConfig configures one client process of the fan-out
// benchmark: it holds the connections of users Prefix+From … Prefix+(To-1)
// and records every message pushed to them.
type FanoutClientConfig struct {
	Addr    string // the node, host:port
	DataDir string // the node's data directory, for its development key
	LocalIP string // source address of every connection, e.g. 127.0.0.30
	Prefix  string
	From    int
	To      int
	Device  string
	// Concurrency bounds handshakes in flight.
	Concurrency int
	// AckEvery is how often a connection sends one cumulative delivered
	// covering what it has received; 0 acknowledges each push at once.
	// It must stay well below the node's re-send delay (5 s by default).
	AckEvery time.Duration
	// AckByPush follows each push's ack field as the SDKs do: a large
	// group's (none) is never acknowledged, a medium group's (batch) on
	// the AckEvery cadence, others at once. Without it every push is
	// acknowledged on the AckEvery cadence.
	AckByPush bool
	Logger    *slog.Logger
}

// DefaultFanoutClientConfig returns the defaults of the optional fields.
func DefaultFanoutClientConfig() FanoutClientConfig {
	return FanoutClientConfig{Device: "d1", Concurrency: 32, AckEvery: time.Second, AckByPush: true, Logger: slog.Default()}
}

// Validate reports a configuration the client cannot run with.
func (c FanoutClientConfig) Validate() error {
	var errs []error
	if c.Addr == "" || c.DataDir == "" || c.Prefix == "" {
		errs = append(errs, errors.New("addr, data dir and prefix are required"))
	}
	if c.LocalIP != "" && net.ParseIP(c.LocalIP) == nil {
		errs = append(errs, fmt.Errorf("local ip %q is not an IP address", c.LocalIP))
	}
	if c.From < 0 || c.To <= c.From {
		errs = append(errs, fmt.Errorf("need 0 <= from < to, got %d, %d", c.From, c.To))
	}
	if c.To-c.From > MaxConnsPerClient {
		errs = append(errs, fmt.Errorf("%d connections exceed %d per process", c.To-c.From, MaxConnsPerClient))
	}
	if !protocol.ValidID(c.Device) {
		errs = append(errs, fmt.Errorf("device %q is not a valid id", c.Device))
	}
	if c.Concurrency < 1 {
		errs = append(errs, fmt.Errorf("concurrency must be positive, got %d", c.Concurrency))
	}
	if c.AckEvery < 0 {
		errs = append(errs, fmt.Errorf("ack every must not be negative, got %v", c.AckEvery))
	}
	if c.Logger == nil {
		errs = append(errs, errors.New("logger is required"))
	}
	return errors.Join(errs...)
}

// The fan-out client speaks a line protocol with the benchmark: once its
// connections are open it writes "ready N" (or "err MESSAGE" and exits);
// then each "report" line is answered with "report {json FanoutReport}".
// End of input closes every connection and ends the client.
const (
	respReady  = "ready"
	cmdReport  = "report"
	respReport = "report"
)

// RunFanoutClient opens the configured connections, then records pushes,
// acknowledges them and keeps the connections alive until in ends or ctx
// is done.
func RunFanoutClient(ctx context.Context, cfg FanoutClientConfig, in io.Reader, out io.Writer) error {
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(out, "%s %v\n", respErr, err)
		return fmt.Errorf("fanout client: %w", err)
	}
	key, err := auth.LoadHS256KeyFile(filepath.Join(cfg.DataDir, auth.DevKeyFile))
	if err != nil {
		fmt.Fprintf(out, "%s %v\n", respErr, err)
		return fmt.Errorf("fanout client: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	err = runFanoutConns(ctx, cfg, key,
		func(n int) { fmt.Fprintf(out, "%s %d\n", respReady, n) },
		func(report func() FanoutReport) {
			serveCommands(ctx, in, out, reportCommand(func() any { return report() }))
		})
	if err != nil {
		fmt.Fprintf(out, "%s %v\n", respErr, err)
		return fmt.Errorf("fanout client: %w", err)
	}
	return nil
}

// maintTick is how often the client's maintenance runs. Each run serves
// one slot of the connections, so acks and pings reach the node spread
// evenly instead of all connections acknowledging in the same instant.
const maintTick = 100 * time.Millisecond

// connSeqs is one connection's view of the current conversation: pushes
// of concurrent senders may arrive out of seq order (docs/protocol.md), so
// a re-send is a seq seen before, and the cumulative ack is the contiguous
// prefix.
type connSeqs struct {
	conv   uint64
	seen   map[uint64]bool
	contig uint64 // every seq ≤ contig has arrived
}

// fanoutRec records the first receipts of a client process.
type fanoutRec struct {
	mu          sync.Mutex
	counts      map[SeqCount]int64 // key has N zero
	hist        Histogram
	fromSend    Histogram
	dups, gaps  int64
	first, last int64 // unix ns of first receipts
}

func newFanoutRec() *fanoutRec {
	return &fanoutRec{counts: make(map[SeqCount]int64), hist: Histogram{}, fromSend: Histogram{}}
}

// recBatch records the pushes read in one wake-up of the event loop, all
// at the same time now, under the recorder's lock.
type recBatch struct {
	r     *fanoutRec
	now   time.Time
	nowMS int64
	ns    int64
}

func (r *fanoutRec) begin(now time.Time) recBatch {
	r.mu.Lock()
	return recBatch{r: r, now: now, nowMS: now.UnixMilli(), ns: now.UnixNano()}
}

func (r *fanoutRec) end(*recBatch) { r.mu.Unlock() }

// push records a push received on the connection c and reports whether
// its contiguous prefix advanced (an ack is due).
func (b *recBatch) push(c *connSeqs, p pushInfo) bool {
	if p.Conv != c.conv || c.seen == nil {
		c.conv, c.seen, c.contig = p.Conv, make(map[uint64]bool), 0
	}
	fresh := !c.seen[p.Seq]
	// A gap: a seq beyond the next one expected (not for the first push).
	gap := fresh && c.contig != 0 && p.Seq > c.contig+1
	advanced := false
	if fresh {
		c.seen[p.Seq] = true
		if c.contig == 0 {
			c.contig = p.Seq - 1 // the prefix starts at the first push seen
		}
		for c.seen[c.contig+1] {
			c.contig++
			advanced = true
		}
	}
	if !p.Text {
		return advanced // membership events are not the benchmark's messages
	}
	r := b.r
	if !fresh {
		r.dups++
		return advanced
	}
	if gap {
		r.gaps++
	}
	r.counts[SeqCount{Conv: p.Conv, Seq: p.Seq}]++
	r.hist.Record(b.nowMS - p.ServerTime)
	if sent, ok := parseStampBytes(p.Stamp); ok {
		r.fromSend.Record(b.now.Sub(sent).Milliseconds())
	}
	if r.first == 0 {
		r.first = b.ns
	}
	r.last = max(r.last, b.ns)
	return advanced
}

func (r *fanoutRec) report() FanoutReport {
	rep := FanoutReport{Latency: Histogram{}, FromSend: Histogram{}}
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, n := range r.counts {
		k.N = n
		rep.Counts = append(rep.Counts, k)
	}
	rep.Latency.Merge(r.hist)
	rep.FromSend.Merge(r.fromSend)
	rep.Dups, rep.Gaps = r.dups, r.gaps
	rep.FirstNS, rep.LastNS = r.first, r.last
	return rep
}
