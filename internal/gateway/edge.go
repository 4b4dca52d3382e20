package gateway

import (
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"

	"github.com/parley-im/parley/third_party/nbio/mempool"
	"github.com/parley-im/parley/third_party/nbio/nbhttp"
	"github.com/parley-im/parley/third_party/nbio/nbhttp/websocket"

	"github.com/parley-im/parley/protocol"
)

// The edge: what one TCP connection may make the node hold before its
// request is authenticated, and how connections still in their HTTP phase
// count toward the node's cap. The parser enforces the head and body
// bounds and their deadlines (third_party/nbio, patches H1–H5); the
// gateway counts connections by phase.

// readSlack is what the parser may hold beyond a maximal head and body:
// one read of the socket and the next frame's header.
const readSlack = 64 << 10

// EngineConfig returns the settings of the event loop that serves h on ln
// with cfg's limits. The node and the WebSocket conformance tests both
// build their engine from it, so the tests run the code that ships.
func EngineConfig(cfg Config, ln net.Listener, h http.Handler) nbhttp.Config {
	return nbhttp.Config{
		Network: "tcp",
		Addrs:   []string{ln.Addr().String()},
		Listen:  func(string, string) (net.Listener, error) { return ln, nil },
		Handler: h,
		// Beyond this many TCP connections nbio refuses at accept; Parley
		// answers 503 well before (see admitRequest).
		MaxLoad:                      cfg.MaxConnections + cfg.MaxPendingConnections,
		ReleaseWebsocketPayload:      true,
		MaxWriteBufferSize:           cfg.OutboundQueueBytes,
		MaxWebsocketFramePayloadSize: cfg.Limits.MaxFrameBytes,
		// One buffer per event loop (not per connection): a read of the
		// socket takes up to 64 KiB (readSlack), so an upload's body
		// arrives in 64 KiB reads, not 4 KiB ones.
		ReadBufferSize: readSlack,
		IOMod:          nbhttp.IOModNonBlocking,
		// Plain GC-managed buffers: nbio's pooled allocator corrupts frames
		// under concurrent connections in v1.6.7–1.6.8 (nbio issue #490;
		// reproduced here by internal/e2e). Idle connections hold no
		// buffers either way, so the per-connection cost is unchanged.
		BodyAllocator: mempool.NewSTD(),
		// A request head must arrive within HeaderTimeout of the connection
		// opening or of the previous response; its body within BodyTimeout
		// of the head. Late: 408 if part came, else a silent close.
		KeepaliveTime:   cfg.HeaderTimeout,
		BodyReadTimeout: cfg.BodyTimeout,
		MaxHeaderBytes:  cfg.MaxHeaderBytes,
		// The only request body is POST /v1/rpc's one frame; a larger
		// Content-Length (or chunk) is answered 413 before it is read.
		MaxHTTPBodySize: cfg.Limits.MaxFrameBytes,
		ReadLimit:       cfg.MaxHeaderBytes + cfg.Limits.MaxFrameBytes + readSlack,
		ErrorBody:       edgeErrorBody,
		// Request handlers run on workers that outlive one task
		// (executor.go).
		ServerExecutor: newExecutor(func(msg string, args ...any) { slog.Error(msg, args...) }).Go,
	}
}

// edgeErrorBody renders the parser's own refusals like every other HTTP
// error of the node: {"code","error"}.
func edgeErrorBody(status int, _ error) (string, []byte) {
	var code protocol.Code
	var msg string
	switch status {
	case http.StatusRequestHeaderFieldsTooLarge:
		code, msg = protocol.CodeTooLarge, "request line and headers over gateway.max_header_bytes"
	case http.StatusRequestEntityTooLarge:
		code, msg = protocol.CodeTooLarge, "request body over limits.max_frame_bytes"
	case http.StatusRequestTimeout:
		code, msg = protocol.CodeTimeout, "request not received in time (gateway.header_timeout, gateway.body_timeout)"
	default:
		code, msg = protocol.CodeInvalidArgument, "malformed HTTP request"
	}
	b, _ := json.Marshal(map[string]any{"code": code, "error": msg})
	return "application/json", append(b, '\n')
}

// configureUpgrader applies the gateway's transport settings to u: the
// message bound, no per-connection timers, payload buffers released after
// each message, and no write queue of nbio's in blocking mode.
func configureUpgrader(u *websocket.Upgrader, cfg Config) {
	// The sweeper owns the idle timeout, so no per-connection timers.
	u.KeepaliveTime = 0
	u.MessageLengthLimit = cfg.Limits.MaxFrameBytes
	u.ReleasePayload = true
	// Blocking mode (race-detector builds): the session's frames go
	// through the gateway's own byte-bounded queue (blockingWriter), so
	// nbio's frame-counted queue is off and nbio writes its few control
	// frames synchronously on the connection's read goroutine.
	u.BlockingModAsyncWrite = false
}

// edgeCounters count the node's connections by phase. pending is what
// counts toward MaxConnections besides sessions: TCP connections that are
// neither WebSockets nor in a request being handled (partial handshakes,
// idle keep-alive connections).
type edgeCounters struct {
	tcp      atomic.Int64 // accepted by the event loop, not yet closed
	ws       atomic.Int64 // upgraded to a WebSocket, not yet closed
	inflight atomic.Int64 // HTTP requests being handled
}

func (e *edgeCounters) pending() int64 {
	return max(0, e.tcp.Load()-e.ws.Load()-e.inflight.Load())
}

// Attach makes the gateway count engine's connections toward its cap.
func (g *Gateway) Attach(engine *nbhttp.Engine) {
	engine.OnOpen(func(net.Conn) { g.edge.tcp.Add(1) })
	engine.OnClose(func(net.Conn, error) { g.edge.tcp.Add(-1) })
}

// Track wraps the node's HTTP handler so that connections whose request is
// being handled (a long poll, an upgrade) are not counted as pending.
func (g *Gateway) Track(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.edge.inflight.Add(1)
		defer g.edge.inflight.Add(-1)
		h.ServeHTTP(w, r)
	})
}

// Pending is the number of TCP connections that count toward the cap
// without being sessions (partial handshakes, idle keep-alive).
func (g *Gateway) Pending() int { return int(g.edge.pending()) }

// full reports whether the node is at its connection cap, counting
// partial handshakes with sessions.
func (g *Gateway) full() bool {
	return g.conns.Load()+g.edge.pending() >= int64(g.cfg.MaxConnections)
}

// StdServer returns a net/http server with the same head bounds, for the
// race-detector builds (see internal/server).
func StdServer(cfg Config, h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: cfg.HeaderTimeout, MaxHeaderBytes: cfg.MaxHeaderBytes,
		IdleTimeout: cfg.HeaderTimeout, ReadTimeout: cfg.HeaderTimeout + cfg.BodyTimeout}
}
