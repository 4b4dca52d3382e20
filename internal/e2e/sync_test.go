package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/gateway"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// TestOfflineSyncOneRequest: alice is offline while 300 messages arrive in
// one conversation and 5 in each of 100 others; on connect one sync request
// brings everything, following the gap rules of docs/protocol.md (whole
// ranges up to chat.snapshot_range_limit, else the latest chat.snapshot_latest).
func TestOfflineSyncOneRequest(t *testing.T) {
	srv := servertest.Start(t)
	bob := dialRaw(t, srv, "bob", "phone")
	busy := bob.openDirect("alice")
	for i := 1; i <= 300; i++ {
		bob.send(protocol.Frame{Type: protocol.TypeSend, RID: fmt.Sprint("b", i), ConvID: busy, ClientMsgID: cmid(i), Body: fmt.Sprint("busy ", i)})
	}
	for i := 1; i <= 300; i++ {
		mustOK(t, bob.next(protocol.TypeAck), protocol.TypeAck)
	}
	quiet := make(map[uint64]bool)
	for g := 0; g < 100; g++ {
		info := mustOK(t, bob.call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: fmt.Sprint("g", g), Members: []string{"alice"}}), protocol.TypeConv).Conv
		quiet[info.ConvID] = true
		for i := 1; i <= 5; i++ {
			bob.send(protocol.Frame{Type: protocol.TypeSend, RID: fmt.Sprint("g", g, "-", i), ConvID: info.ConvID, ClientMsgID: cmid(i), Body: fmt.Sprint(g, "/", i)})
		}
		for i := 1; i <= 5; i++ {
			mustOK(t, bob.next(protocol.TypeAck), protocol.TypeAck)
		}
	}

	check := func(t *testing.T, snap []protocol.ConvSnapshot) {
		t.Helper()
		if len(snap) != 101 {
			t.Fatalf("snapshot has %d conversations, want 101", len(snap))
		}
		for _, c := range snap {
			switch {
			case c.ConvID == busy:
				if c.LastSeq != 300 || c.MoreUnread != 250 || len(c.Messages) != 50 || c.Unread != 300 {
					t.Fatalf("busy conv: last %d more %d msgs %d unread %d, want 300/250/50/300", c.LastSeq, c.MoreUnread, len(c.Messages), c.Unread)
				}
				for i, m := range c.Messages {
					if m.Seq != uint64(251+i) {
						t.Fatalf("busy conv message %d has seq %d, want %d", i, m.Seq, 251+i)
					}
				}
			case quiet[c.ConvID]:
				if len(c.Messages) != 5 || c.MoreUnread != 0 || c.Messages[0].Seq != 1 || c.Messages[4].Seq != 5 {
					t.Fatalf("group %d: %d messages, more %d, want seq 1..5", c.ConvID, len(c.Messages), c.MoreUnread)
				}
			default:
				t.Fatalf("unexpected conversation %d in snapshot", c.ConvID)
			}
		}
	}

	t.Run("socket", func(t *testing.T) {
		alice := dialRaw(t, srv, "alice", "phone")
		r := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeSync, All: true}), protocol.TypeSnapshot)
		check(t, r.Snapshot)
	})
	t.Run("http", func(t *testing.T) {
		req, _ := http.NewRequest("GET", srv.HTTPURL+"/v1/conversations/snapshot?all=true", nil)
		req.Header.Set("Authorization", "Bearer "+srv.Token("alice"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			Snapshot []protocol.ConvSnapshot `json:"snapshot"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != 200 {
			t.Fatalf("status %d, decode %v", resp.StatusCode, err)
		}
		check(t, body.Snapshot)
	})
	t.Run("positions", func(t *testing.T) {
		// With known positions: gap 0 is skipped, a small gap is a range.
		alice := dialRaw(t, srv, "alice", "laptop")
		var convs []protocol.SyncConv
		for id := range quiet {
			convs = append(convs, protocol.SyncConv{ConvID: id, AfterSeq: 5})
		}
		convs = append(convs, protocol.SyncConv{ConvID: busy, AfterSeq: 120})
		r := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeSync, Convs: convs}), protocol.TypeSnapshot)
		if len(r.Snapshot) != 1 {
			t.Fatalf("snapshot has %d conversations, want only the busy one", len(r.Snapshot))
		}
		c := r.Snapshot[0]
		if len(c.Messages) != 180 || c.MoreUnread != 0 || c.Messages[0].Seq != 121 || c.Messages[179].Seq != 300 {
			t.Fatalf("busy conv from 120: %d messages from %d, more %d; want 180 from 121", len(c.Messages), c.Messages[0].Seq, c.MoreUnread)
		}
	})
	t.Run("read position clears", func(t *testing.T) {
		alice := dialRaw(t, srv, "alice", "tablet")
		mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeRead, ConvID: busy, Seq: 300}), protocol.TypeOK)
		r := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeSync, All: true}), protocol.TypeSnapshot)
		if len(r.Snapshot) != 100 {
			t.Fatalf("after reading busy conv snapshot has %d conversations, want 100", len(r.Snapshot))
		}
	})
}

func TestHTTPSnapshotErrors(t *testing.T) {
	srv := servertest.Start(t)
	get := func(query, token string) (int, protocol.Code) {
		req, _ := http.NewRequest("GET", srv.HTTPURL+"/v1/conversations/snapshot?"+query, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			Code protocol.Code `json:"code"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body.Code
	}
	tok := srv.Token("alice")
	tests := []struct {
		name, query, token string
		status             int
		code               protocol.Code
	}{
		{"no token", "all=true", "", 401, protocol.CodeUnauthorized},
		{"nothing asked", "", tok, 400, protocol.CodeInvalidArgument},
		{"bad id", "conv_ids=abc", tok, 400, protocol.CodeInvalidArgument},
		{"mismatched from_seq", "conv_ids=1,2,3&from_seq=1,2", tok, 400, protocol.CodeInvalidArgument},
		{"not a member", "conv_ids=12345", tok, 403, protocol.CodeNotMember},
		{"too many", "conv_ids=" + strings.Repeat("1,", protocol.DefaultLimits.MaxSyncConvs) + "1", tok, 413, protocol.CodeTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, code := get(tc.query, tc.token)
			if status != tc.status || code != tc.code {
				t.Fatalf("got %d %q, want %d %q", status, code, tc.status, tc.code)
			}
		})
	}
}

func TestIdleConnectionIsClosedAndUnregistered(t *testing.T) {
	srv := servertest.Start(t, servertest.WithGateway(func(g *gateway.Config) {
		g.HeartbeatInterval = 500 * time.Millisecond
		g.IdleTimeout = 1500 * time.Millisecond
	}))
	quiet := dialRaw(t, srv, "alice", "phone")
	if quiet.hello.HeartbeatMS != 500 || quiet.hello.IdleTimeoutMS != 1500 {
		t.Fatalf("hello announces %d/%d ms, want 500/1500", quiet.hello.HeartbeatMS, quiet.hello.IdleTimeoutMS)
	}
	if got := quiet.waitClose(); got != protocol.CloseIdleTimeout {
		t.Fatalf("close = %d, want %d", got, protocol.CloseIdleTimeout)
	}
	deadline := time.Now().Add(5 * time.Second)
	for srv.Gateway().Connections() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("gateway still counts %d connections", srv.Gateway().Connections())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestDrainSendsGoAway(t *testing.T) {
	srv := servertest.Start(t)
	c := dialRaw(t, srv, "alice", "phone")
	done := make(chan struct{})
	go func() { srv.Drain(t.Context()); close(done) }()
	g := c.next(protocol.TypeGoAway)
	if g.RetryAfter < 0 || g.RetryAfter > gateway.DefaultConfig().DrainTimeout.Milliseconds() {
		t.Fatalf("goaway retry_after_ms = %d", g.RetryAfter)
	}
	// New connections are refused while draining.
	if _, resp, err := dialRawErr(srv.URL, srv.Token("bob"), "d"); err == nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("dial while draining: err %v resp %v, want 503 with Retry-After", err, resp)
	}
	_ = c.ws.Close() // the client moves away
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Drain did not return after the last client left")
	}
	resp, err := http.Get(srv.HTTPURL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("readyz while draining = %d, want 503", resp.StatusCode)
	}
}

func TestHealthAndMetrics(t *testing.T) {
	srv := servertest.Start(t)
	alice := dialRaw(t, srv, "alice", "phone")
	conv := alice.openDirect("bob")
	mustOK(t, alice.sendText(conv, "a", "x"), protocol.TypeAck)
	for path, want := range map[string]string{
		"/healthz": "ok",
		"/readyz":  "ready",
		"/metrics": "parley_messages_stored_total 1",
	} {
		resp, err := http.Get(srv.HTTPURL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), want) {
			t.Fatalf("%s: %d, body lacks %q", path, resp.StatusCode, want)
		}
	}
}
