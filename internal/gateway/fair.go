package gateway

import (
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/protocol"
)

// Fair sharing between users: a node admits each user's sends (send, edit,
// recall) through a token bucket of its own, each connection's requests
// through another, and caps how many sessions one user holds. One user on
// many connections can no longer take the chat tier from the others; over
// a limit the request answers rate_limited with retry_after_ms.
//
// The per-user buckets are node-local (a user's devices on two nodes have
// two budgets); they are dropped once full again, so an idle user costs
// nothing. A connection's bucket is allocated on its first request other
// than ping and delivered, so idle connections carry none.

// isSend reports whether f stores a message (and so spends the user's send
// budget).
func isSend(typ string) bool {
	return typ == protocol.TypeSend || typ == protocol.TypeEdit || typ == protocol.TypeRecall || typ == protocol.TypeReact
}

// limited reports whether f is counted against the connection's request
// budget: heartbeats and delivery acks are not (a busy receiver acks every
// push; they cost the node little).
func limited(typ string) bool {
	return typ != protocol.TypePing && typ != protocol.TypeDelivered
}

// userBuckets holds the per-user send buckets, sharded by user.
type userBuckets struct {
	shards [64]struct {
		mu sync.Mutex
		m  map[string]*bucket // guarded by mu
	}
}

func (u *userBuckets) take(g *Gateway, user string, rate float64, burst int, now time.Time) (bool, time.Duration) {
	sh := &u.shards[g.shardIndex(user)]
	sh.mu.Lock()
	b := sh.m[user]
	if b == nil {
		if sh.m == nil {
			sh.m = make(map[string]*bucket)
		}
		b = newBucket(rate, burst, now)
		sh.m[user] = b
	}
	sh.mu.Unlock()
	return b.take(now)
}

// sweep drops the buckets that have refilled: their users are idle.
func (u *userBuckets) sweep(now time.Time) {
	for i := range u.shards {
		sh := &u.shards[i]
		sh.mu.Lock()
		for user, b := range sh.m {
			if b.full(now) {
				delete(sh.m, user)
			}
		}
		sh.mu.Unlock()
	}
}

// maxLimitedRun consecutive rate_limited answers close the connection with
// CloseRateLimited: a client that ignores retry_after_ms would otherwise
// keep the node decoding and refusing its requests as fast as it sends
// them; it has to reconnect, which the handshake budget and the session
// caps bound.
const maxLimitedRun = 100

// admitFrame applies the fair-sharing limits to one decoded request of s.
func (g *Gateway) admitFrame(s *session, f *protocol.Frame) *protocol.Error {
	perr := g.fairShare(s, f)
	if perr == nil {
		if limited(f.Type) {
			s.limitedRun.Store(0)
		}
		return nil
	}
	if s.limitedRun.Add(1) >= maxLimitedRun {
		s.close(protocol.CloseRateLimited, "requests keep exceeding the rate limits; reconnect after a pause")
	}
	return perr
}

func (g *Gateway) fairShare(s *session, f *protocol.Frame) *protocol.Error {
	if !limited(f.Type) && !isSend(f.Type) {
		return nil // acks and pings: no budget, and no clock read
	}
	now := g.now()
	if limited(f.Type) {
		b := s.requests.Load()
		if b == nil {
			b = newBucket(g.cfg.ConnRequestRate, g.cfg.ConnRequestBurst, now)
			if !s.requests.CompareAndSwap(nil, b) {
				b = s.requests.Load()
			}
		}
		if ok, wait := b.take(now); !ok {
			return rateLimited("too many requests on this connection (gateway.conn_request_rate)", wait)
		}
	}
	if isSend(f.Type) {
		if ok, wait := g.sends.take(g, s.user, g.cfg.UserSendRate, g.cfg.UserSendBurst, now); !ok {
			return rateLimited("too many messages from this user (gateway.user_send_rate)", wait)
		}
	}
	return nil
}

func rateLimited(msg string, wait time.Duration) *protocol.Error {
	// A little jitter so that a user's connections do not retry in step.
	ms := (wait + rand.N(wait/4+time.Millisecond)).Milliseconds()
	return &protocol.Error{Code: protocol.CodeRateLimited, Msg: msg, RetryAfter: max(ms, 1)}
}

// sessionCap refuses a new session of user when the user already holds
// the most allowed on this node: MaxSessionsPerUser devices in all (the
// device reconnecting, which replaces its old session, is not counted) and
// MaxPollSessionsPerUser long-poll sessions.
func (g *Gateway) sessionCap(w http.ResponseWriter, r *http.Request, user, device string, poll bool) bool {
	devices, polls := 0, 0
	for _, s := range g.sessionsOf(user) {
		if s.device == device || s.closed.Load() {
			continue
		}
		devices++
		if _, ok := s.tr.(*mailbox); ok {
			polls++
		}
	}
	if ok, wait := g.handshakes.take(g, user, g.cfg.UserHandshakeRate, g.cfg.UserHandshakeBurst, g.now()); !ok {
		// Per user, so that one user reconnecting in a loop (a client
		// closed for ignoring rate limits) cannot spend the node's budget.
		g.observeHandshake("user_rate")
		g.logRefusal(slog.LevelWarn, "user_handshake_rate", r, user)
		httpError(w, http.StatusTooManyRequests, protocol.CodeRateLimited, "too many handshakes from this user (gateway.user_handshake_rate)", wait+rand.N(time.Second))
		return false
	}
	switch {
	case devices >= g.cfg.MaxSessionsPerUser:
		g.observeHandshake("user_cap")
		g.logRefusal(slog.LevelWarn, "max_sessions_per_user", r, user)
		httpError(w, http.StatusTooManyRequests, protocol.CodeRateLimited, "this user has gateway.max_sessions_per_user sessions on this node; close one", 5*time.Second)
		return false
	case poll && polls >= g.cfg.MaxPollSessionsPerUser:
		g.observeHandshake("user_cap")
		g.logRefusal(slog.LevelWarn, "max_poll_sessions_per_user", r, user)
		httpError(w, http.StatusTooManyRequests, protocol.CodeRateLimited, "this user has gateway.max_poll_sessions_per_user poll sessions on this node; close one", 5*time.Second)
		return false
	}
	return true
}

// expiresMS is the session expiry a token gives: its exp. A connection
// outlives its token by at most the sweeper's period (1 s); it is then
// closed with CloseTokenExpired and the client reconnects with a new one.
func expiresMS(id auth.Identity) int64 {
	if id.Expires.IsZero() {
		return 0
	}
	return id.Expires.UnixMilli()
}
