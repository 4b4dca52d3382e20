package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/protocol"
)

// Unit tests and the helpers every test file shares. Everything that needs
// a server runs against a real in-process node (internal/servertest), with
// faults injected by the proxy in proxy_test.go.

const waitLimit = 10 * time.Second

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p))
	return len(p), nil
}

// recorder drains a client's events and keeps them with their arrival time.
type recorder struct {
	mu     sync.Mutex
	events []Event
	times  []time.Time
	done   chan struct{}
}

func record(c *Client) *recorder {
	r := &recorder{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for ev := range c.Events() {
			r.mu.Lock()
			r.events = append(r.events, ev)
			r.times = append(r.times, time.Now())
			r.mu.Unlock()
		}
	}()
	return r
}

// seqs returns the seqs of conv's message events, in arrival order.
func (r *recorder) seqs(convID uint64) []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []uint64
	for _, ev := range r.events {
		if ev.Kind == EventMessage && ev.ConvID == convID {
			out = append(out, ev.Message.Seq)
		}
	}
	return out
}

func (r *recorder) messages(convID uint64) []protocol.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []protocol.Message
	for _, ev := range r.events {
		if ev.Kind == EventMessage && ev.ConvID == convID {
			out = append(out, *ev.Message)
		}
	}
	return out
}

func (r *recorder) hasSeq(convID, seq uint64) bool { return slices.Contains(r.seqs(convID), seq) }

func (r *recorder) count(kind EventKind) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, ev := range r.events {
		if ev.Kind == kind {
			n++
		}
	}
	return n
}

func (r *recorder) find(kind EventKind, convID uint64) *Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.events {
		if r.events[i].Kind == kind && r.events[i].ConvID == convID {
			return &r.events[i]
		}
	}
	return nil
}

// all returns the events of kind with their arrival times.
func (r *recorder) all(kind EventKind) ([]Event, []time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var evs []Event
	var at []time.Time
	for i, ev := range r.events {
		if ev.Kind == kind {
			evs = append(evs, ev)
			at = append(at, r.times[i])
		}
	}
	return evs, at
}

// receipt reports whether a receipt from user's device with state and seq came.
func (r *recorder) receipt(user, device, state string, seq uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ev := range r.events {
		if ev.Kind == EventReceipt && ev.Receipt.UserID == user && (device == "" || ev.Receipt.DeviceID == device) &&
			ev.Receipt.State == state && ev.Receipt.Seq == seq {
			return true
		}
	}
	return false
}

func eventually(t *testing.T, what string, cond func() bool, state ...func() string) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			var detail string
			for _, s := range state {
				detail += " " + s()
			}
			t.Fatalf("timed out waiting for %s;%s", what, detail)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// wantRun checks that conv's messages arrived exactly as from..to.
func wantRun(t *testing.T, got []uint64, from, to uint64) {
	t.Helper()
	if uint64(len(got)) != to-from+1 {
		t.Fatalf("got %d messages %v, want seqs %d..%d", len(got), got, from, to)
	}
	for i, s := range got {
		if s != from+uint64(i) {
			t.Fatalf("message %d has seq %d, want %d (all: %v)", i, s, from+uint64(i), got)
		}
	}
}

// contiguous checks that seqs strictly increase by one.
func contiguous(t *testing.T, who string, seqs []uint64) {
	t.Helper()
	for i := 1; i < len(seqs); i++ {
		if seqs[i] != seqs[i-1]+1 {
			t.Fatalf("%s: seq %d follows %d (all: %v)", who, seqs[i], seqs[i-1], seqs)
		}
	}
}

type runningClient struct {
	*Client
	rec  *recorder // nil when the test reads Events itself
	errc chan error
}

func testConfig(t *testing.T, url, token, device string) Config {
	return Config{URL: url, Token: token, Device: device, MinBackoff: 10 * time.Millisecond,
		MaxBackoff: 200 * time.Millisecond, RequestTimeout: 3 * time.Second, Logger: testLogger(t)}
}

// launch starts Run without waiting for a connection; the client is closed
// when the test ends.
func launch(t *testing.T, cfg Config, recordEvents bool) *runningClient {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return run(t, c, recordEvents)
}

func run(t *testing.T, c *Client, recordEvents bool) *runningClient {
	rc := &runningClient{Client: c, errc: make(chan error, 1)}
	if recordEvents {
		rc.rec = record(c)
	}
	go func() { rc.errc <- c.Run(context.Background()) }()
	t.Cleanup(func() { c.Close() })
	return rc
}

// startE2E starts a recorded client and waits for its first EventConnected.
func startE2E(t *testing.T, url, token, device string, edit func(*Config)) *runningClient {
	t.Helper()
	cfg := testConfig(t, url, token, device)
	if edit != nil {
		edit(&cfg)
	}
	rc := launch(t, cfg, true)
	eventually(t, device+" connected", func() bool { return rc.rec.count(EventConnected) > 0 })
	return rc
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	return ctx
}

func TestConfigValidate(t *testing.T) {
	ok := Config{URL: "ws://127.0.0.1:7480", Token: "t", Device: "cli"}
	tests := []struct {
		name string
		edit func(*Config)
		ok   bool
	}{
		{"valid", func(*Config) {}, true},
		{"wss with path", func(c *Config) { c.URL = "wss://h/v1/ws" }, true},
		{"token func", func(c *Config) {
			c.Token = ""
			c.TokenFunc = func(context.Context) (string, error) { return "t", nil }
		}, true},
		{"urls", func(c *Config) { c.URL, c.URLs = "", []string{"ws://a:1", "wss://b:2/v1/ws"} }, true},
		{"one url in urls", func(c *Config) { c.URL, c.URLs = "", []string{"ws://a:1"} }, true},
		{"url and urls", func(c *Config) { c.URLs = []string{"ws://a:1"} }, false},
		{"neither url nor urls", func(c *Config) { c.URL = "" }, false},
		{"bad entry in urls", func(c *Config) { c.URL, c.URLs = "", []string{"ws://a:1", "http://b"} }, false},
		{"empty entry in urls", func(c *Config) { c.URL, c.URLs = "", []string{"ws://a:1", ""} }, false},
		{"http scheme", func(c *Config) { c.URL = "http://h" }, false},
		{"no host", func(c *Config) { c.URL = "ws://" }, false},
		{"no token", func(c *Config) { c.Token = "" }, false},
		{"both tokens", func(c *Config) { c.TokenFunc = func(context.Context) (string, error) { return "", nil } }, false},
		{"bad device", func(c *Config) { c.Device = "a b" }, false},
		{"empty device", func(c *Config) { c.Device = "" }, false},
		{"min over max", func(c *Config) { c.MinBackoff, c.MaxBackoff = time.Second, time.Millisecond }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ok
			tc.edit(&cfg)
			err := cfg.Validate()
			if (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, does not wrap ErrInvalidConfig", err)
			}
		})
	}
}

func TestRotationOrder(t *testing.T) {
	urls := []string{"ws://a", "ws://b", "ws://c"}
	for start := range urls {
		t.Run(fmt.Sprint("start ", start), func(t *testing.T) {
			r := newRotation(urls, func(n int) int {
				if n != len(urls) {
					t.Fatalf("intn(%d), want intn(%d)", n, len(urls))
				}
				return start
			})
			var got []string
			for i := 0; i < 7; i++ {
				got = append(got, r.next())
			}
			for i, u := range got {
				if want := urls[(start+i)%len(urls)]; u != want {
					t.Fatalf("attempt %d went to %s, want %s (all %v)", i, u, want, got)
				}
			}
		})
	}
	single := newRotation([]string{"ws://only"}, func(int) int { t.Fatal("random start for one URL"); return 0 })
	if a, b := single.next(), single.next(); a != "ws://only" || b != a {
		t.Fatalf("one URL: %s then %s", a, b)
	}
	own := []string{"ws://a", "ws://b"}
	r := newRotation(own, func(int) int { return 0 })
	own[0] = "ws://changed"
	if got := r.next(); got != "ws://a" {
		t.Fatalf("rotation follows the caller's slice: got %s", got)
	}
}

// Clients built from the same URLs must not all start at the same gateway.
func TestRotationSpreadsClients(t *testing.T) {
	urls := []string{"ws://a:1", "ws://b:1", "ws://c:1"}
	count := map[string]int{}
	const n = 600
	for i := 0; i < n; i++ {
		c, err := New(Config{URLs: urls, Token: "t", Device: "d"})
		if err != nil {
			t.Fatal(err)
		}
		count[c.rot.next()]++
		c.Close()
	}
	// Binomial(600, 1/3): mean 200, sd ≈ 11.5; 120 is seven sd away.
	for _, u := range urls {
		if count[u] < 120 || count[u] > 280 {
			t.Fatalf("first gateways %v: not spread evenly", count)
		}
	}
}

func TestSyncFrames(t *testing.T) {
	pos := map[uint64]uint64{}
	for i := uint64(1); i <= 5; i++ {
		pos[i] = i * 10
	}
	frames := syncFrames(pos, 2)
	if len(frames) != 3 || !frames[0].All || frames[1].All || frames[2].All {
		t.Fatalf("got %d frames (all flags %v %v), want 3 with only the first all:true", len(frames), frames[0].All, frames[len(frames)-1].All)
	}
	var n int
	for _, f := range frames {
		for _, sc := range f.Convs {
			n++
			if sc.AfterSeq != pos[sc.ConvID] {
				t.Errorf("conv %d after_seq %d, want %d", sc.ConvID, sc.AfterSeq, pos[sc.ConvID])
			}
		}
	}
	if n != 5 {
		t.Fatalf("%d positions sent, want 5", n)
	}
	if f := syncFrames(nil, 2); len(f) != 1 || !f[0].All || len(f[0].Convs) != 0 {
		t.Fatalf("no positions: got %+v, want one all:true frame", f)
	}
}

func TestNewClientMsgID(t *testing.T) {
	a, b := NewClientMsgID(), NewClientMsgID()
	if len(a) != 32 || a == b {
		t.Fatalf("ids %q %q: want 32 hex chars, distinct", a, b)
	}
}
