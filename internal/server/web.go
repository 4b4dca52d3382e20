package server

import (
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"strings"
	"time"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/protocol"
	"github.com/parley-im/parley/web"
)

// DevTokenTTL is how long a token from POST /v1/dev/token lives.
const DevTokenTTL = 24 * time.Hour

// routeWeb adds the browser-facing routes of a gateway node: the chat page
// (when enabled) and, on the development key only, the token endpoint.
func (s *Server) routeWeb(mux *http.ServeMux) {
	if s.devKey != nil {
		mux.HandleFunc("POST /v1/dev/token", s.handleDevToken)
	}
	if s.cfg.Web.Page {
		s.routePage(mux)
	}
}

// devTokenRequest is the body of POST /v1/dev/token.
type devTokenRequest struct {
	User string `json:"user"`
}

// handleDevToken mints a development token for the user named in the body.
// It exists only while the node runs on the development key, whose tokens
// anyone with access to the data directory can mint anyway
// (docs/protocol.md, "Development tokens").
func (s *Server) handleDevToken(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1025))
	if err != nil {
		writeError(w, protocol.Errorf(protocol.CodeBadFrame, "read body: %v", err))
		return
	}
	if len(body) > 1024 {
		writeError(w, protocol.Errorf(protocol.CodeTooLarge, "body over 1024 bytes"))
		return
	}
	var req devTokenRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, protocol.Errorf(protocol.CodeBadFrame, "body must be {\"user\": \"name\"}: %v", err))
		return
	}
	req.User = strings.TrimSpace(req.User)
	if !protocol.ValidID(req.User) {
		writeError(w, protocol.Errorf(protocol.CodeInvalidArgument, "user must be 1-64 bytes of [A-Za-z0-9._@-]"))
		return
	}
	if req.User == s.reservedUser() {
		writeError(w, protocol.Errorf(protocol.CodeInvalidArgument, "user %q is reserved for the server API", req.User))
		return
	}
	now := s.now()
	exp := now.Add(DevTokenTTL)
	tok, err := auth.MintHS256(s.devKey, auth.Claims{User: req.User, IssuedAt: now, Expires: exp})
	if err != nil {
		writeError(w, protocol.Errorf(protocol.CodeInternal, "mint: %v", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(DevToken{Token: tok, User: req.User, Expires: exp.UnixMilli()})
}

// DevToken is the answer of POST /v1/dev/token.
type DevToken struct {
	Token   string `json:"token"`
	User    string `json:"user"`
	Expires int64  `json:"expires"` // unix ms
}

// routePage serves the embedded chat page: / is index.html, /web/... its
// assets.
func (s *Server) routePage(mux *http.ServeMux) {
	files := web.Static()
	index, err := fs.ReadFile(files, "index.html")
	if err != nil {
		panic(err) // embedded at build time
	}
	assets := http.StripPrefix("/web/", http.FileServerFS(files))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		pageHeaders(w)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(index)
	})
	mux.HandleFunc("GET /web/", func(w http.ResponseWriter, r *http.Request) {
		pageHeaders(w)
		assets.ServeHTTP(w, r)
	})
}

// pageHeaders: the page loads only its own scripts and talks only to its
// own origin; assets are revalidated so a new binary's page is picked up.
func pageHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "default-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data:; style-src 'self'; base-uri 'none'; form-action 'self'")
	h.Set("Referrer-Policy", "no-referrer")
}
