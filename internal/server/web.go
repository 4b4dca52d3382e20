package server

import (
	"encoding/json"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/parley-im/parley/internal/attach"
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
	if !s.knownHost(r.Host) {
		writeError(w, protocol.Errorf(protocol.CodeForbidden, "the development token endpoint answers requests to an IP address, localhost or a configured origin's host, not %q", r.Host))
		return
	}
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

// knownHost reports whether host (a request's Host header) names this node
// in a way no other site can: an IP address, localhost, or the host of an
// origin configured in web.cors_origins or web.ws_origins. A page on a
// foreign name that resolves to the node's address (DNS rebinding) sends
// its own name as Host and is refused.
func (s *Server) knownHost(host string) bool {
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	name = strings.ToLower(strings.TrimSuffix(strings.Trim(name, "[]"), "."))
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return true
	}
	if _, err := netip.ParseAddr(name); err == nil {
		return true
	}
	for _, origins := range []Origins{s.corsOrigins, s.wsOrigins} {
		for _, o := range origins {
			if u, err := url.Parse(o); err == nil && u.Hostname() != "" && strings.EqualFold(u.Hostname(), name) {
				return true
			}
		}
	}
	return false
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
	assets := http.StripPrefix("/web/", http.FileServerFS(noDirs{files}))
	csp := pageCSP(s.cfg.Attach)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		pageHeaders(w, csp)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(index)
	})
	mux.HandleFunc("GET /web/", func(w http.ResponseWriter, r *http.Request) {
		pageHeaders(w, csp)
		assets.ServeHTTP(w, r)
	})
	worker, err := fs.ReadFile(files, serviceWorkerFile)
	if err != nil {
		panic(err) // embedded at build time
	}
	mux.HandleFunc("GET /sw.js", func(w http.ResponseWriter, r *http.Request) {
		serviceWorkerHeaders(w, csp)
		_, _ = w.Write(worker)
	})
}

// serviceWorkerFile is the page's service worker in the embedded files,
// served at /sw.js.
const serviceWorkerFile = "js/web/src/sw/sw.js"

// serviceWorkerHeaders: the service worker is served at the root so that
// its scope is the whole page (/), which Service-Worker-Allowed states;
// it runs under the page's CSP (it fetches nothing) and, like the page,
// is revalidated so a new binary's worker replaces the old one.
func serviceWorkerHeaders(w http.ResponseWriter, csp string) {
	pageHeaders(w, csp)
	w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
	w.Header().Set("Service-Worker-Allowed", "/")
}

// noDirs is the page's file system without directories: the file server
// then answers a directory's URL 404 instead of listing it.
type noDirs struct{ fs.FS }

func (n noDirs) Open(name string) (fs.File, error) {
	f, err := n.FS.Open(name)
	if err != nil {
		return nil, err
	}
	if st, err := f.Stat(); err != nil || st.IsDir() {
		_ = f.Close()
		return nil, fs.ErrNotExist
	}
	return f, nil
}

// pageHeaders: the page loads only its own scripts, connects only to its
// own origin ('self' covers its ws:// and wss:// URLs) and may not be
// framed by another site; assets are revalidated so a new binary's page
// is picked up.
func pageHeaders(w http.ResponseWriter, csp string) {
	h := w.Header()
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
}

// pageCSP is the page's Content-Security-Policy. With attachments on S3
// the page PUTs parts to, and shows images and plays audio from, the
// presigned URLs of the S3 server (attach.s3.endpoint, which they name):
// that one origin joins connect-src, img-src and media-src. Files on disk
// come from the node itself ('self').
func pageCSP(c attach.Config) string {
	blobs := ""
	if c.Enabled() && c.Engine == attach.EngineS3 && c.S3.Endpoint != "" {
		scheme := "http"
		if c.S3.Secure {
			scheme = "https"
		}
		blobs = " " + scheme + "://" + c.S3.Endpoint
	}
	return "default-src 'self'; connect-src 'self'" + blobs + "; img-src 'self' data: blob:" + blobs + "; media-src 'self' blob:" + blobs +
		"; style-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
}
