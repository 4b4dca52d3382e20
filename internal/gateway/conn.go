package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/parley-im/parley/third_party/nbio/nbhttp/websocket"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/internal/bus"
	"github.com/parley-im/parley/internal/registry"
	"github.com/parley-im/parley/protocol"
)

// maxBadFrames consecutive bad frames close the connection with
// CloseTooManyErrors: a client that only sends garbage gets cut off.
const maxBadFrames = 10

func timeMS(ms int64) time.Time { return time.UnixMilli(ms) }

func (g *Gateway) newUpgrader() *websocket.Upgrader {
	u := websocket.NewUpgrader()
	configureUpgrader(u, g.cfg)
	// Offered beside bearer.<token> (BearerToken): selecting it is what
	// lets a browser accept the upgrade; the token is never echoed.
	u.Subprotocols = []string{protocol.Subprotocol}
	// Tokens travel in a header or the query, never in cookies, so a
	// cross-origin page cannot ride on a user's session.
	u.CheckOrigin = func(*http.Request) bool { return true }
	u.SetPingHandler(func(c *websocket.Conn, data string) {
		if s, ok := c.Session().(*session); ok && s != nil {
			s.lastSeen.Store(g.now().UnixMilli())
			if !s.deadlineCleared.Swap(true) {
				_ = c.SetReadDeadline(time.Time{})
			}
			// In blocking mode the pong goes behind the session's frames, so
			// it never lands inside one written in part.
			if tr, ok := s.tr.(wsTransport); ok && tr.bw != nil {
				tr.bw.control(newControlFrame(websocket.PongMessage, []byte(data)))
				return
			}
		}
		_ = c.WriteMessage(websocket.PongMessage, []byte(data))
	})
	u.OnMessage(g.onMessage)
	u.OnClose(g.onClose)
	return u
}

// httpError writes a handshake refusal as JSON.
func httpError(w http.ResponseWriter, status int, code protocol.Code, msg string, retryAfter time.Duration) {
	w.Header().Set("Content-Type", "application/json")
	body := map[string]any{"code": code, "error": msg}
	if retryAfter > 0 {
		secs := int((retryAfter + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		body["retry_after_ms"] = retryAfter.Milliseconds()
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// BearerToken returns the token of an Authorization: Bearer header, or of
// the token query parameter.
func BearerToken(r *http.Request) string {
	if h := r.Header.Get("Authorization"); len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(h, ",") {
			if p = strings.TrimSpace(p); strings.HasPrefix(p, protocol.BearerSubprotocolPrefix) {
				return p[len(protocol.BearerSubprotocolPrefix):]
			}
		}
	}
	return r.URL.Query().Get("token")
}

// Authenticate verifies the request's token; on failure it writes the
// refusal and returns ok=false.
func Authenticate(v Verifier, w http.ResponseWriter, r *http.Request, now time.Time) (auth.Identity, bool) {
	id, reason := authenticate(v, w, r, now)
	return id, reason == ""
}

// authenticate is Authenticate returning why it refused: no_token,
// token_expired or bad_token ("" when it did not).
func authenticate(v Verifier, w http.ResponseWriter, r *http.Request, now time.Time) (auth.Identity, string) {
	tok := BearerToken(r)
	if tok == "" {
		httpError(w, http.StatusUnauthorized, protocol.CodeUnauthorized, "no token: send Authorization: Bearer or ?token=", 0)
		return auth.Identity{}, "no_token"
	}
	id, err := v.Verify(tok, now)
	switch {
	case errors.Is(err, auth.ErrExpired):
		httpError(w, http.StatusUnauthorized, protocol.CodeTokenExpired, "token expired", 0)
		return id, "token_expired"
	case err != nil:
		httpError(w, http.StatusUnauthorized, protocol.CodeUnauthorized, "invalid token", 0)
		return id, "bad_token"
	}
	return id, ""
}

// ServeHTTP upgrades GET /v1/ws?device=ID to a WebSocket after admission
// control and authentication.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, device, ok := g.admitRequest(w, r, false)
	if !ok {
		return
	}
	conn, err := g.up.Upgrade(w, r, nil)
	if err != nil {
		g.observeHandshake("upgrade_failed")
		return
	}
	g.edge.ws.Add(1)
	s := g.newSession(id.User, device, nil)
	s.expiresMS = expiresMS(id)
	s.iatMS = issuedMS(id)
	s.tr = newWSTransport(conn, g.cfg.OutboundQueueBytes)
	conn.SetSession(s)
	g.open(s)
}

// admitRequest authenticates a new session's request and checks its
// device, then runs admission control; on refusal it has written the
// answer. Authentication comes first so that requests with bad tokens
// never spend the handshake budget of valid ones: they get 401, not 503.
func (g *Gateway) admitRequest(w http.ResponseWriter, r *http.Request, poll bool) (auth.Identity, string, bool) {
	now := g.now()
	id, reason := g.authenticate(w, r, now)
	if reason != "" {
		if reason == "token_expired" {
			g.observeHandshake("expired")
		} else {
			g.observeHandshake("unauthorized")
		}
		return id, "", false
	}
	device := r.URL.Query().Get("device")
	if !protocol.ValidID(device) {
		g.observeHandshake("bad_request")
		g.logRefusal(slog.LevelInfo, "bad_device", r, id.User)
		httpError(w, http.StatusBadRequest, protocol.CodeInvalidArgument, "device must be 1-64 bytes of [A-Za-z0-9._@-]", 0)
		return id, "", false
	}
	if err := id.CheckDevice(device); err != nil {
		g.observeHandshake("bad_request")
		g.logRefusal(slog.LevelInfo, "device_not_in_token", r, id.User)
		httpError(w, http.StatusBadRequest, protocol.CodeInvalidArgument, "device does not match the token", 0)
		return id, "", false
	}
	if !g.Authorize(w, r, id, device) {
		return auth.Identity{}, "", false
	}
	if !g.sessionCap(w, r, id.User, device, poll) {
		return auth.Identity{}, "", false
	}
	if g.draining.Load() {
		g.logRefusal(slog.LevelInfo, "draining", r, id.User)
		g.refuse(w, "draining", protocol.CodeOverloaded, "node is draining; connect to another node", time.Second+rand.N(4*time.Second))
		return auth.Identity{}, "", false
	}
	if g.full() {
		g.logRefusal(slog.LevelWarn, "full", r, id.User)
		g.refuse(w, "full", protocol.CodeOverloaded, "node is full", time.Second+rand.N(4*time.Second))
		return auth.Identity{}, "", false
	}
	if ok, wait := g.admit.take(now); !ok {
		// Jitter spreads a reconnect storm over time instead of
		// synchronising everyone on the same retry instant.
		g.logRefusal(slog.LevelWarn, "rate_limited", r, id.User)
		g.refuse(w, "rate_limited", protocol.CodeOverloaded, "too many handshakes; retry later", wait+rand.N(2*time.Second))
		return auth.Identity{}, "", false
	}
	return id, device, true
}

func (g *Gateway) newSession(user, device string, tr transport) *session {
	now := g.now()
	s := &session{g: g, id: g.sessionPrefix + "-" + strconv.FormatUint(g.nextID.Add(1), 36), user: user, device: device, tr: tr, opened: now}
	s.lastSeen.Store(now.UnixMilli())
	return s
}

// open makes s live: counted, indexed for pushes, greeted, and registered
// in the session registry (replacing an older session of the device).
func (g *Gateway) open(s *session) {
	now := g.now()
	g.conns.Add(1)
	if g.obs.Connections != nil {
		g.obs.Connections(1)
	}
	g.observeHandshake("ok")
	transport := "ws"
	if _, ok := s.tr.(*mailbox); ok {
		transport = "poll"
	}
	g.logOpen(s, transport)
	// Indexed, registered and online before the hello, so a client holding
	// its hello is routable; pushes are held back until the hello is out
	// (hello is the first frame), and those skipped precede the client's
	// first sync, which brings them.
	g.add(s)
	// A ban or revocation applied between the handshake's check and the
	// add above found no session to close: check again now that the
	// session is indexed (Enforce runs after the list changes).
	if g.refusal(s) != nil {
		g.enforce(s)
	}
	ctx, cancel := context.WithTimeout(g.ctx, g.cfg.RequestTimeout)
	defer cancel()
	old, err := g.reg.Register(ctx, registry.Entry{User: s.user, Device: s.device, Node: g.cfg.Node, Session: s.id, Since: now.UnixMilli()})
	if err != nil {
		g.log.Error("registry register failed", "user", s.user, "err", err)
		s.close(protocol.CloseInternal, "registry unavailable")
		return
	}
	if old != nil {
		g.kick(ctx, old)
	}
	g.presence.Connected(ctx, s.user)
	s.present.Store(true)
	s.writeFrame(&protocol.Frame{Type: protocol.TypeHello, Hello: &protocol.Hello{
		Protocol: protocol.Version, SessionID: s.id, UserID: s.user, DeviceID: s.device, Node: g.cfg.Node,
		ServerTime: now.UnixMilli(), HeartbeatMS: g.cfg.HeartbeatInterval.Milliseconds(),
		IdleTimeoutMS: g.cfg.IdleTimeout.Milliseconds(), Limits: g.cfg.Limits,
		MaxFileBytes: g.cfg.MaxFileBytes, PartBytes: g.cfg.PartBytes, WebPushKey: g.cfg.WebPushKey,
		Reactions: g.cfg.Reactions, MaxReactionsPerUser: g.cfg.ReactionsPerUser,
	}})
	s.greeted.Store(true)
}

func (g *Gateway) refuse(w http.ResponseWriter, result string, code protocol.Code, msg string, after time.Duration) {
	g.observeHandshake(result)
	httpError(w, http.StatusServiceUnavailable, code, msg, after)
}

func (g *Gateway) observeHandshake(result string) {
	if g.obs.Handshake != nil {
		g.obs.Handshake(result)
	}
}

// kick closes the session a newer connection of the same device replaced.
func (g *Gateway) kick(ctx context.Context, old *registry.Entry) {
	if old.Node == g.cfg.Node {
		for _, s := range g.sessionsOf(old.User) {
			if s.id == old.Session {
				s.close(protocol.CloseReplaced, "replaced by a newer connection of this device")
			}
		}
		return
	}
	err := g.bus.Publish(ctx, old.Node, bus.Delivery{Kick: &bus.Kick{User: old.User, Device: old.Device, Session: old.Session}})
	switch {
	case errors.Is(err, bus.ErrNoSubscriber):
		// The old node is gone, and its session with it: the usual case
		// when clients move after a gateway died. Not worth a log line per
		// connection.
	case err != nil:
		g.log.Warn("kick of replaced session failed", "node", old.Node, "err", err)
	}
}

func (g *Gateway) onClose(c *websocket.Conn, _ error) {
	g.edge.ws.Add(-1)
	s, ok := c.Session().(*session)
	if !ok || s == nil {
		return
	}
	g.gone(s)
}

// gone forgets a session whose transport has ended.
func (g *Gateway) gone(s *session) {
	s.closed.Store(true)
	if !g.remove(s) {
		return
	}
	g.conns.Add(-1)
	if g.obs.Connections != nil {
		g.obs.Connections(-1)
	}
	g.logClose(s)
	g.presence.Unwatch(s)
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.RequestTimeout)
	defer cancel()
	if err := g.reg.Unregister(ctx, s.user, s.device, s.id); err != nil {
		g.log.Warn("registry unregister failed", "user", s.user, "err", err)
	}
	// After the registry: in cluster mode presence is read from it.
	if s.present.Load() {
		g.presence.Disconnected(s.user)
	}
}

// onMessage handles one client frame. nbio runs a connection's frames one at
// a time, in order, on its worker pool, so a request may block on the durable
// write without stalling other connections.
func (g *Gateway) onMessage(c *websocket.Conn, mt websocket.MessageType, data []byte) {
	s, ok := c.Session().(*session)
	if !ok || s == nil || s.closed.Load() {
		return
	}
	s.lastSeen.Store(g.now().UnixMilli())
	if !s.deadlineCleared.Swap(true) {
		_ = c.SetReadDeadline(time.Time{})
	}
	if mt != websocket.TextMessage {
		s.close(protocol.CloseUnsupportedData, "frames are JSON text")
		return
	}
	g.handleFrame(s, data, s.writeFrame, true)
}

// framePool holds the frames that acks and pings are decoded into: they are
// most of what clients send (one per push with per-push acks), and nothing
// keeps such a frame after its request (both are answered synchronously).
var framePool = sync.Pool{New: func() any { return new(protocol.Frame) }}

// reusable reports whether a decoded frame of type typ goes back to
// framePool after its request.
func reusable(typ string) bool {
	return typ == protocol.TypeDelivered || typ == protocol.TypePing
}

// handleFrame decodes and runs one client frame of s, answering through
// reply (the session's transport, or an HTTP response). With pipelined
// (a WebSocket's frames, the backend a Batcher) a send may return before
// its answer (pipe.go); every other frame's answer waits for the sends
// before it.
func (g *Gateway) handleFrame(s *session, data []byte, reply func(*protocol.Frame), pipelined bool) {
	into := framePool.Get().(*protocol.Frame)
	f, perr := protocol.DecodeClientInto(data, g.cfg.Limits, into)
	if f != into {
		framePool.Put(into) // untouched: still zero
	} else if reusable(f.Type) {
		defer func() {
			*into = protocol.Frame{}
			framePool.Put(into)
		}()
	}
	if perr != nil {
		rid := ""
		if f != nil {
			rid = f.RID
		}
		if g.obs.Error != nil {
			g.obs.Error(perr.Code)
		}
		s.drained()
		reply(protocol.ErrorFrame(rid, perr))
		if s.badFrames.Add(1) >= maxBadFrames {
			s.close(protocol.CloseTooManyErrors, "too many bad frames")
		}
		return
	}
	s.badFrames.Store(0)
	if g.obs.FrameIn != nil {
		g.obs.FrameIn(f.Type)
	}
	if f.Type == protocol.TypeDelivered {
		if len(f.Positions) == 0 {
			s.ack(f.ConvID, f.Seq)
		} else {
			s.ackMany(f.Positions)
		}
	}
	if perr := g.admitFrame(s, f); perr != nil {
		if g.obs.Error != nil {
			g.obs.Error(perr.Code)
		}
		s.drained()
		reply(protocol.ErrorFrame(f.RID, perr))
		return
	}
	if b, ok := g.backend.(Batcher); ok && pipelined && f.Type == protocol.TypeSend && f.ConvID != 0 {
		g.pipeSend(b, s, f, reply)
		return
	}
	if f.Type != protocol.TypeDelivered || f.RID != "" {
		// An acknowledgement without rid has no answer to keep in
		// order, and what it records is not what the sends in flight
		// write: it is not held behind them.
		s.drained()
	}
	ctx := g.requestContext()
	if f.Type == protocol.TypeSync {
		if perr := g.AdmitSync(); perr != nil {
			if g.obs.Error != nil {
				g.obs.Error(perr.Code)
			}
			reply(protocol.ErrorFrame(f.RID, perr))
			return
		}
	}
	if f.Type == protocol.TypePresenceSub {
		reply(g.watch(ctx, s, f))
		return
	}
	// History and sync answers are paged to half the outbound bound on
	// every transport (page.go): a larger one would overflow the queue
	// and drop a connection that reads. f may be reused once Handle
	// returns; the answer may come later.
	paged, forward := f.Type == protocol.TypeHistory || f.Type == protocol.TypeSync, f.AfterSeq != nil
	g.backend.Handle(ctx, protocol.Caller{User: s.user, Device: s.device}, f, func(resp *protocol.Frame) {
		if resp.Type == protocol.TypeError && g.obs.Error != nil {
			g.obs.Error(resp.Code)
		}
		if paged {
			g.fitAnswer(resp, forward)
		}
		reply(resp)
	})
}

// requestContext returns the context that bounds one request to the
// backend: it ends at most RequestTimeout after the call (and at least
// RequestTimeout less one slice, 1/20 of it and at most 50 ms), or when the
// gateway stops. Requests starting in the same slice share one context,
// so a request costs no context and no timer of its own: with an ack per
// push, those were a fifth of the bytes the node allocated.
func (g *Gateway) requestContext() context.Context {
	now := time.Now().UnixNano()
	if rc := g.reqCtx.Load(); rc != nil && now < rc.until {
		return rc.ctx
	}
	slice := min(50*time.Millisecond, g.cfg.RequestTimeout/20)
	start := time.Now()
	ctx, cancel := context.WithDeadline(g.ctx, start.Add(g.cfg.RequestTimeout))
	// cancel is kept only to release the timer early; the deadline does
	// so anyway once the slice's last request is long done.
	g.reqCtx.Store(&sharedCtx{ctx: ctx, cancel: cancel, until: start.Add(slice).UnixNano()})
	return ctx
}

// sharedCtx is the request context of one slice of time.
type sharedCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
	until  int64 // unix ns: requests from then on get a newer context
}

// watch replaces the users s watches for presence, after checking it may
// see each of them (only users it shares a conversation with).
func (g *Gateway) watch(ctx context.Context, s *session, f *protocol.Frame) *protocol.Frame {
	for _, u := range f.Users {
		ok, err := g.mayWatch(ctx, s.user, u)
		if err != nil {
			return protocol.ErrorFrame(f.RID, protocol.Errorf(protocol.CodeStoreUnavailable, "presence check failed; retry"))
		}
		if !ok {
			return protocol.ErrorFrame(f.RID, protocol.Errorf(protocol.CodeNotMember, "you share no conversation with %s", u))
		}
	}
	states, err := g.presence.Watch(ctx, s, f.Users)
	if err != nil {
		return protocol.ErrorFrame(f.RID, protocol.Errorf(protocol.CodeStoreUnavailable, "presence read failed; retry"))
	}
	resp := &protocol.Frame{Type: protocol.TypePresence, RID: f.RID, States: states}
	resp.FillLists()
	return resp
}

// AdmitSync takes a token for one offline pull (a sync frame or an HTTP
// snapshot): after a mass reconnect, pulls queue up client-side with
// jittered retry-after instead of all hitting the store at once.
func (g *Gateway) AdmitSync() *protocol.Error {
	ok, wait := g.syncs.take(g.now())
	if ok {
		return nil
	}
	return &protocol.Error{Code: protocol.CodeOverloaded, Msg: "too many sync requests; retry later",
		RetryAfter: (wait + rand.N(time.Second)).Milliseconds() + 1}
}
