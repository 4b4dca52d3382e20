package server_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/servertest"
)

// TestPageHeadersConfine: the page may open connections to its own origin
// only (no ws:/wss: to any host), may not be framed by another site, and
// /web/ lists no directory.
func TestPageHeadersConfine(t *testing.T) {
	srv := servertest.Start(t, withWeb(config.Web{Page: true}))
	for _, path := range []string{"/", "/web/app.css"} {
		resp, _ := do(t, http.MethodGet, srv.HTTPURL+path, nil, "")
		csp := resp.Header.Get("Content-Security-Policy")
		directives := map[string]string{}
		for _, d := range strings.Split(csp, ";") {
			name, value, _ := strings.Cut(strings.TrimSpace(d), " ")
			directives[name] = value
		}
		if got := directives["connect-src"]; got != "'self'" {
			t.Errorf("GET %s: connect-src %q, want 'self' (ws: and wss: allow any host)", path, got)
		}
		if got := directives["frame-ancestors"]; got != "'none'" {
			t.Errorf("GET %s: frame-ancestors %q, want 'none'", path, got)
		}
		if got := resp.Header.Get("X-Frame-Options"); got != "DENY" {
			t.Errorf("GET %s: X-Frame-Options %q, want DENY", path, got)
		}
	}
	for _, dir := range []string{"/web/", "/web/js/", "/web/js/sdk/ts/src/"} {
		resp, body := do(t, http.MethodGet, srv.HTTPURL+dir, nil, "")
		if resp.StatusCode != http.StatusNotFound || strings.Contains(body, "<a href") {
			t.Errorf("GET %s: %d, want 404 and no listing:\n%.200s", dir, resp.StatusCode, body)
		}
	}
}

// TestDevTokenRefusesForeignHost: the development token endpoint answers
// only requests addressed to the node by an IP address, localhost or a
// configured origin's host — not a foreign name (DNS rebinding: a site
// whose name resolves to 127.0.0.1 would mint tokens for any user).
func TestDevTokenRefusesForeignHost(t *testing.T) {
	dev := servertest.Start(t, servertest.WithDevKey(), servertest.WithConfig(func(c *config.Config) {
		c.Web.WSOrigins = "https://chat.example.com"
	}))
	port := dev.Addr()[strings.LastIndex(dev.Addr(), ":"):]
	post := func(host, origin string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, dev.HTTPURL+"/v1/dev/token", strings.NewReader(`{"user":"mallory"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, host := range []string{"rebind.attacker.example" + port, "rebind.attacker.example"} {
		if code, body := post(host, "http://"+host); code != http.StatusForbidden || !strings.Contains(body, `"forbidden"`) {
			t.Errorf("Host %s: %d %s, want 403 forbidden", host, code, body)
		}
	}
	for _, host := range []string{"127.0.0.1" + port, "localhost" + port, "[::1]" + port, "chat.example.com"} {
		if code, body := post(host, ""); code != http.StatusOK {
			t.Errorf("Host %s: %d %s, want 200", host, code, body)
		}
	}
}

// TestServiceWorkerServed: the page's service worker is at /sw.js — the
// root, so that its scope covers the page — as JavaScript (a browser
// refuses a worker of another type), with Service-Worker-Allowed: / and
// the page's CSP; no page, no worker.
func TestServiceWorkerServed(t *testing.T) {
	srv := servertest.Start(t, withWeb(config.Web{Page: true}))
	page, _ := do(t, http.MethodGet, srv.HTTPURL+"/", nil, "")
	resp, body := do(t, http.MethodGet, srv.HTTPURL+"/sw.js", nil, "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /sw.js: %d", resp.StatusCode)
	}
	for h, want := range map[string]string{
		"Content-Type":            "text/javascript; charset=utf-8",
		"Service-Worker-Allowed":  "/",
		"Content-Security-Policy": page.Header.Get("Content-Security-Policy"),
		"Cache-Control":           "no-cache",
		"X-Content-Type-Options":  "nosniff",
	} {
		if got := resp.Header.Get(h); got != want {
			t.Errorf("GET /sw.js: %s %q, want %q", h, got, want)
		}
	}
	for _, handler := range []string{`addEventListener("push"`, `addEventListener("notificationclick"`} {
		if !strings.Contains(body, handler) {
			t.Errorf("GET /sw.js: no %s in the worker", handler)
		}
	}
	off := servertest.Start(t)
	if resp, _ := do(t, http.MethodGet, off.HTTPURL+"/sw.js", nil, ""); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /sw.js without the page: %d, want 404", resp.StatusCode)
	}
}
