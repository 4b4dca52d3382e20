package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/protocol"
)

// StormClientConfig configures one client process of the reconnect-storm
// test (internal/clustertest): a Go SDK client for each of the users
// Prefix+From … Prefix+(To-1), spread over the gateways URLs. The SDK does
// what a phone would after losing its gateway: reconnect with full-jitter
// backoff, honour Retry-After and retry_after_ms, sync, fill gaps.
type StormClientConfig struct {
	URLs   []string // gateway WebSocket bases, ws://host:port
	Key    []byte   // the cluster's HS256 key; tokens are minted per attempt
	Prefix string
	From   int
	To     int
	Device string
	// Concurrency bounds the clients making their first connection at
	// once, so the initial ramp is not itself a storm.
	Concurrency int
	// MinBackoff and MaxBackoff are the SDK's reconnect bounds.
	MinBackoff, MaxBackoff time.Duration
	Logger                 *slog.Logger
}

// DefaultStormClientConfig returns the defaults of the optional fields.
func DefaultStormClientConfig() StormClientConfig {
	return StormClientConfig{
		Device: "d1", Concurrency: 64,
		MinBackoff: client.DefaultMinBackoff, MaxBackoff: 5 * time.Second, Logger: slog.Default(),
	}
}

// Validate reports a configuration the client cannot run with.
func (c StormClientConfig) Validate() error {
	var errs []error
	if len(c.URLs) == 0 || c.Prefix == "" {
		errs = append(errs, errors.New("urls and prefix are required"))
	}
	if len(c.Key) < auth.MinHS256KeyBytes {
		errs = append(errs, fmt.Errorf("key is %d bytes, need at least %d", len(c.Key), auth.MinHS256KeyBytes))
	}
	if c.From < 0 || c.To <= c.From {
		errs = append(errs, fmt.Errorf("need 0 <= from < to, got %d, %d", c.From, c.To))
	}
	if c.To-c.From > MaxConnsPerClient {
		errs = append(errs, fmt.Errorf("%d clients exceed %d per process", c.To-c.From, MaxConnsPerClient))
	}
	if !protocol.ValidID(c.Device) {
		errs = append(errs, fmt.Errorf("device %q is not a valid id", c.Device))
	}
	if c.Concurrency < 1 {
		errs = append(errs, fmt.Errorf("concurrency must be positive, got %d", c.Concurrency))
	}
	if c.MinBackoff <= 0 || c.MaxBackoff < c.MinBackoff {
		errs = append(errs, fmt.Errorf("need 0 < min backoff <= max backoff, got %v, %v", c.MinBackoff, c.MaxBackoff))
	}
	if c.Logger == nil {
		errs = append(errs, errors.New("logger is required"))
	}
	return errors.Join(errs...)
}

// StormReport is what a storm client process tells the test.
type StormReport struct {
	Clients int `json:"clients"`
	// Connected counts clients whose latest event is EventConnected: up,
	// with their (re)connect sync applied.
	Connected int `json:"connected"`
	// MinConnects is the fewest connections any one client has made.
	MinConnects int `json:"min_connects"`
	// Texts maps a number of distinct text messages received (pushed or
	// synced) to how many clients have exactly that many.
	Texts map[int]int `json:"texts"`
	// Dups are text messages the SDK handed over twice; it promises none.
	Dups int64 `json:"dups"`
	// Stopped are clients whose Run returned: a permanent error.
	Stopped int      `json:"stopped"`
	Errors  []string `json:"errors,omitempty"` // the first few
	// Resync is, per reconnect, disconnect → connected with its sync
	// applied, in ms.
	Resync Histogram `json:"resync_ms"`
}

// MergeStormReports combines the reports of several processes.
func MergeStormReports(rs []StormReport) StormReport {
	out := StormReport{Texts: map[int]int{}, Resync: Histogram{}}
	for i, r := range rs {
		out.Clients += r.Clients
		out.Connected += r.Connected
		if i == 0 || r.MinConnects < out.MinConnects {
			out.MinConnects = r.MinConnects
		}
		for n, users := range r.Texts {
			out.Texts[n] += users
		}
		out.Dups += r.Dups
		out.Stopped += r.Stopped
		out.Errors = append(out.Errors, r.Errors...)
		out.Resync.Merge(r.Resync)
	}
	return out
}

// ParseStormReport reads a "report {json}" line.
func ParseStormReport(line string) (StormReport, error) {
	rest, ok := strings.CutPrefix(line, respReport+" ")
	if !ok {
		return StormReport{}, fmt.Errorf("parse storm report: not a report line: %.200q", line)
	}
	var r StormReport
	if err := json.Unmarshal([]byte(rest), &r); err != nil {
		return StormReport{}, fmt.Errorf("parse storm report: %w", err)
	}
	if r.Resync == nil {
		r.Resync = Histogram{}
	}
	return r, nil
}

// The storm client's line protocol is the fan-out client's: "ready N" once
// every client has connected and synced once (or "err MESSAGE"), then
// "report" → "report {json StormReport}"; end of input stops the clients.
const (
	// StormReady and StormReport are the storm client's lines, for the
	// test that drives it from another package.
	StormReady     = respReady
	StormReportCmd = cmdReport
)

// maxStormErrors bounds the errors one report carries.
const maxStormErrors = 5

// RunStormClient runs the configured SDK clients until in ends or ctx is
// done, answering reports on out.
func RunStormClient(ctx context.Context, cfg StormClientConfig, in io.Reader, out io.Writer) error {
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(out, "%s %v\n", respErr, err)
		return fmt.Errorf("storm client: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sc := &stormClient{cfg: cfg, slots: make(chan struct{}, cfg.Concurrency)}
	defer sc.wg.Wait()
	defer cancel()
	n := cfg.To - cfg.From
	sc.users = make([]*stormUser, n)
	ready := make(chan struct{})
	var left atomic.Int64
	left.Store(int64(n))
	firstConnect := func() {
		if left.Add(-1) == 0 {
			close(ready)
		}
	}
	for i := range n {
		select {
		case sc.slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		u, err := sc.start(ctx, cfg.Prefix+strconv.Itoa(cfg.From+i), firstConnect)
		if err != nil {
			fmt.Fprintf(out, "%s %v\n", respErr, err)
			return fmt.Errorf("storm client: %w", err)
		}
		sc.users[i] = u
	}
	select {
	case <-ready:
	case <-ctx.Done():
		return nil
	}
	fmt.Fprintf(out, "%s %d\n", respReady, n)

	serveCommands(ctx, in, out, reportCommand(func() any { return sc.report() }))
	return nil
}

type stormClient struct {
	cfg   StormClientConfig
	slots chan struct{} // first connections in progress
	users []*stormUser
	wg    sync.WaitGroup // every client's Run and event loop
}

// stormUser is one SDK client and what its event stream showed.
type stormUser struct {
	c *client.Client

	mu struct {
		sync.Mutex
		texts     map[convSeq]struct{}
		dups      int64
		connects  int
		connected bool
		downSince time.Time // zero while connected
		resync    Histogram
		stopped   error
	}
}

type convSeq struct{ conv, seq uint64 }

// start creates and runs one user's client; first is called once, at its
// first EventConnected, which also frees its ramp slot.
func (sc *stormClient) start(ctx context.Context, user string, first func()) (*stormUser, error) {
	key := sc.cfg.Key
	c, err := client.New(client.Config{
		URLs: sc.cfg.URLs, Device: sc.cfg.Device,
		TokenFunc: func(context.Context) (string, error) {
			now := time.Now()
			return auth.MintHS256(key, auth.Claims{User: user, IssuedAt: now.Add(-time.Minute), Expires: now.Add(time.Hour)})
		},
		MinBackoff: sc.cfg.MinBackoff, MaxBackoff: sc.cfg.MaxBackoff,
		Logger: sc.cfg.Logger.With("user", user),
	})
	if err != nil {
		return nil, err
	}
	u := &stormUser{c: c}
	u.mu.texts = make(map[convSeq]struct{})
	u.mu.resync = Histogram{}
	sc.wg.Add(2)
	go func() {
		defer sc.wg.Done()
		if err := c.Run(ctx); err != nil {
			u.mu.Lock()
			u.mu.stopped = err
			u.mu.Unlock()
		}
	}()
	go func() {
		defer sc.wg.Done()
		var once sync.Once
		for ev := range c.Events() {
			if u.onEvent(ev, time.Now()) {
				once.Do(func() { <-sc.slots; first() })
			}
		}
		// Run has returned without a first connection: free the slot
		// and let the ramp finish, the report shows the failure.
		once.Do(func() { <-sc.slots; first() })
	}()
	return u, nil
}

// onEvent records ev and reports whether it was a (re)connection.
func (u *stormUser) onEvent(ev client.Event, now time.Time) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	switch ev.Kind {
	case client.EventMessage:
		m := ev.Message
		if m == nil || m.Kind != protocol.KindText {
			return false
		}
		k := convSeq{m.ConvID, m.Seq}
		if _, seen := u.mu.texts[k]; seen {
			u.mu.dups++
			return false
		}
		u.mu.texts[k] = struct{}{}
	case client.EventConnected:
		u.mu.connects++
		u.mu.connected = true
		if !u.mu.downSince.IsZero() {
			u.mu.resync.Record(now.Sub(u.mu.downSince).Milliseconds())
			u.mu.downSince = time.Time{}
		}
		return true
	case client.EventDisconnected:
		u.mu.connected = false
		if u.mu.downSince.IsZero() {
			u.mu.downSince = now
		}
	}
	return false
}

func (sc *stormClient) report() StormReport {
	r := StormReport{Texts: map[int]int{}, Resync: Histogram{}, MinConnects: -1}
	for _, u := range sc.users {
		if u == nil {
			continue
		}
		u.mu.Lock()
		r.Clients++
		if u.mu.connected {
			r.Connected++
		}
		if r.MinConnects < 0 || u.mu.connects < r.MinConnects {
			r.MinConnects = u.mu.connects
		}
		r.Texts[len(u.mu.texts)]++
		r.Dups += u.mu.dups
		r.Resync.Merge(u.mu.resync)
		if u.mu.stopped != nil {
			r.Stopped++
			if len(r.Errors) < maxStormErrors {
				r.Errors = append(r.Errors, u.mu.stopped.Error())
			}
		}
		u.mu.Unlock()
	}
	return r
}
