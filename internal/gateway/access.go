package gateway

import (
	"log/slog"
	"net/http"

	"github.com/parley-im/parley/internal/access"
	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/protocol"
)

// The operator's access list (internal/access): a banned user's requests
// are refused with 403 banned, a revoked token's with 401 token_revoked,
// before any admission budget is spent; open sessions are closed by
// Enforce when the list changes (CloseBanned, CloseTokenRevoked), and the
// operator's disconnect closes a user's or device's sessions with
// CloseDisconnected.

// issuedMS is the token's iat in unix ms, 0 when it has none (such a
// token is revoked by any revocation of its user).
func issuedMS(id auth.Identity) int64 {
	if id.IssuedAt.IsZero() {
		return 0
	}
	return id.IssuedAt.UnixMilli()
}

// Authorize checks an authenticated request of device against the access
// list; on refusal it writes the answer and returns false.
func (g *Gateway) Authorize(w http.ResponseWriter, req *http.Request, id auth.Identity, device string) bool {
	if g.access == nil {
		return true
	}
	r := g.access.Check(id.User, device, issuedMS(id))
	if r == nil {
		return true
	}
	reason := "revoked"
	if r.Code == protocol.CodeBanned {
		reason = "banned"
	}
	g.observeHandshake(reason)
	g.logRefusal(slog.LevelInfo, reason, req, id.User)
	refuse(w, r)
	return false
}

func refuse(w http.ResponseWriter, r *access.Refusal) {
	status := http.StatusUnauthorized
	if r.Code == protocol.CodeBanned {
		status = http.StatusForbidden
	}
	httpError(w, status, r.Code, r.Msg, 0)
}

// refusal is why s may no longer exist, or nil.
func (g *Gateway) refusal(s *session) *access.Refusal {
	if g.access == nil {
		return nil
	}
	return g.access.Check(s.user, s.device, s.iatMS)
}

func (g *Gateway) enforce(s *session) {
	if r := g.refusal(s); r != nil {
		g.log.Info("closing a session refused by the access list", "user", s.user, "device", s.device, "code", r.Code)
		s.close(r.Close, r.Msg)
	}
}

// Enforce closes the local sessions of e's user that the access list now
// refuses (call it after the list changed).
func (g *Gateway) Enforce(e access.Entry) {
	for _, s := range g.sessionsOf(e.User) {
		g.enforce(s)
	}
}

// Disconnect closes user's local sessions (of device only, if set) with
// code and returns how many it closed.
func (g *Gateway) Disconnect(user, device string, code int) int {
	n := 0
	for _, s := range g.sessionsOf(user) {
		if device == "" || s.device == device {
			if !s.closed.Load() {
				n++
			}
			s.close(code, "disconnected by the operator")
		}
	}
	return n
}
