package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

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
	Logger   *slog.Logger
}

// DefaultFanoutClientConfig returns the defaults of the optional fields.
func DefaultFanoutClientConfig() FanoutClientConfig {
	return FanoutClientConfig{Device: "d1", Concurrency: 32, AckEvery: time.Second, Logger: slog.Default()}
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
	// A push is a few hundred bytes; gorilla grows the buffer for more.
	fc := newFanoutClient(cfg, newDialer(cfg.Addr, key, net.ParseIP(cfg.LocalIP), 1024))
	defer fc.closeAll()

	maintDone := make(chan struct{})
	go func() {
		defer close(maintDone)
		fc.maintain(ctx)
	}()
	defer func() { cancel(); <-maintDone }()

	if err := fc.open(ctx); err != nil {
		fmt.Fprintf(out, "%s %v\n", respErr, err)
		return fmt.Errorf("fanout client: %w", err)
	}
	fmt.Fprintf(out, "%s %d\n", respReady, len(fc.conns()))

	serveCommands(ctx, in, out, reportCommand(func() any { return fc.report() }))
	return nil
}

type fanoutClient struct {
	cfg FanoutClientConfig
	d   *dialer

	heartbeat atomic.Int64 // the node's announced ping interval, ns
	live      atomic.Int64
	readers   sync.WaitGroup

	mu struct {
		sync.Mutex
		conns []*fanConn
	}
	rec struct {
		mu struct {
			sync.Mutex
			counts      map[SeqCount]int64 // key has N zero
			hist        Histogram
			fromSend    Histogram
			dups, gaps  int64
			first, last int64 // unix ns of first receipts
		}
	}
}

func newFanoutClient(cfg FanoutClientConfig, d *dialer) *fanoutClient {
	fc := &fanoutClient{cfg: cfg, d: d}
	fc.rec.mu.counts = make(map[SeqCount]int64)
	fc.rec.mu.hist = Histogram{}
	fc.rec.mu.fromSend = Histogram{}
	return fc
}

// fanConn is one member's connection. Its reader goroutine and the
// maintenance loop both write (acks, pings); wmu serialises them, as
// gorilla allows one writer at a time.
type fanConn struct {
	ws     *websocket.Conn
	user   string
	closed atomic.Bool
	wmu    sync.Mutex
	// lastWrite is the Unix ns of the last frame written, for pings.
	lastWrite atomic.Int64

	// The reader's view of the current conversation: pushes of concurrent
	// senders may arrive out of seq order (docs/protocol.md), so a re-send
	// is a seq seen before, and the cumulative ack is the contiguous prefix.
	conv   uint64
	seen   map[uint64]bool
	contig uint64 // every seq ≤ contig has arrived

	// pending is the highest (conv, seq) received and not yet
	// acknowledged; the maintenance loop sends it.
	pmu                 sync.Mutex
	pendConv, pendSeq   uint64
	ackedConv, ackedSeq uint64
}

func (fc *fanoutClient) conns() []*fanConn {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return fc.mu.conns
}

// open connects every user, Concurrency at a time, and stops at the first
// failure: a member silently missing would read as a lost delivery.
func (fc *fanoutClient) open(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	n := fc.cfg.To - fc.cfg.From
	for range min(fc.cfg.Concurrency, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) || ctx.Err() != nil {
					return
				}
				user := fc.cfg.Prefix + strconv.Itoa(fc.cfg.From+int(i))
				if err := fc.openOne(ctx, user); err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	return firstErr
}

func (fc *fanoutClient) openOne(ctx context.Context, user string) error {
	ws, hello, err := fc.d.dial(ctx, user, fc.cfg.Device)
	if err != nil {
		return err
	}
	fc.heartbeat.Store(int64(time.Duration(hello.HeartbeatMS) * time.Millisecond))
	c := &fanConn{ws: ws, user: user}
	c.lastWrite.Store(time.Now().UnixNano())
	fc.live.Add(1)
	fc.readers.Add(1)
	go fc.read(c)
	fc.mu.Lock()
	fc.mu.conns = append(fc.mu.conns, c)
	fc.mu.Unlock()
	return nil
}

func (fc *fanoutClient) read(c *fanConn) {
	defer fc.readers.Done()
	for {
		_, data, err := c.ws.ReadMessage()
		if err != nil {
			fc.live.Add(-1)
			if !c.closed.Load() {
				fc.cfg.Logger.Warn("connection closed by server", "user", c.user, "err", err)
			}
			return
		}
		now := time.Now()
		var f protocol.Frame
		if err := json.Unmarshal(data, &f); err != nil || f.Type != protocol.TypeMsg || f.Message == nil {
			continue
		}
		fc.onMessage(c, f.Message, now)
	}
}

func (fc *fanoutClient) onMessage(c *fanConn, m *protocol.Message, now time.Time) {
	if m.ConvID != c.conv || c.seen == nil {
		c.conv, c.seen, c.contig = m.ConvID, make(map[uint64]bool), 0
	}
	fresh := !c.seen[m.Seq]
	// A gap: a seq beyond the next one expected (not for the first push).
	gap := fresh && c.contig != 0 && m.Seq > c.contig+1
	if fresh {
		c.seen[m.Seq] = true
		if c.contig == 0 {
			c.contig = m.Seq - 1 // the prefix starts at the first push seen
		}
		advanced := false
		for c.seen[c.contig+1] {
			c.contig++
			advanced = true
		}
		if advanced {
			if fc.cfg.AckEvery == 0 {
				fc.write(c, &protocol.Frame{Type: protocol.TypeDelivered, ConvID: m.ConvID, Seq: c.contig})
			} else {
				c.pmu.Lock()
				c.pendConv, c.pendSeq = m.ConvID, c.contig
				c.pmu.Unlock()
			}
		}
	}
	if m.Kind != protocol.KindText {
		return // membership events are not the benchmark's messages
	}
	fc.rec.mu.Lock()
	defer fc.rec.mu.Unlock()
	r := &fc.rec.mu
	if !fresh {
		r.dups++
		return
	}
	if gap {
		r.gaps++
	}
	r.counts[SeqCount{Conv: m.ConvID, Seq: m.Seq}]++
	r.hist.Record(now.UnixMilli() - m.ServerTime)
	if sent, ok := parseStamp(m.Body); ok {
		r.fromSend.Record(now.Sub(sent).Milliseconds())
	}
	ns := now.UnixNano()
	if r.first == 0 {
		r.first = ns
	}
	r.last = max(r.last, ns)
}

func (fc *fanoutClient) report() FanoutReport {
	r := FanoutReport{Opened: len(fc.conns()), Live: int(fc.live.Load()), Latency: Histogram{}, FromSend: Histogram{}}
	fc.rec.mu.Lock()
	defer fc.rec.mu.Unlock()
	for k, n := range fc.rec.mu.counts {
		k.N = n
		r.Counts = append(r.Counts, k)
	}
	r.Latency.Merge(fc.rec.mu.hist)
	r.FromSend.Merge(fc.rec.mu.fromSend)
	r.Dups, r.Gaps = fc.rec.mu.dups, fc.rec.mu.gaps
	r.FirstNS, r.LastNS = fc.rec.mu.first, fc.rec.mu.last
	return r
}

func (fc *fanoutClient) write(c *fanConn, f *protocol.Frame) {
	b, err := json.Marshal(f)
	if err != nil {
		return
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closed.Load() {
		return
	}
	_ = c.ws.SetWriteDeadline(time.Now().Add(5 * time.Second))
	// A failed write surfaces as a read error on the reader.
	_ = c.ws.WriteMessage(websocket.TextMessage, b)
	c.lastWrite.Store(time.Now().UnixNano())
}

// maintTick is how often the maintenance loop wakes. Each wake serves one
// slot of the connections, so acks and pings reach the node spread evenly
// instead of all connections acknowledging in the same instant.
const maintTick = 100 * time.Millisecond

// maintain sends each connection's pending cumulative ack once per
// AckEvery and a ping when it has written nothing for half a heartbeat.
func (fc *fanoutClient) maintain(ctx context.Context) {
	period := fc.cfg.AckEvery
	if period == 0 {
		period = time.Second // pings only
	}
	slots := max(1, int(period/maintTick))
	t := time.NewTicker(maintTick)
	defer t.Stop()
	for tick := 0; ; tick++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		hb := time.Duration(fc.heartbeat.Load())
		now := time.Now().UnixNano()
		for i, c := range fc.conns() {
			if i%slots != tick%slots {
				continue
			}
			if fc.cfg.AckEvery > 0 && fc.ackPending(c) {
				continue
			}
			if hb > 0 && now-c.lastWrite.Load() >= int64(hb/2) {
				fc.write(c, &protocol.Frame{Type: protocol.TypePing})
			}
		}
	}
}

// ackPending sends the connection's pending ack, if any, and reports
// whether it did.
func (fc *fanoutClient) ackPending(c *fanConn) bool {
	c.pmu.Lock()
	conv, seq := c.pendConv, c.pendSeq
	due := seq != 0 && (conv != c.ackedConv || seq > c.ackedSeq)
	if due {
		c.ackedConv, c.ackedSeq = conv, seq
	}
	c.pmu.Unlock()
	if due {
		fc.write(c, &protocol.Frame{Type: protocol.TypeDelivered, ConvID: conv, Seq: seq})
	}
	return due
}

// closeAll closes every connection and waits for the readers.
func (fc *fanoutClient) closeAll() {
	fc.mu.Lock()
	conns := fc.mu.conns
	fc.mu.conns = nil
	fc.mu.Unlock()
	for _, c := range conns {
		c.wmu.Lock()
		c.closed.Store(true)
		c.ws.Close()
		c.wmu.Unlock()
	}
	fc.readers.Wait()
}
