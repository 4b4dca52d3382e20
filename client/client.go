package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-im/parley/protocol"
)

// stableAfter is how long a connection must last for the reconnect backoff
// to start again from its first step.
var stableAfter = 10 * time.Second

// Client is a connection to a Parley server on behalf of one user's device.
// Build it with New, drive it with Run, read Events, call the request
// methods from any goroutine.
type Client struct {
	cfg Config
	log *slog.Logger
	bo  backoff
	rot rotation // used by Run's goroutine only

	events   chan Event
	closedCh chan struct{} // closed once no connection will come any more
	stopped  chan struct{} // closed when Run has returned (or Close without Run)

	closeOnce sync.Once

	// mu guards the lifecycle and the current connection.
	mu struct {
		sync.Mutex
		running bool
		closed  bool
		cancel  context.CancelFunc
		cur     *conn         // nil while disconnected
		changed chan struct{} // closed and replaced whenever cur changes
	}
	// watch guards the presence watch list, sent again on every
	// connection (WatchPresence).
	watch struct {
		sync.Mutex
		users []string
	}
	// pos guards the positions handed to the application (conv → seq).
	pos struct {
		sync.Mutex
		m map[uint64]uint64
	}
}

// New checks cfg and returns a Client that is not yet connected.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	c := &Client{
		cfg:      cfg,
		log:      cfg.Logger,
		bo:       newBackoff(cfg.MinBackoff, cfg.MaxBackoff),
		rot:      newRotation(cfg.servers(), mrand.IntN),
		events:   make(chan Event, cfg.EventBuffer),
		closedCh: make(chan struct{}),
		stopped:  make(chan struct{}),
	}
	c.mu.changed = make(chan struct{})
	c.pos.m = make(map[uint64]uint64)
	return c, nil
}

// Events returns the event stream (see the package comment for its order and
// its policy towards slow readers). It is closed when Run returns.
func (c *Client) Events() <-chan Event { return c.events }

// Run connects and keeps a connection alive until ctx is done or Close is
// called, then returns nil. It returns an error wrapping ErrUnauthorized
// when the server refuses the token (also ErrTokenExpired or
// ErrTokenRevoked when it ended a connection for its token and no new one
// came: see those), ErrBanned when the user is banned, ErrReplaced when a
// newer connection of the same device takes over, ErrClosed/ErrRunning
// when misused, and an
// error for a state store that cannot load or a handshake refused as
// malformed. Run may be called once per Client.
func (c *Client) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.mu.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	if c.mu.running {
		c.mu.Unlock()
		return ErrRunning
	}
	c.mu.running = true
	ctx, cancel := context.WithCancel(ctx)
	c.mu.cancel = cancel
	c.mu.Unlock()
	defer func() {
		cancel()
		c.mu.Lock()
		c.mu.closed = true
		c.mu.Unlock()
		close(c.closedCh)
		close(c.events)
		close(c.stopped)
	}()

	loaded, err := c.cfg.State.Load(ctx)
	if err != nil {
		return fmt.Errorf("client: load state: %w", err)
	}
	for convID, seq := range loaded {
		c.setPosition(convID, seq)
	}
	return c.loop(ctx)
}

func (c *Client) loop(ctx context.Context) error {
	attempt := 0
	// stale is the token of the last connection the server ended as
	// expired or revoked (why), which is never sent again.
	var (
		stale string
		why   error
	)
	for {
		target := c.rot.next()
		ws, hello, token, err := dial(ctx, c.cfg, target, stale, why)
		if ctx.Err() != nil {
			if ws != nil {
				ws.Close()
			}
			return nil
		}
		if err != nil {
			var de *dialError
			if errors.As(err, &de) && de.permanent {
				c.log.Error("client: connect refused", "err", err)
				return err
			}
			delay := c.bo.delay(attempt)
			if de != nil && de.retryAfter > 0 {
				delay = c.bo.after(de.retryAfter)
			}
			attempt++
			c.log.Info("client: connect failed", "url", target, "err", err, "attempt", attempt, "delay", delay)
			c.tryEmit(Event{Kind: EventReconnecting, Err: err, URL: c.rot.peek(), Delay: delay})
			if !sleep(ctx, delay) {
				return nil
			}
			continue
		}
		c.log.Debug("client: connected", "url", target, "node", hello.Node)
		start := time.Now()
		cn := c.serve(ctx, ws, *hello, target)
		if ctx.Err() != nil {
			c.tryEmit(Event{Kind: EventDisconnected})
			return nil
		}
		if errors.Is(cn.err, ErrReplaced) || errors.Is(cn.err, ErrBanned) {
			c.tryEmit(Event{Kind: EventDisconnected, Err: cn.err})
			c.log.Error("client: stopped by the server", "err", cn.err)
			return fmt.Errorf("client: %w", cn.err)
		}
		expired := errors.Is(cn.err, ErrTokenExpired) || errors.Is(cn.err, ErrTokenRevoked)
		if expired {
			stale, why = token, cn.err
			if c.cfg.TokenFunc == nil {
				// A fixed token cannot be renewed: stop without a refused
				// reconnect.
				c.tryEmit(Event{Kind: EventDisconnected, Err: cn.err})
				c.log.Error("client: stopped: the token is no longer accepted", "err", cn.err)
				return fmt.Errorf("client: %w: %w", cn.err, ErrUnauthorized)
			}
		}
		select {
		case c.events <- Event{Kind: EventDisconnected, Err: cn.err}:
		case <-ctx.Done():
			return nil
		}
		if time.Since(start) >= stableAfter {
			attempt = 0
		}
		delay := c.bo.delay(attempt)
		switch {
		case expired:
			// A new token is all it needs: the first backoff step only.
			delay = c.bo.delay(0)
		case errors.Is(cn.err, ErrKicked):
			// The operator asked this device to go: never straight back.
			delay = max(delay, c.cfg.MinBackoff)
		}
		attempt++
		if at := cn.leaveAt.Load(); at != 0 {
			// The node's delay runs from its goaway; usually it is over
			// and the client has left by itself, unless the node closed first.
			delay = max(time.Until(time.Unix(0, at)), 0)
		}
		c.log.Info("client: disconnected", "url", target, "err", cn.err, "delay", delay)
		c.tryEmit(Event{Kind: EventReconnecting, Err: cn.err, URL: c.rot.peek(), Delay: delay})
		if !sleep(ctx, delay) {
			return nil
		}
	}
}

// serve runs one connection's reader, writer and dispatcher and returns
// once all three have finished. base is the URL it was dialled at.
func (c *Client) serve(ctx context.Context, ws *websocket.Conn, hello protocol.Hello, base string) *conn {
	cn := newConn(ws, hello, c.cfg, c.bo)
	cn.base = base
	cn.disp = newDispatcher(c, cn)
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); cn.readLoop() }()
	go func() { defer wg.Done(); cn.writeLoop() }()
	go func() { defer wg.Done(); cn.disp.run() }()
	select {
	case <-ctx.Done():
		cn.fail(errClientStopping)
	case <-cn.stop:
	}
	c.unpublish(cn)
	wg.Wait()
	return cn
}

func (c *Client) tryEmit(ev Event) {
	select {
	case c.events <- ev:
	default:
	}
}

// publish makes cn the connection requests use; the dispatcher calls it once
// the sync is queued, so the sync is the first frame of every connection.
func (c *Client) publish(cn *conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-cn.stop:
		return // already over; serve has unpublished or will not find it
	default:
	}
	c.mu.cur = cn
	close(c.mu.changed)
	c.mu.changed = make(chan struct{})
}

func (c *Client) unpublish(cn *conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.cur == cn {
		c.mu.cur = nil
		close(c.mu.changed)
		c.mu.changed = make(chan struct{})
	}
}

// waitConn returns the current connection, waiting for one if needed; it
// skips avoid, a connection that has just failed a request.
func (c *Client) waitConn(ctx context.Context, avoid *conn) (*conn, error) {
	for {
		c.mu.Lock()
		cur, changed, closed := c.mu.cur, c.mu.changed, c.mu.closed
		c.mu.Unlock()
		if cur != nil && cur != avoid {
			return cur, nil
		}
		if closed {
			return nil, ErrClosed
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.closedCh:
			return nil, ErrClosed
		}
	}
}

// Hello returns the hello of the current connection.
func (c *Client) Hello() (protocol.Hello, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.cur == nil {
		return protocol.Hello{}, false
	}
	return c.mu.cur.hello, true
}

// Close stops Run, waits for it to return and closes Events. Safe to call
// more than once and from any goroutine, including one reading Events.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.mu.closed = true
		running, cancel := c.mu.running, c.mu.cancel
		c.mu.Unlock()
		if running {
			cancel()
			return
		}
		close(c.closedCh)
		close(c.events)
		close(c.stopped)
	})
	<-c.stopped
	return nil
}

// LastSeq returns the highest seq of convID handed to the application (or
// loaded from the StateStore), and whether the client knows the
// conversation at all.
func (c *Client) LastSeq(convID uint64) (uint64, bool) { return c.position(convID) }

func (c *Client) position(convID uint64) (uint64, bool) {
	c.pos.Lock()
	defer c.pos.Unlock()
	seq, ok := c.pos.m[convID]
	return seq, ok
}

func (c *Client) setPosition(convID, seq uint64) {
	c.pos.Lock()
	defer c.pos.Unlock()
	if cur, ok := c.pos.m[convID]; !ok || seq > cur {
		c.pos.m[convID] = seq
	}
}

func (c *Client) positions() map[uint64]uint64 {
	c.pos.Lock()
	defer c.pos.Unlock()
	out := make(map[uint64]uint64, len(c.pos.m))
	for k, v := range c.pos.m {
		out[k] = v
	}
	return out
}

func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// NewClientMsgID returns a fresh client_msg_id: 16 random bytes, hex.
func NewClientMsgID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}
