package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-im/parley/internal/auth"
)

// IdleClientConfig configures one idle-client process of the idle
// benchmark.
type IdleClientConfig struct {
	Addr    string // the node, host:port
	DataDir string // the node's data directory, for its development key
	LocalIP string // source address of every connection, e.g. 127.0.0.11
	Prefix  string // user ids are Prefix + a counter, unique per process
	// Concurrency bounds handshakes in flight.
	Concurrency int
	Logger      *slog.Logger
}

// DefaultIdleClientConfig returns the defaults of the optional fields.
func DefaultIdleClientConfig() IdleClientConfig {
	return IdleClientConfig{Concurrency: 32, Logger: slog.Default()}
}

// Validate reports a configuration the client cannot run with.
func (c IdleClientConfig) Validate() error {
	var errs []error
	if c.Addr == "" {
		errs = append(errs, errors.New("addr is required"))
	}
	if c.DataDir == "" {
		errs = append(errs, errors.New("data dir is required"))
	}
	if c.LocalIP != "" && net.ParseIP(c.LocalIP) == nil {
		errs = append(errs, fmt.Errorf("local ip %q is not an IP address", c.LocalIP))
	}
	if c.Prefix == "" {
		errs = append(errs, errors.New("prefix is required"))
	}
	if c.Concurrency < 1 {
		errs = append(errs, fmt.Errorf("concurrency must be positive, got %d", c.Concurrency))
	}
	if c.Logger == nil {
		errs = append(errs, errors.New("logger is required"))
	}
	return errors.Join(errs...)
}

// The idle-client speaks a line protocol with the benchmark on stdin and
// stdout: the benchmark writes "add N", the client opens N more connections
// and answers "ok OPENED LIVE" (connections opened so far, and how many of
// them the server has not closed) or "err MESSAGE". End of input means the
// benchmark is done: the client closes everything and exits.
const (
	cmdAdd  = "add"
	respOK  = "ok"
	respErr = "err"
)

// RunIdleClient holds idle authenticated connections to a node as directed
// on in, pinging each every heartbeat so the node keeps it. It returns when
// in ends or ctx is done, after closing every connection.
func RunIdleClient(ctx context.Context, cfg IdleClientConfig, in io.Reader, out io.Writer) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("idle client: %w", err)
	}
	key, err := auth.LoadHS256KeyFile(filepath.Join(cfg.DataDir, auth.DevKeyFile))
	if err != nil {
		return fmt.Errorf("idle client: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ic := &idleClient{cfg: cfg, d: newDialer(cfg.Addr, key, net.ParseIP(cfg.LocalIP), 512)}
	defer ic.closeAll()

	pingDone := make(chan struct{})
	go func() {
		defer close(pingDone)
		ic.pingLoop(ctx)
	}()
	defer func() { cancel(); <-pingDone }()

	serveCommands(ctx, in, out, func(line string) (string, error) {
		verb, arg, _ := strings.Cut(line, " ")
		n, err := strconv.Atoi(arg)
		if verb != cmdAdd || err != nil || n < 0 {
			return "", fmt.Errorf("bad command %q", line)
		}
		if err := ic.add(ctx, n); err != nil {
			return "", err
		}
		return fmt.Sprintf("%s %d %d", respOK, ic.opened(), ic.live.Load()), nil
	})
	return nil
}

type idleClient struct {
	cfg IdleClientConfig
	d   *dialer

	// heartbeat is the node's announced ping interval in ns (0 until the
	// first hello).
	heartbeat atomic.Int64
	live      atomic.Int64
	readers   sync.WaitGroup

	mu struct {
		sync.Mutex
		conns []*idleConn
	}
}

type idleConn struct {
	ws     *websocket.Conn
	user   string
	opened time.Time
	closed atomic.Bool
}

func (ic *idleClient) opened() int {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	return len(ic.mu.conns)
}

// add opens n connections, Concurrency at a time. It stops at the first
// connection that cannot be opened: a benchmark that quietly holds fewer
// connections than asked would report a wrong slope.
func (ic *idleClient) add(ctx context.Context, n int) error {
	base := ic.opened()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	for range min(ic.cfg.Concurrency, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) || ctx.Err() != nil {
					return
				}
				user := ic.cfg.Prefix + strconv.Itoa(base+int(i))
				if err := ic.open(ctx, user); err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	return firstErr
}

func (ic *idleClient) open(ctx context.Context, user string) error {
	ws, hello, err := ic.d.dial(ctx, user, "d1")
	if err != nil {
		return err
	}
	ic.heartbeat.Store(int64(time.Duration(hello.HeartbeatMS) * time.Millisecond))
	c := &idleConn{ws: ws, user: user, opened: time.Now()}
	ic.live.Add(1)
	ic.readers.Add(1)
	go ic.read(c)
	ic.mu.Lock()
	ic.mu.conns = append(ic.mu.conns, c)
	ic.mu.Unlock()
	return nil
}

// read drains pongs; a read error means the server closed the connection,
// which the live count then shows to the benchmark.
func (ic *idleClient) read(c *idleConn) {
	defer ic.readers.Done()
	for {
		if _, _, err := c.ws.NextReader(); err != nil {
			ic.live.Add(-1)
			if !c.closed.Load() {
				ic.cfg.Logger.Warn("idle connection closed by server", "user", c.user, "age", time.Since(c.opened).Round(time.Millisecond), "err", err)
			}
			return
		}
	}
}

// pingTick is how often pingLoop wakes. Each wake pings the slice of
// connections due, so pings spread evenly over the heartbeat instead of
// arriving at the node in one burst per interval.
const pingTick = 100 * time.Millisecond

var pingFrame = []byte(`{"type":"ping"}`)

func (ic *idleClient) pingLoop(ctx context.Context) {
	t := time.NewTicker(pingTick)
	defer t.Stop()
	cursor := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		hb := time.Duration(ic.heartbeat.Load())
		if hb <= 0 {
			continue
		}
		ic.mu.Lock()
		conns := ic.mu.conns
		ic.mu.Unlock()
		if len(conns) == 0 {
			continue
		}
		batch := (len(conns)*int(pingTick) + int(hb) - 1) / int(hb)
		for range batch {
			cursor %= len(conns)
			c := conns[cursor]
			cursor++
			if c.closed.Load() {
				continue
			}
			_ = c.ws.SetWriteDeadline(time.Now().Add(5 * time.Second))
			// A failed write surfaces as a read error on the reader.
			_ = c.ws.WriteMessage(websocket.TextMessage, pingFrame)
		}
	}
}

// closeAll closes every connection and waits for the readers. Called after
// the ping loop has stopped, so no write races the close.
func (ic *idleClient) closeAll() {
	ic.mu.Lock()
	conns := ic.mu.conns
	ic.mu.conns = nil
	ic.mu.Unlock()
	for _, c := range conns {
		c.closed.Store(true)
		c.ws.Close()
	}
	ic.readers.Wait()
}
