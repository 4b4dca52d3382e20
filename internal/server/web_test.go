package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/server"
	"github.com/parley-im/parley/internal/servertest"
)

func withWeb(w config.Web) servertest.Option {
	return servertest.WithConfig(func(c *config.Config) { c.Web = w })
}

func do(t *testing.T, method, url string, hdr map[string]string, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestCORS: the fallback and snapshot endpoints answer preflights and carry
// CORS headers for allowed origins only; the same origin and non-browser
// requests need no configuration; others get 403 forbidden.
func TestCORS(t *testing.T) {
	srv := servertest.Start(t, withWeb(config.Web{CORSOrigins: "https://app.example.com, http://localhost:3000/"}))
	tok := srv.Token("alice")
	auth := map[string]string{"Authorization": "Bearer " + tok}
	for _, path := range []string{"/v1/rpc?device=d1", "/v1/poll?device=d1", "/v1/conversations/snapshot?all=true"} {
		t.Run(path, func(t *testing.T) {
			// Preflight from an allowed origin.
			resp, _ := do(t, http.MethodOptions, srv.HTTPURL+path, map[string]string{
				"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST",
				"Access-Control-Request-Headers": "authorization,content-type"}, "")
			if resp.StatusCode != http.StatusNoContent {
				t.Fatalf("preflight status %d, want 204", resp.StatusCode)
			}
			if got := resp.Header.Get("Access-Control-Allow-Origin"); got != "https://app.example.com" {
				t.Fatalf("Allow-Origin %q", got)
			}
			if got := resp.Header.Get("Access-Control-Allow-Headers"); !strings.Contains(got, "Authorization") {
				t.Fatalf("Allow-Headers %q", got)
			}
			// Preflight from another origin.
			resp, body := do(t, http.MethodOptions, srv.HTTPURL+path, map[string]string{"Origin": "https://evil.example"}, "")
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, `"forbidden"`) {
				t.Fatalf("foreign preflight: %d %s", resp.StatusCode, body)
			}
			if resp.Header.Get("Access-Control-Allow-Origin") != "" {
				t.Fatal("foreign origin got Allow-Origin")
			}
		})
	}
	// A real call from an allowed origin carries the header.
	h := map[string]string{"Origin": "http://localhost:3000", "Authorization": "Bearer " + tok}
	resp, body := do(t, http.MethodPost, srv.HTTPURL+"/v1/rpc?device=d1", h, `{"type":"ping"}`)
	if resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "http://localhost:3000" || !strings.Contains(body, `"pong"`) {
		t.Fatalf("rpc from allowed origin: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if got := resp.Header.Get("Access-Control-Expose-Headers"); got != "Retry-After" {
		t.Fatalf("Expose-Headers %q", got)
	}
	// The same origin, and no Origin at all, work without configuration.
	h = map[string]string{"Origin": srv.HTTPURL, "Authorization": "Bearer " + tok}
	if resp, body := do(t, http.MethodPost, srv.HTTPURL+"/v1/rpc?device=d1", h, `{"type":"ping"}`); resp.StatusCode != 200 {
		t.Fatalf("same origin: %d %s", resp.StatusCode, body)
	}
	if resp, body := do(t, http.MethodPost, srv.HTTPURL+"/v1/rpc?device=d1", auth, `{"type":"ping"}`); resp.StatusCode != 200 {
		t.Fatalf("no origin: %d %s", resp.StatusCode, body)
	}
	// A real call from another origin is refused before it runs.
	h = map[string]string{"Origin": "https://evil.example", "Authorization": "Bearer " + tok}
	if resp, body := do(t, http.MethodPost, srv.HTTPURL+"/v1/rpc?device=d1", h, `{"type":"ping"}`); resp.StatusCode != 403 || !strings.Contains(body, `"forbidden"`) {
		t.Fatalf("foreign origin rpc: %d %s", resp.StatusCode, body)
	}
}

// TestCORSDefaultSameOrigin: with no configuration only the same origin is
// allowed.
func TestCORSDefaultSameOrigin(t *testing.T) {
	srv := servertest.Start(t)
	resp, _ := do(t, http.MethodOptions, srv.HTTPURL+"/v1/rpc", map[string]string{"Origin": "https://app.example.com"}, "")
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("preflight from another origin by default: %d, want 403", resp.StatusCode)
	}
	resp, _ = do(t, http.MethodOptions, srv.HTTPURL+"/v1/rpc", map[string]string{"Origin": srv.HTTPURL}, "")
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("same-origin preflight: %d, want 204", resp.StatusCode)
	}
}

func dialOrigin(srv *servertest.Server, origin string) (*websocket.Conn, *http.Response, error) {
	h := http.Header{}
	h.Set("Authorization", "Bearer "+srv.Token("alice"))
	if origin != "" {
		h.Set("Origin", origin)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return websocket.DefaultDialer.DialContext(ctx, srv.URL+"/v1/ws?device=d1", h)
}

// TestWebSocketOrigin: the handshake accepts no Origin, the same origin and
// allowlisted origins, and refuses others with 403 forbidden.
func TestWebSocketOrigin(t *testing.T) {
	for _, tc := range []struct {
		name, allow, origin string
		ok                  bool
	}{
		{"no origin", "", "", true},
		{"same origin", "", "SELF", true},
		{"foreign by default", "", "https://evil.example", false},
		{"listed", "https://app.example.com", "https://app.example.com", true},
		{"listed other case", "https://App.Example.com", "https://app.example.COM", true},
		{"not listed", "https://app.example.com", "https://app.example.com:8443", false},
		{"any", "*", "https://anything.example", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := servertest.Start(t, withWeb(config.Web{WSOrigins: tc.allow}))
			origin := tc.origin
			if origin == "SELF" {
				origin = srv.HTTPURL
			}
			c, resp, err := dialOrigin(srv, origin)
			if tc.ok {
				if err != nil {
					t.Fatalf("dial: %v", err)
				}
				_ = c.Close()
				return
			}
			if err == nil {
				_ = c.Close()
				t.Fatal("handshake from a foreign origin succeeded")
			}
			if resp == nil || resp.StatusCode != http.StatusForbidden {
				t.Fatalf("got %v, want 403", resp)
			}
			var body struct{ Code string }
			_ = json.NewDecoder(resp.Body).Decode(&body)
			if body.Code != "forbidden" {
				t.Fatalf("code %q, want forbidden", body.Code)
			}
		})
	}
}

// TestDevToken: POST /v1/dev/token exists only on the development key and
// mints tokens the node accepts.
func TestDevToken(t *testing.T) {
	srv := servertest.Start(t)
	if resp, _ := do(t, http.MethodPost, srv.HTTPURL+"/v1/dev/token", nil, `{"user":"alice"}`); resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("without the dev key: %d, want 404", resp.StatusCode)
	}
	dev := servertest.Start(t, servertest.WithDevKey())
	key := dev.Key()
	resp, body := do(t, http.MethodPost, dev.HTTPURL+"/v1/dev/token", nil, `{"user":"carol"}`)
	if resp.StatusCode != 200 {
		t.Fatalf("dev token: %d %s", resp.StatusCode, body)
	}
	var tok server.DevToken
	if err := json.Unmarshal([]byte(body), &tok); err != nil || tok.User != "carol" || tok.Token == "" {
		t.Fatalf("answer %s (%v)", body, err)
	}
	v, err := auth.NewVerifier(auth.Config{HS256Key: key})
	if err != nil {
		t.Fatal(err)
	}
	id, err := v.Verify(tok.Token, time.Now())
	if err != nil || id.User != "carol" {
		t.Fatalf("minted token: %v %v", id, err)
	}
	if time.Until(time.UnixMilli(tok.Expires)) < time.Hour {
		t.Fatalf("expires %v", time.UnixMilli(tok.Expires))
	}
	for _, bad := range []struct {
		body string
		code string
	}{
		{`{"user":"a b"}`, "invalid_argument"},
		{`{"user":""}`, "invalid_argument"},
		{`not json`, "bad_frame"},
		{`{"user":"` + strings.Repeat("x", 2000) + `"}`, "too_large"},
	} {
		resp, body := do(t, http.MethodPost, dev.HTTPURL+"/v1/dev/token", nil, bad.body)
		if resp.StatusCode < 400 || !strings.Contains(body, `"`+bad.code+`"`) {
			t.Fatalf("body %.40q: %d %s, want %s", bad.body, resp.StatusCode, body, bad.code)
		}
	}
}

// TestPage: the page and its assets are served with their security headers
// when web.page is on, and not at all when it is off.
func TestPage(t *testing.T) {
	on := servertest.Start(t, withWeb(config.Web{Page: true}))
	resp, body := do(t, http.MethodGet, on.HTTPURL+"/", nil, "")
	if resp.StatusCode != 200 || !strings.Contains(body, `<script type="module"`) || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /: %d %s", resp.StatusCode, resp.Header)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
		t.Fatalf("CSP %q", csp)
	}
	for _, asset := range []string{"/web/app.css", "/web/js/web/src/app.js", "/web/js/sdk/ts/src/client.js"} {
		if resp, _ := do(t, http.MethodGet, on.HTTPURL+asset, nil, ""); resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d", asset, resp.StatusCode)
		}
	}
	if resp, _ := do(t, http.MethodGet, on.HTTPURL+"/web/nope.js", nil, ""); resp.StatusCode != 404 {
		t.Fatalf("missing asset: %d", resp.StatusCode)
	}
	off := servertest.Start(t)
	if resp, _ := do(t, http.MethodGet, off.HTTPURL+"/", nil, ""); resp.StatusCode != 404 {
		t.Fatalf("GET / with web.page off: %d, want 404", resp.StatusCode)
	}
}
