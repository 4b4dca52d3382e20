package gateway

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/parley-im/parley/internal/auth"
)

// Connection logs (documented in docs/deploy.md, "Logs"):
//
//   - Debug: a session opened (user, device, session, transport, remote)
//     and closed (the same, how long it lived; the close code and reason
//     when the server closed it).
//   - Info: a request refused for its credentials: no token, a bad or
//     expired token (reason), a bad device id.
//   - Warn: a handshake refused for load: the node full, its handshake
//     budget spent, a user over its handshake rate or session cap. Info
//     while the node drains (expected).
//
// Refusals come in storms (a reconnect storm, a client with a stale
// token in a loop), so each reason is logged at most once per second;
// the next line says how many were left out ("suppressed").

// refusalLog rate-limits refusal lines per reason.
type refusalLog struct {
	mu   sync.Mutex
	last map[string]refusalState
}

type refusalState struct {
	at         time.Time
	suppressed int
}

// logRefusal logs a refused request at level, at most once per second per
// reason.
func (g *Gateway) logRefusal(level slog.Level, reason string, r *http.Request, user string) {
	if !g.log.Enabled(context.Background(), level) {
		return
	}
	now := g.now()
	rl := &g.refusals
	rl.mu.Lock()
	if rl.last == nil {
		rl.last = make(map[string]refusalState)
	}
	st := rl.last[reason]
	if !st.at.IsZero() && now.Sub(st.at) < time.Second {
		st.suppressed++
		rl.last[reason] = st
		rl.mu.Unlock()
		return
	}
	suppressed := st.suppressed
	rl.last[reason] = refusalState{at: now}
	rl.mu.Unlock()
	attrs := []any{"reason", reason, "remote", r.RemoteAddr, "path", r.URL.Path}
	if user != "" {
		attrs = append(attrs, "user", user)
	}
	if suppressed > 0 {
		attrs = append(attrs, "suppressed", suppressed)
	}
	g.log.Log(context.Background(), level, "request refused", attrs...)
}

// authenticate is Authenticate with the failure logged at Info; reason is
// "" on success.
func (g *Gateway) authenticate(w http.ResponseWriter, r *http.Request, now time.Time) (id auth.Identity, reason string) {
	id, reason = authenticate(g.verifier, w, r, now)
	if reason != "" {
		g.logRefusal(slog.LevelInfo, reason, r, "")
	}
	return id, reason
}

// logOpen and logClose write the Debug lines of a session's life.
func (g *Gateway) logOpen(s *session, transport string) {
	if g.log.Enabled(context.Background(), slog.LevelDebug) {
		g.log.Debug("connection opened", "user", s.user, "device", s.device, "session", s.id, "transport", transport)
	}
}

func (g *Gateway) logClose(s *session) {
	if !g.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	attrs := []any{"user", s.user, "device", s.device, "session", s.id, "duration", g.now().Sub(s.opened)}
	if c := s.closeCode.Load(); c != 0 {
		attrs = append(attrs, "code", c)
	}
	g.log.Debug("connection closed", attrs...)
}
