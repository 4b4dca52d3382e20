package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-im/parley/protocol"
)

// Internal outcomes of one request attempt; the public methods turn them
// into retries or into ErrDisconnected / ErrTimeout.
var (
	errConnGone       = errors.New("connection ended")
	errAttemptTimeout = errors.New("no answer in time")
	errClientStopping = errors.New("client stopping")
	// errMoving ends a connection whose node sent goaway, once the delay it
	// asked for is over; the next attempt goes to the next gateway (with
	// one URL, to the same one, which a balancer may route elsewhere).
	errMoving = errors.New("node is draining (goaway)")
)

// pushQueue is how many pushes wait for the dispatcher before the reader
// starts dropping them (a var so tests can provoke an overflow cheaply).
var pushQueue = 1024

const (
	outboundQueue = 256 // frames waiting for the writer
	// defaultHeartbeat applies when the hello carries no heartbeat_ms.
	defaultHeartbeat = 25 * time.Second
	closeWriteWait   = time.Second
)

// dialError is a failed connection attempt.
type dialError struct {
	err        error
	permanent  bool          // retrying cannot help: Run stops
	retryAfter time.Duration // the server asked to wait this long (503)
}

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// wsURL is the connect URL of device at the gateway base.
func wsURL(base, device string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", err
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/ws"
	}
	q := u.Query()
	q.Set("device", device)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// dial opens a WebSocket to the gateway at base and reads the hello. It
// returns the token it used. stale is a token the server ended a
// connection for (expired or revoked) and why: dial refuses to use it
// again, so a fixed token, or a TokenFunc that hands out the same one,
// stops Run instead of being refused at every attempt.
func dial(ctx context.Context, cfg Config, base string, stale string, why error) (*websocket.Conn, *protocol.Hello, string, error) {
	token := cfg.Token
	if cfg.TokenFunc != nil {
		t, err := cfg.TokenFunc(ctx)
		if err != nil {
			return nil, nil, "", &dialError{err: fmt.Errorf("token: %w", err)}
		}
		token = t
	}
	if stale != "" && token == stale {
		return nil, nil, token, &dialError{err: fmt.Errorf("no new token after %w: %w", why, ErrUnauthorized), permanent: true}
	}
	ws, hello, err := dialWith(ctx, cfg, base, token)
	return ws, hello, token, err
}

// dialWith is dial with a token.
func dialWith(ctx context.Context, cfg Config, base, token string) (*websocket.Conn, *protocol.Hello, error) {
	target, err := wsURL(base, cfg.Device)
	if err != nil {
		return nil, nil, &dialError{err: fmt.Errorf("url: %w", err), permanent: true}
	}
	d := websocket.Dialer{HandshakeTimeout: cfg.RequestTimeout, Proxy: http.ProxyFromEnvironment, TLSClientConfig: cfg.TLSConfig}
	hdr := http.Header{"Authorization": {"Bearer " + token}}
	ws, resp, err := d.DialContext(ctx, target, hdr)
	if err != nil {
		if resp != nil {
			return nil, nil, handshakeError(resp, err)
		}
		return nil, nil, &dialError{err: fmt.Errorf("dial: %w", err)}
	}
	_ = ws.SetReadDeadline(time.Now().Add(cfg.RequestTimeout))
	_, data, err := ws.ReadMessage()
	if err != nil {
		ws.Close()
		return nil, nil, &dialError{err: fmt.Errorf("hello: %w", classifyReadErr(err))}
	}
	var f protocol.Frame
	if err := json.Unmarshal(data, &f); err != nil || f.Type != protocol.TypeHello || f.Hello == nil {
		ws.Close()
		return nil, nil, &dialError{err: fmt.Errorf("hello: first frame is %.100q, not a hello", data)}
	}
	return ws, f.Hello, nil
}

// handshakeError classifies an HTTP refusal of the upgrade.
func handshakeError(resp *http.Response, err error) error {
	defer resp.Body.Close()
	var body struct {
		Code       protocol.Code `json:"code"`
		Error      string        `json:"error"`
		RetryAfter int64         `json:"retry_after_ms"`
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	_ = json.Unmarshal(raw, &body)
	msg := body.Error
	if msg == "" {
		msg = err.Error()
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized:
		if body.Code == protocol.CodeTokenRevoked || body.Code == protocol.CodeTokenExpired {
			return &dialError{err: fmt.Errorf("dial: %w", &Error{Code: body.Code, Msg: msg}), permanent: true}
		}
		return &dialError{err: fmt.Errorf("dial: %s (%s): %w", msg, body.Code, ErrUnauthorized), permanent: true}
	case resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests:
		wait := time.Duration(body.RetryAfter) * time.Millisecond
		if wait == 0 {
			if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
				wait = time.Duration(s) * time.Second
			}
		}
		return &dialError{err: fmt.Errorf("dial: server overloaded: %s", msg), retryAfter: wait}
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		// A bad device, a wrong path, a forbidden user: the same request
		// will be refused again.
		code := body.Code
		if code == "" {
			code = protocol.CodeInvalidArgument
		}
		return &dialError{err: fmt.Errorf("dial: HTTP %d: %w", resp.StatusCode, &Error{Code: code, Msg: msg}), permanent: true}
	}
	return &dialError{err: fmt.Errorf("dial: HTTP %d: %s", resp.StatusCode, msg)}
}

// closeErrs are the sentinels of the close codes a client acts on.
var closeErrs = map[int]error{
	protocol.CloseReplaced:     ErrReplaced,
	protocol.CloseTokenExpired: ErrTokenExpired,
	protocol.CloseTokenRevoked: ErrTokenRevoked,
	protocol.CloseBanned:       ErrBanned,
	protocol.CloseDisconnected: ErrKicked,
}

// classifyReadErr names why the server ended the connection.
func classifyReadErr(err error) error {
	var ce *websocket.CloseError
	if errors.As(err, &ce) {
		if s, ok := closeErrs[ce.Code]; ok {
			return fmt.Errorf("closed by server (%d %s): %w", ce.Code, ce.Text, s)
		}
		return fmt.Errorf("closed by server (%d %s)", ce.Code, ce.Text)
	}
	return err
}

// pendingReq is a request waiting for the frame with its rid.
type pendingReq struct {
	cb    func(*protocol.Frame, error)
	timer *time.Timer
}

// conn is one live connection: a reader goroutine routing frames, a writer
// goroutine draining out and sending heartbeats, and the pending requests.
// fail ends it exactly once; after stop is closed, err says why.
type conn struct {
	// base is the server URL the connection was dialled at; the relative
	// URLs of uploads and downloads resolve against its HTTP origin.
	base string
	// leaving ends the connection after a goaway (errMoving, saying where
	// the client goes next: another gateway, or the same URL again).
	leaving error
	ws      *websocket.Conn
	hello   protocol.Hello
	log     *slog.Logger
	timeout time.Duration
	bo      backoff

	out    chan []byte          // to the writer; bounded
	pushes chan *protocol.Frame // msg, receipt, keys_low, presence and typing pushes, to the dispatcher
	// overflow is set when a push was dropped because pushes was full; the
	// dispatcher re-fetches once it has caught up.
	overflow atomic.Bool
	// leaveAt is when this connection is to be left (Unix ns) because its
	// node sent goaway: the server's delay plus jitter. 0 if none came.
	leaveAt atomic.Int64
	// leave hands the writer that delay, so it can end the connection then.
	leave chan time.Duration
	rid   atomic.Uint64
	disp  *dispatcher // set by serve before the goroutines start

	stop     chan struct{}
	stopOnce sync.Once
	err      error // written before stop is closed

	// mu guards the pending-request table.
	mu struct {
		sync.Mutex
		pending map[string]*pendingReq
		closed  bool
	}
}

func newConn(ws *websocket.Conn, hello protocol.Hello, cfg Config, bo backoff) *conn {
	cn := &conn{
		leaving: fmt.Errorf("%w: reconnecting", errMoving),
		ws:      ws,
		hello:   hello,
		log:     cfg.Logger,
		timeout: cfg.RequestTimeout,
		bo:      bo,
		out:     make(chan []byte, outboundQueue),
		pushes:  make(chan *protocol.Frame, pushQueue),
		leave:   make(chan time.Duration, 1),
		stop:    make(chan struct{}),
	}
	if len(cfg.URLs) > 1 {
		cn.leaving = fmt.Errorf("%w: moving to the next gateway", errMoving)
	}
	cn.mu.pending = make(map[string]*pendingReq)
	return cn
}

func (cn *conn) heartbeat() time.Duration {
	if cn.hello.HeartbeatMS > 0 {
		return time.Duration(cn.hello.HeartbeatMS) * time.Millisecond
	}
	return defaultHeartbeat
}

func (cn *conn) limits() protocol.Limits {
	l := cn.hello.Limits
	if l.MaxHistory <= 0 {
		l.MaxHistory = protocol.DefaultLimits.MaxHistory
	}
	if l.MaxSyncConvs <= 0 {
		l.MaxSyncConvs = protocol.DefaultLimits.MaxSyncConvs
	}
	return l
}

// fail ends the connection once: it records why, closes the socket (with a
// close frame when the client itself chose to leave) and fails every pending
// request with errConnGone so their callers can retry elsewhere.
func (cn *conn) fail(err error) {
	cn.stopOnce.Do(func() {
		cn.err = err
		close(cn.stop)
		if errors.Is(err, errClientStopping) || errors.Is(err, errMoving) {
			msg := websocket.FormatCloseMessage(websocket.CloseNormalClosure, err.Error())
			_ = cn.ws.WriteControl(websocket.CloseMessage, msg, time.Now().Add(closeWriteWait))
		}
		_ = cn.ws.Close()
		cn.mu.Lock()
		pending := cn.mu.pending
		cn.mu.pending = nil
		cn.mu.closed = true
		cn.mu.Unlock()
		for _, p := range pending {
			p.timer.Stop()
			p.cb(nil, errConnGone)
		}
	})
}

// request sends f with a fresh rid. Unless it returns an error, cb is called
// exactly once: with the answer, errAttemptTimeout or errConnGone (or never,
// after cancel). cb must not block: it may run on the reader goroutine.
func (cn *conn) request(ctx context.Context, f protocol.Frame, cb func(*protocol.Frame, error)) (string, error) {
	f.RID = strconv.FormatUint(cn.rid.Add(1), 36)
	data, err := json.Marshal(&f)
	if err != nil {
		return "", fmt.Errorf("encode %s: %w", f.Type, err)
	}
	rid := f.RID
	cn.mu.Lock()
	if cn.mu.closed {
		cn.mu.Unlock()
		return "", errConnGone
	}
	p := &pendingReq{cb: cb}
	p.timer = time.AfterFunc(cn.timeout, func() { cn.complete(rid, nil, errAttemptTimeout) })
	cn.mu.pending[rid] = p
	cn.mu.Unlock()
	select {
	case cn.out <- data:
		return rid, nil
	case <-cn.stop:
		return rid, nil // fail has called or is calling cb
	case <-ctx.Done():
		cn.cancel(rid)
		return "", ctx.Err()
	}
}

// complete hands the outcome of rid to its callback, once.
func (cn *conn) complete(rid string, f *protocol.Frame, err error) bool {
	cn.mu.Lock()
	p, ok := cn.mu.pending[rid]
	delete(cn.mu.pending, rid)
	cn.mu.Unlock()
	if !ok {
		return false
	}
	p.timer.Stop()
	p.cb(f, err)
	return true
}

// cancel forgets rid without calling its callback.
func (cn *conn) cancel(rid string) {
	cn.mu.Lock()
	p, ok := cn.mu.pending[rid]
	delete(cn.mu.pending, rid)
	cn.mu.Unlock()
	if ok {
		p.timer.Stop()
	}
}

// call is request for a caller that waits for the answer.
func (cn *conn) call(ctx context.Context, f protocol.Frame) (*protocol.Frame, error) {
	type result struct {
		f   *protocol.Frame
		err error
	}
	ch := make(chan result, 1)
	rid, err := cn.request(ctx, f, func(r *protocol.Frame, err error) { ch <- result{r, err} })
	if err != nil {
		return nil, err
	}
	select {
	case r := <-ch:
		return r.f, r.err
	case <-ctx.Done():
		cn.cancel(rid)
		return nil, ctx.Err()
	}
}

// enqueue sends a frame that expects no answer (delivered without rid).
func (cn *conn) enqueue(f protocol.Frame) {
	data, err := json.Marshal(&f)
	if err != nil {
		cn.log.Error("client: encode frame", "type", f.Type, "err", err)
		return
	}
	select {
	case cn.out <- data:
	case <-cn.stop:
	}
}

func (cn *conn) writeLoop() {
	t := time.NewTicker(cn.heartbeat())
	defer t.Stop()
	var leaveT *time.Timer
	var leaveC <-chan time.Time // nil until a goaway came
	defer func() {
		if leaveT != nil {
			leaveT.Stop()
		}
	}()
	ping := []byte(`{"type":"ping"}`)
	for {
		var data []byte
		select {
		case <-cn.stop:
			return
		case d := <-cn.leave:
			leaveT = time.NewTimer(d)
			leaveC = leaveT.C
			continue
		case <-leaveC:
			cn.fail(cn.leaving)
			return
		case data = <-cn.out:
		case <-t.C:
			data = ping
		}
		_ = cn.ws.SetWriteDeadline(time.Now().Add(cn.timeout))
		if err := cn.ws.WriteMessage(websocket.TextMessage, data); err != nil {
			cn.fail(fmt.Errorf("write: %w", err))
			return
		}
	}
}

// goAway handles the first goaway of the connection. The node keeps serving
// while it drains, so the connection stays in use until the delay the node
// asked for (plus jitter) is over and is then left for the next gateway.
// Leaving on our own, rather than waiting to be cut, lets the drain end
// early; the delay spreads the drained clients over time on the other nodes.
func (cn *conn) goAway(asked time.Duration) {
	d := cn.bo.after(asked)
	if !cn.leaveAt.CompareAndSwap(0, time.Now().Add(d).UnixNano()) {
		return
	}
	cn.log.Info("client: node is draining; will move", "delay", d)
	cn.leave <- d // capacity 1 and sent at most once: never blocks
}

func (cn *conn) readLoop() {
	// We ping every heartbeat and the server answers, so silence for a
	// heartbeat plus a request timeout means the path is dead even if TCP
	// has not noticed.
	idle := cn.heartbeat() + cn.timeout
	dropped, ridless := 0, 0
	for {
		_ = cn.ws.SetReadDeadline(time.Now().Add(idle))
		_, data, err := cn.ws.ReadMessage()
		if err != nil {
			cn.fail(fmt.Errorf("read: %w", classifyReadErr(err)))
			return
		}
		f := new(protocol.Frame)
		if err := json.Unmarshal(data, f); err != nil {
			cn.log.Warn("client: undecodable frame", "err", err)
			continue
		}
		if f.RID != "" {
			cn.complete(f.RID, f, nil)
			continue
		}
		switch f.Type {
		case protocol.TypeMsg, protocol.TypeReactions, protocol.TypeReceipt, protocol.TypeKeysLow, protocol.TypePresence, protocol.TypeTyping, protocol.TypeConvMute, protocol.TypeDND:
			if f.Type == protocol.TypeMsg && f.Message == nil {
				continue
			}
			select {
			case cn.pushes <- f:
				dropped = 0
			default:
				// The application is behind. Blocking here would also
				// stall the answers to its own requests, so drop and let
				// the dispatcher re-fetch once it has caught up.
				if dropped == 0 {
					cn.log.Warn("client: event queue full, dropping pushes until the application catches up")
				}
				dropped++
				cn.overflow.Store(true)
			}
		case protocol.TypeGoAway:
			cn.goAway(time.Duration(max(f.RetryAfter, 0)) * time.Millisecond)
		case protocol.TypeError:
			// These answer frames sent without rid (delivered); one bad
			// conversation can produce one per flush, so log sparingly.
			if ridless%100 == 0 {
				cn.log.Warn("client: server error without request id", "code", string(f.Code), "err", f.Error, "count", ridless+1)
			}
			ridless++
		}
	}
}
