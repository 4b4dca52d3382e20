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

// corsPaths are the browser-callable HTTP endpoints that answer CORS;
// corsPrefixes start the paths of the attachment endpoints (an upload's
// parts, a file), which answer it too.
var corsPaths = map[string]bool{
	"/v1/rpc":                    true,
	"/v1/poll":                   true,
	"/v1/conversations/snapshot": true,
}

var corsPrefixes = []string{"/v1/uploads/", "/v1/files/"}

// corsAnswer is what an endpoint that answers CORS allows and exposes.
type corsAnswer struct{ methods, headers, expose string }

var (
	corsAPI   = corsAnswer{"GET, POST, OPTIONS", "Authorization, Content-Type", "Retry-After"}
	corsFiles = corsAnswer{"GET, PUT, OPTIONS", "Content-Type, Range", "Retry-After, Content-Length, Content-Range, Accept-Ranges, Content-Disposition"}
)

// corsFor returns what path answers CORS with, if it does.
func corsFor(path string) (corsAnswer, bool) {
	if corsPaths[path] {
		return corsAPI, true
	}
	for _, p := range corsPrefixes {
		if strings.HasPrefix(path, p) {
			return corsFiles, true
		}
	}
	return corsAnswer{}, false
}

// browserGuard wraps the node's handler: it answers CORS preflights and adds
// the CORS headers for allowed origins on /v1/rpc, /v1/poll, the snapshot
// endpoint and the attachment endpoints, and refuses a WebSocket handshake
// or one of those requests whose Origin is not allowed with 403 forbidden
// (docs/protocol.md, "Browsers").
func (s *Server) browserGuard(next http.Handler) http.Handler {
	cors, ws := s.corsOrigins, s.wsOrigins
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		ca, isCORS := corsFor(r.URL.Path)
		switch {
		case r.URL.Path == "/v1/ws":
			if !ws.allows(origin, r) {
				s.metrics.Handshakes.WithLabelValues("origin").Inc()
				writeError(w, protocol.Errorf(protocol.CodeForbidden, "origin %q may not open a WebSocket here (gateway: web.ws_origins)", origin))
				return
			}
		case isCORS:
			if !cors.allows(origin, r) {
				writeError(w, protocol.Errorf(protocol.CodeForbidden, "origin %q may not call this endpoint (web.cors_origins)", origin))
				return
			}
			if origin != "" {
				h := w.Header()
				h.Set("Access-Control-Allow-Origin", origin)
				h.Add("Vary", "Origin")
				h.Set("Access-Control-Expose-Headers", ca.expose)
			}
			if r.Method == http.MethodOptions {
				h := w.Header()
				h.Set("Access-Control-Allow-Methods", ca.methods)
				h.Set("Access-Control-Allow-Headers", ca.headers)
				h.Set("Access-Control-Max-Age", "600")
				w.WriteHeader(http.StatusNoContent)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
