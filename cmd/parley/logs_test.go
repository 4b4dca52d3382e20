package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/servertest"
)

// syncBuffer is an io.Writer safe to read while the server logs to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// logLines parses the JSON log written so far.
func logLines(t *testing.T, out *syncBuffer) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	return lines
}

func waitLog(t *testing.T, out *syncBuffer, msg string, match func(map[string]any) bool) map[string]any {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		for _, l := range logLines(t, out) {
			if l["msg"] == msg && (match == nil || match(l)) {
				return l
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q line in the log:\n%s", msg, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestConnectionLogs: with serve's JSON logger, a session's open and close
// are logged at DEBUG (the close with a human-readable duration), and a
// handshake refused for its token at INFO with the reason.
func TestConnectionLogs(t *testing.T) {
	out := &syncBuffer{}
	log := newLogger(config.Log{Level: "debug", Format: config.LogJSON}, out)
	srv := servertest.Start(t, servertest.WithLogger(log))

	resp, err := http.Get(srv.HTTPURL + "/v1/ws?device=d1&token=not-a-token")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("bad token: status %d", resp.StatusCode)
	}
	l := waitLog(t, out, "request refused", func(l map[string]any) bool { return l["reason"] == "bad_token" })
	if l["level"] != "INFO" || l["path"] != "/v1/ws" {
		t.Fatalf("refusal logged as %v", l)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.New(client.Config{URL: srv.URL, Token: srv.Token("alice"), Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	opened := waitLog(t, out, "connection opened", func(l map[string]any) bool { return l["user"] == "alice" })
	if opened["level"] != "DEBUG" || opened["device"] != "phone" || opened["transport"] != "ws" {
		t.Fatalf("open logged as %v", opened)
	}
	c.Close()
	cancel()
	<-done
	closed := waitLog(t, out, "connection closed", func(l map[string]any) bool { return l["user"] == "alice" })
	d, ok := closed["duration"].(string)
	if closed["level"] != "DEBUG" || !ok {
		t.Fatalf("close logged as %v", closed)
	}
	if _, err := time.ParseDuration(d); err != nil {
		t.Fatalf("duration %q is not a Go duration: %v", d, err)
	}
}
