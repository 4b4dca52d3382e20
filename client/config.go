package client

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/parley-im/parley/protocol"
)

// Config configures a Client. Zero durations take the defaults below.
type Config struct {
	// URL is the server's WebSocket base, e.g. "ws://127.0.0.1:7480". A URL
	// without a path gets /v1/ws. Exactly one of URL and URLs is set.
	URL string
	// URLs lists the gateways of a cluster. The client starts at a random
	// one and every connection attempt after the first goes to the next in
	// turn, so clients spread over the gateways and one that is draining,
	// full or dead is left on the very next attempt.
	URLs []string
	// Token is a fixed bearer token. Exactly one of Token and TokenFunc is set.
	Token string
	// TokenFunc is called before every connection attempt, so a caller can
	// refresh short-lived tokens.
	TokenFunc func(ctx context.Context) (string, error)
	// Device identifies this device of the user (1–64 bytes of [A-Za-z0-9._@-]).
	Device string
	// Logger receives the client's diagnostics; nil discards them.
	Logger *slog.Logger
	// MinBackoff and MaxBackoff bound the reconnect delay (full jitter:
	// uniform in [0, min(MaxBackoff, MinBackoff·2^attempt))). Defaults 250ms, 30s.
	MinBackoff time.Duration
	MaxBackoff time.Duration
	// RequestTimeout bounds one attempt of a request (and the handshake).
	// Default 10s. Idempotent requests retry after it; Send keeps retrying
	// until its context ends.
	RequestTimeout time.Duration
	// State persists the last seq seen per conversation; nil keeps it in
	// memory for the life of the Client.
	State StateStore
	// EventBuffer is the capacity of the Events channel. Default 256.
	EventBuffer int
	// HTTPClient carries the bytes of uploads and downloads (the URLs
	// upload_part and attachment_url answer: Parley's own endpoints or
	// presigned S3 URLs; they are signed, so no token is sent). nil: a
	// client with the environment's proxy and no overall timeout (a
	// transfer is bounded by its context).
	HTTPClient *http.Client
	// TLSConfig configures wss:// connections (for example RootCAs for a
	// private certificate authority) and, when HTTPClient is nil, the
	// default one's HTTPS transfers. nil: the system's roots.
	TLSConfig *tls.Config
}

// Defaults.
const (
	DefaultMinBackoff     = 250 * time.Millisecond
	DefaultMaxBackoff     = 30 * time.Second
	DefaultRequestTimeout = 10 * time.Second
	DefaultEventBuffer    = 256
)

func (c Config) withDefaults() Config {
	if c.MinBackoff == 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.EventBuffer == 0 {
		c.EventBuffer = DefaultEventBuffer
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.State == nil {
		c.State = NewMemoryState()
	}
	if c.HTTPClient == nil {
		var rt http.RoundTripper = http.DefaultTransport
		if t, ok := rt.(*http.Transport); ok && c.TLSConfig != nil {
			t = t.Clone()
			t.TLSClientConfig = c.TLSConfig.Clone()
			rt = t
		}
		c.HTTPClient = &http.Client{Transport: rt}
	}
	return c
}

// Validate reports the first problem with c after defaults are applied.
func (c Config) Validate() error {
	c = c.withDefaults()
	if (c.URL == "") == (len(c.URLs) == 0) {
		return fmt.Errorf("%w: set exactly one of URL and URLs", ErrInvalidConfig)
	}
	for _, raw := range c.servers() {
		if err := validURL(raw); err != nil {
			return err
		}
	}
	if (c.Token == "") == (c.TokenFunc == nil) {
		return fmt.Errorf("%w: set exactly one of Token and TokenFunc", ErrInvalidConfig)
	}
	if !protocol.ValidID(c.Device) {
		return fmt.Errorf("%w: device %q is not 1-64 bytes of [A-Za-z0-9._@-]", ErrInvalidConfig, c.Device)
	}
	if c.MinBackoff < 0 || c.MaxBackoff < c.MinBackoff {
		return fmt.Errorf("%w: need 0 <= MinBackoff <= MaxBackoff", ErrInvalidConfig)
	}
	if c.RequestTimeout < 0 || c.EventBuffer < 0 {
		return fmt.Errorf("%w: RequestTimeout and EventBuffer must not be negative", ErrInvalidConfig)
	}
	return nil
}

// servers is the list of URLs to rotate through.
func (c Config) servers() []string {
	if c.URL != "" {
		return []string{c.URL}
	}
	return c.URLs
}

func validURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%w: url: %v", ErrInvalidConfig, err)
	}
	if u.Scheme != "ws" && u.Scheme != "wss" {
		return fmt.Errorf("%w: url %q: scheme must be ws or wss", ErrInvalidConfig, raw)
	}
	if u.Host == "" {
		return fmt.Errorf("%w: url %q has no host", ErrInvalidConfig, raw)
	}
	return nil
}

// StateStore persists, per conversation, the highest seq this device has
// handed to the application, so that a restarted client syncs from there
// instead of from the user's read position. Implementations must be safe for
// concurrent use. The client saves a position at most ~100ms after the
// application took the message and before acknowledging it to the server; a
// crash inside that window hands those messages over again after restart.
type StateStore interface {
	// Load returns every stored position (conv_id → seq).
	Load(ctx context.Context) (map[uint64]uint64, error)
	// Save raises the position of convID to seq.
	Save(ctx context.Context, convID, seq uint64) error
}

// MemoryState is the in-memory StateStore. Sharing one between successive
// Clients of the same user and device carries positions across them.
type MemoryState struct {
	mu  sync.Mutex
	pos map[uint64]uint64 // guarded by mu
}

var _ StateStore = (*MemoryState)(nil)

// NewMemoryState returns an empty MemoryState.
func NewMemoryState() *MemoryState { return &MemoryState{pos: make(map[uint64]uint64)} }

// Load implements StateStore.
func (m *MemoryState) Load(context.Context) (map[uint64]uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[uint64]uint64, len(m.pos))
	for k, v := range m.pos {
		out[k] = v
	}
	return out, nil
}

// Save implements StateStore; it never lowers a position.
func (m *MemoryState) Save(_ context.Context, convID, seq uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if seq > m.pos[convID] {
		m.pos[convID] = seq
	}
	return nil
}
