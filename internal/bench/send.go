package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/protocol"
)

// SendConfig configures the durable send benchmark.
type SendConfig struct {
	// ServerBinary, the parley executable, is started as the server on a
	// fresh data directory when Addr is empty.
	ServerBinary string
	// Addr and DataDir attach to a running node instead; DataDir holds the
	// development key the benchmark mints tokens with.
	Addr    string
	DataDir string

	Pairs     int // sender/receiver pairs, each in its own direct conversation
	Messages  int // messages per sender
	Inflight  int // unacknowledged sends per sender
	BodyBytes int
	// Fsyncs counts the server's fsync and fdatasync calls with perf(1)
	// during the run. Only for a server the benchmark started.
	Fsyncs bool
	// Timeout bounds the whole run.
	Timeout time.Duration

	Out    io.Writer // the report
	Stderr io.Writer // the server's log
	Logger *slog.Logger
}

// DefaultSendConfig returns the defaults used by `parley-bench send`.
func DefaultSendConfig() SendConfig {
	return SendConfig{
		Pairs: 16, Messages: 500, Inflight: 1, BodyBytes: 100, Timeout: 5 * time.Minute,
		Out: os.Stdout, Stderr: os.Stderr, Logger: slog.Default(),
	}
}

// Validate reports a configuration the benchmark cannot run with.
func (c SendConfig) Validate() error {
	var errs []error
	if c.Addr == "" && c.ServerBinary == "" {
		errs = append(errs, errors.New("server binary is required unless attaching with addr"))
	}
	if (c.Addr == "") != (c.DataDir == "") {
		errs = append(errs, errors.New("addr and data dir go together (the data dir holds the key to mint tokens)"))
	}
	if c.Pairs < 1 || c.Messages < 1 || c.Inflight < 1 {
		errs = append(errs, fmt.Errorf("pairs, messages and inflight must be positive, got %d, %d, %d", c.Pairs, c.Messages, c.Inflight))
	}
	if c.BodyBytes < 1 {
		errs = append(errs, fmt.Errorf("body bytes must be positive, got %d", c.BodyBytes))
	}
	if c.Fsyncs && c.Addr != "" {
		errs = append(errs, errors.New("fsyncs needs a server the benchmark starts (no addr)"))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("timeout must be positive, got %v", c.Timeout))
	}
	if c.Out == nil || c.Stderr == nil || c.Logger == nil {
		errs = append(errs, errors.New("out, stderr and logger are required"))
	}
	return errors.Join(errs...)
}

// SendResult is what the send benchmark measured.
type SendResult struct {
	Messages  int // sends attempted
	Acked     int
	Delivered int // first msg pushes seen by receivers
	Errors    int // error frames answering sends
	// Duration runs from the first send to the last ACK.
	Duration time.Duration
	Ack      Latencies // send frame written → ack read
	Deliver  Latencies // send frame written → receiver read the msg push
	// Stored and Retransmits are the server counters' increase over the
	// run (parley_messages_stored_total, parley_retransmits_total).
	Stored      float64
	Retransmits float64
	// Fsyncs is the server's fsync+fdatasync calls over the run, or -1
	// when not counted.
	Fsyncs int64
	// Indexed is parley_search_indexed_total's increase once the search
	// index caught up with Stored (or IndexWait ran out: 60 s), -1 when
	// the node indexes nothing; IndexWait is how long after the last ACK
	// that took. IndexLag is parley_search_index_lag_seconds' increase
	// over the run, read at its buckets' upper bounds (so p99 "≤ 1 s").
	Indexed   float64
	IndexWait time.Duration
	IndexLag  HistogramDelta
}

// HistogramDelta is the increase of a Prometheus histogram's buckets over
// a run: upper bounds ascending (the last +Inf) and cumulative counts.
type HistogramDelta struct {
	Bounds []float64
	Counts []float64
}

// histogramDelta reads histogram's buckets from before and after.
func histogramDelta(before, after Metrics, histogram string) HistogramDelta {
	prefix := histogram + `_bucket{le="`
	var h HistogramDelta
	var les []string
	for k := range after {
		if le, ok := strings.CutPrefix(k, prefix); ok {
			les = append(les, strings.TrimSuffix(le, `"}`))
		}
	}
	bound := func(le string) float64 {
		v, err := strconv.ParseFloat(le, 64)
		if err != nil {
			return math.Inf(1)
		}
		return v
	}
	slices.SortFunc(les, func(a, b string) int { return cmp.Compare(bound(a), bound(b)) })
	for _, le := range les {
		a, _ := after.Bucket(histogram, le)
		b, _ := before.Bucket(histogram, le)
		h.Bounds = append(h.Bounds, bound(le))
		h.Counts = append(h.Counts, a-b)
	}
	return h
}

// Total is the number of observations.
func (h HistogramDelta) Total() float64 {
	if len(h.Counts) == 0 {
		return 0
	}
	return h.Counts[len(h.Counts)-1]
}

// Quantile is the upper bound of the bucket holding quantile q (NaN
// without observations).
func (h HistogramDelta) Quantile(q float64) float64 {
	n := h.Total()
	if n <= 0 {
		return math.NaN()
	}
	for i, c := range h.Counts {
		if c >= q*n {
			return h.Bounds[i]
		}
	}
	return math.Inf(1)
}

// Within is the share of observations at most bound (which should be one
// of the bucket bounds), NaN without observations.
func (h HistogramDelta) Within(bound float64) float64 {
	n := h.Total()
	if n <= 0 {
		return math.NaN()
	}
	c := 0.0
	for i, b := range h.Bounds {
		if b <= bound {
			c = h.Counts[i]
		}
	}
	return c / n
}

// AckRate is ACKed messages per second.
func (r SendResult) AckRate() float64 {
	if r.Duration <= 0 {
		return 0
	}
	return float64(r.Acked) / r.Duration.Seconds()
}

// WriteTable writes the result as a Markdown table.
func (r SendResult) WriteTable(w io.Writer) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| metric | value |")
	fmt.Fprintln(w, "|---|---:|")
	fmt.Fprintf(w, "| messages sent / ACKed / delivered | %d / %d / %d |\n", r.Messages, r.Acked, r.Delivered)
	fmt.Fprintf(w, "| send errors | %d |\n", r.Errors)
	fmt.Fprintf(w, "| duration | %v |\n", r.Duration.Round(time.Millisecond))
	fmt.Fprintf(w, "| ACKed msgs/s | %.0f |\n", r.AckRate())
	fmt.Fprintf(w, "| ACK latency p50 / p99 / max | %v / %v / %v |\n", ms(r.Ack.P50), ms(r.Ack.P99), ms(r.Ack.Max))
	fmt.Fprintf(w, "| deliver latency p50 / p99 / max | %v / %v / %v |\n", ms(r.Deliver.P50), ms(r.Deliver.P99), ms(r.Deliver.Max))
	fmt.Fprintf(w, "| parley_messages_stored_total increase | %.0f |\n", r.Stored)
	fmt.Fprintf(w, "| parley_retransmits_total increase | %.0f |\n", r.Retransmits)
	if r.Fsyncs >= 0 {
		per := 0.0
		if r.Fsyncs > 0 {
			per = r.Stored / float64(r.Fsyncs)
		}
		fmt.Fprintf(w, "| server fsync+fdatasync calls (perf) | %d (%.2f messages per sync) |\n", r.Fsyncs, per)
	}
	if r.Indexed >= 0 {
		fmt.Fprintf(w, "| messages indexed for search | %.0f (%v after the last ACK) |\n", r.Indexed, r.IndexWait.Round(time.Millisecond))
		fmt.Fprintf(w, "| index lag p50 / p99 (histogram bucket bounds) | ≤ %g s / ≤ %g s; %.2f%% within 2 s |\n",
			r.IndexLag.Quantile(0.5), r.IndexLag.Quantile(0.99), 100*r.IndexLag.Within(2))
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

// RunSend measures durable 1:1 messaging: Pairs senders each send Messages
// messages to their own receiver with at most Inflight unacknowledged,
// timing each ACK and each push to the receiver against the moment its send
// frame was written (one process, one clock).
func RunSend(ctx context.Context, cfg SendConfig) (res SendResult, err error) {
	if err := cfg.Validate(); err != nil {
		return SendResult{}, fmt.Errorf("bench send: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	addr, dir := cfg.Addr, cfg.DataDir
	pid := 0
	if addr == "" {
		if dir, err = os.MkdirTemp("", "parley-bench-send-"); err != nil {
			return SendResult{}, fmt.Errorf("bench send: %w", err)
		}
		defer os.RemoveAll(dir)
		if _, err := auth.LoadOrCreateDevKey(dir); err != nil {
			return SendResult{}, fmt.Errorf("bench send: %w", err)
		}
		srv, err := StartServer(ctx, ServerConfig{
			Binary: cfg.ServerBinary, DataDir: dir, Stderr: cfg.Stderr,
			Args: []string{"--log.level", "warn", "--gateway.drain-timeout", "2s"},
		})
		if err != nil {
			return SendResult{}, fmt.Errorf("bench send: %w", err)
		}
		defer func() { err = errors.Join(err, srv.Stop()) }()
		addr, pid = srv.Addr, srv.PID()
	}
	key, err := auth.LoadHS256KeyFile(filepath.Join(dir, auth.DevKeyFile))
	if err != nil {
		return SendResult{}, fmt.Errorf("bench send: %w", err)
	}
	d := newDialer(addr, key, nil, 4096)
	metricsURL := "http://" + addr + "/metrics"
	httpc := &http.Client{Timeout: 10 * time.Second}

	run := strconv.FormatInt(time.Now().UnixNano()%(1<<40), 36)
	body := strings.Repeat("x", cfg.BodyBytes)
	pairs := make([]*pair, cfg.Pairs)
	defer func() {
		for _, p := range pairs {
			if p != nil {
				p.close()
			}
		}
	}()
	for i := range pairs {
		p, err := openPair(ctx, d, fmt.Sprintf("send%s-%d", run, i), cfg.Messages, cfg.Inflight)
		if err != nil {
			return SendResult{}, fmt.Errorf("bench send: %w", err)
		}
		pairs[i] = p
	}
	fmt.Fprintf(cfg.Out, "server %s; %d pairs × %d messages, %d in flight per sender, %d-byte bodies\n",
		addr, cfg.Pairs, cfg.Messages, cfg.Inflight, cfg.BodyBytes)

	before, err := ScrapeMetrics(ctx, httpc, metricsURL)
	if err != nil {
		return SendResult{}, fmt.Errorf("bench send: %w", err)
	}
	var fs *fsyncCounter
	res.Fsyncs = -1
	if cfg.Fsyncs {
		if fs, err = startFsyncCounter(pid); err != nil {
			return SendResult{}, fmt.Errorf("bench send: %w", err)
		}
		defer fs.stop()
	}

	sent, err := runPairs(ctx, pairs, body)
	if err != nil {
		return SendResult{}, fmt.Errorf("bench send: %w", err)
	}
	fsyncs := res.Fsyncs
	res = sent
	res.Fsyncs = fsyncs
	if fs != nil {
		if res.Fsyncs, err = fs.stop(); err != nil {
			return SendResult{}, fmt.Errorf("bench send: %w", err)
		}
	}
	after, err := ScrapeMetrics(ctx, httpc, metricsURL)
	if err != nil {
		return SendResult{}, fmt.Errorf("bench send: %w", err)
	}

	res.Stored = delta(before, after, "parley_messages_stored_total")
	res.Retransmits = delta(before, after, "parley_retransmits_total")
	if res.Indexed, res.IndexWait, after, err = awaitIndexed(ctx, httpc, metricsURL, before, after, res.Stored); err != nil {
		return SendResult{}, fmt.Errorf("bench send: %w", err)
	}
	res.IndexLag = histogramDelta(before, after, "parley_search_index_lag_seconds")
	res.WriteTable(cfg.Out)
	if res.Errors > 0 {
		return res, fmt.Errorf("bench send: %d sends answered with an error", res.Errors)
	}
	return res, nil
}

// indexWait bounds how long the send benchmark waits for the search index
// to catch up after the last ACK.
const indexWait = 60 * time.Second

// awaitIndexed waits until the node has indexed stored messages since
// before (parley_search_indexed_total), or indexWait passed, and returns
// the count, the wait and the last scrape; -1 when the node has no
// search index.
func awaitIndexed(ctx context.Context, httpc *http.Client, url string, before, after Metrics, stored float64) (float64, time.Duration, Metrics, error) {
	if _, ok := after.Get("parley_search_indexed_total"); !ok {
		return -1, 0, after, nil
	}
	start := time.Now()
	for {
		n := delta(before, after, "parley_search_indexed_total")
		if n >= stored || time.Since(start) > indexWait {
			return n, time.Since(start), after, nil
		}
		select {
		case <-ctx.Done():
			return 0, 0, nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		var err error
		if after, err = ScrapeMetrics(ctx, httpc, url); err != nil {
			return 0, 0, nil, err
		}
	}
}

func delta(before, after Metrics, name string) float64 {
	a, _ := after.Get(name)
	b, _ := before.Get(name)
	return a - b
}

// wsConn is a client connection whose writes may come from two goroutines
// (the sending loop and the reader acknowledging pushes); gorilla allows one
// writer at a time.
type wsConn struct {
	ws *websocket.Conn
	mu sync.Mutex
}

func (c *wsConn) write(f *protocol.Frame) error {
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ws.WriteMessage(websocket.TextMessage, b)
}

// pair is one sender, one receiver and their direct conversation.
type pair struct {
	sender, receiver *wsConn
	senderUser       string
	conv             uint64
	base             time.Time
	// sentAt[j] is when message j's send frame was written, as time since
	// base; atomic because the receiver's reader reads it.
	sentAt []atomic.Int64
	window chan struct{} // a token per unanswered send
	acked  chan struct{} // closed when every send is answered
	deliv  chan struct{} // closed when every message reached the receiver
	opened chan *protocol.Frame
	// readers are the two reader goroutines, ended by close.
	readers sync.WaitGroup

	mu struct {
		sync.Mutex
		ackLat, delLat []time.Duration
		answered       int
		errors         int
		lastAck        time.Time
		seen           []bool // receiver: message j already counted
	}
}

const msgPrefix = "m"

// openPair opens a sender and a receiver through the same node.
func openPair(ctx context.Context, d *dialer, name string, messages, inflight int) (*pair, error) {
	return openPairAcross(ctx, d, d, name, messages, inflight)
}

func (p *pair) close() {
	p.sender.ws.Close()
	p.receiver.ws.Close()
	p.readers.Wait()
}

func (p *pair) readLoop(c *wsConn, on func(*wsConn, *protocol.Frame, time.Time)) {
	defer p.readers.Done()
	for {
		_, data, err := c.ws.ReadMessage()
		if err != nil {
			return
		}
		now := time.Now()
		var f protocol.Frame
		if err := json.Unmarshal(data, &f); err != nil {
			continue
		}
		on(c, &f, now)
	}
}

// sendAll writes the sends, keeping at most inflight unanswered.
func (p *pair) sendAll(ctx context.Context, body string) {
	for j := range p.sentAt {
		select {
		case p.window <- struct{}{}:
		case <-ctx.Done():
			return
		}
		id := msgPrefix + strconv.Itoa(j)
		p.sentAt[j].Store(int64(time.Since(p.base)))
		if err := p.sender.write(&protocol.Frame{Type: protocol.TypeSend, RID: id, ConvID: p.conv, ClientMsgID: id, Body: body}); err != nil {
			return // the reader sees the broken connection; wait times out
		}
	}
}

func (p *pair) onSenderFrame(c *wsConn, f *protocol.Frame, now time.Time) {
	switch f.Type {
	case protocol.TypeConv:
		p.opened <- f
	case protocol.TypeError:
		if f.RID == "open" {
			p.opened <- f
			return
		}
		p.answer(f.RID, now, false)
	case protocol.TypeAck:
		p.answer(f.RID, now, true)
	case protocol.TypeMsg:
		if f.Message == nil {
			return
		}
		// The sending connection gets its own messages pushed too; an
		// unacknowledged push would be re-sent and fill its window.
		_ = c.write(&protocol.Frame{Type: protocol.TypeDelivered, ConvID: f.Message.ConvID, Seq: f.Message.Seq})
	}
}

func (p *pair) answer(rid string, now time.Time, ok bool) {
	j, found := p.index(rid)
	if !found {
		return
	}
	lat := now.Sub(p.base) - time.Duration(p.sentAt[j].Load())
	p.mu.Lock()
	if ok {
		p.mu.ackLat = append(p.mu.ackLat, lat)
		p.mu.lastAck = now
	} else {
		p.mu.errors++
	}
	p.mu.answered++
	if p.mu.answered == len(p.sentAt) {
		close(p.acked)
	}
	p.mu.Unlock()
	select {
	case <-p.window:
	default:
	}
}

func (p *pair) onReceiverFrame(c *wsConn, f *protocol.Frame, now time.Time) {
	if f.Type != protocol.TypeMsg || f.Message == nil {
		return
	}
	m := f.Message
	_ = c.write(&protocol.Frame{Type: protocol.TypeDelivered, ConvID: m.ConvID, Seq: m.Seq})
	j, found := p.index(m.ClientMsgID)
	if m.Sender != p.senderUser || !found {
		return
	}
	lat := now.Sub(p.base) - time.Duration(p.sentAt[j].Load())
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mu.seen[j] {
		return // a re-sent push
	}
	p.mu.seen[j] = true
	p.mu.delLat = append(p.mu.delLat, lat)
	if len(p.mu.delLat) == len(p.sentAt) {
		close(p.deliv)
	}
}

func (p *pair) index(id string) (int, bool) {
	s, ok := strings.CutPrefix(id, msgPrefix)
	if !ok {
		return 0, false
	}
	j, err := strconv.Atoi(s)
	if err != nil || j < 0 || j >= len(p.sentAt) {
		return 0, false
	}
	return j, true
}

// wait blocks until every send is answered and every message delivered.
func (p *pair) wait(ctx context.Context) error {
	for _, ch := range []chan struct{}{p.acked, p.deliv} {
		select {
		case <-ch:
		case <-ctx.Done():
			p.mu.Lock()
			defer p.mu.Unlock()
			return fmt.Errorf("%s: %d answered, %d delivered of %d: %w",
				p.senderUser, p.mu.answered, len(p.mu.delLat), len(p.sentAt), ctx.Err())
		}
	}
	return nil
}
