package server

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/parley-im/parley/protocol"
)

// Origins is an allowlist of browser origins ("https://chat.example.com",
// scheme://host[:port], compared case-insensitively). The same origin (the
// Origin's host equals the request's Host) is always allowed; "*" allows
// every origin. The zero value allows the same origin only.
type Origins []string

// ParseOrigins splits a comma-separated list, dropping blanks and a trailing
// slash.
func ParseOrigins(s string) Origins {
	var out Origins
	for _, o := range strings.Split(s, ",") {
		o = strings.TrimSuffix(strings.TrimSpace(o), "/")
		if o != "" {
			out = append(out, strings.ToLower(o))
		}
	}
	return out
}

// allows reports whether a request from origin may reach r. A request with
// no Origin header does not come from a browser page and is allowed (its
// token is its only credential; nothing rides on cookies).
func (o Origins) allows(origin string, r *http.Request) bool {
	if origin == "" || sameOrigin(origin, r) {
		return true
	}
	origin = strings.ToLower(strings.TrimSuffix(origin, "/"))
	for _, a := range o {
		if a == "*" || a == origin {
			return true
		}
	}
	return false
}

func sameOrigin(origin string, r *http.Request) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	return strings.EqualFold(u.Host, r.Host)
}

// corsPaths are the browser-callable HTTP endpoints that answer CORS.
var corsPaths = map[string]bool{
	"/v1/rpc":                    true,
	"/v1/poll":                   true,
	"/v1/conversations/snapshot": true,
}

// browserGuard wraps the node's handler: it answers CORS preflights and adds
// the CORS headers for allowed origins on /v1/rpc, /v1/poll and the snapshot
// endpoint, and refuses a WebSocket handshake or one of those requests whose
// Origin is not allowed with 403 forbidden (docs/protocol.md, "Browsers").
func (s *Server) browserGuard(next http.Handler) http.Handler {
	cors, ws := s.corsOrigins, s.wsOrigins
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		switch {
		case r.URL.Path == "/v1/ws":
			if !ws.allows(origin, r) {
				s.metrics.Handshakes.WithLabelValues("origin").Inc()
				writeError(w, protocol.Errorf(protocol.CodeForbidden, "origin %q may not open a WebSocket here (gateway: web.ws_origins)", origin))
				return
			}
		case corsPaths[r.URL.Path]:
			if !cors.allows(origin, r) {
				writeError(w, protocol.Errorf(protocol.CodeForbidden, "origin %q may not call this endpoint (web.cors_origins)", origin))
				return
			}
			if origin != "" {
				h := w.Header()
				h.Set("Access-Control-Allow-Origin", origin)
				h.Add("Vary", "Origin")
				h.Set("Access-Control-Expose-Headers", "Retry-After")
			}
			if r.Method == http.MethodOptions {
				h := w.Header()
				h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
				h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type")
				h.Set("Access-Control-Max-Age", "600")
				w.WriteHeader(http.StatusNoContent)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
