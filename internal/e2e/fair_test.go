package e2e

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/gateway"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// TestUserSendLimitSpansConnections: one user's sends on three connections
// share one budget; over it a send answers rate_limited with
// retry_after_ms, and is accepted after that delay; another user is not
// affected.
func TestUserSendLimitSpansConnections(t *testing.T) {
	srv := servertest.Start(t, servertest.WithGateway(func(g *gateway.Config) {
		g.UserSendRate, g.UserSendBurst = 2, 6
	}))
	var conns []*rawConn
	for i := 0; i < 3; i++ {
		conns = append(conns, dialRaw(t, srv, "flood", fmt.Sprint("d", i)))
	}
	other := dialRaw(t, srv, "other", "d")
	conv := conns[0].openDirect("other")
	start := time.Now()
	acked, limited := 0, 0
	var retry int64
	for i := 0; i < 30; i++ {
		r := conns[i%3].sendText(conv, fmt.Sprint("f", i), "x")
		switch {
		case r.Type == protocol.TypeAck:
			acked++
		case r.Code == protocol.CodeRateLimited && r.RetryAfter > 0:
			limited++
			retry = r.RetryAfter
		default:
			t.Fatalf("send %d: %s %s %q", i, r.Type, r.Code, r.Error)
		}
	}
	// The budget: the burst plus the rate over the time taken (+1 for
	// rounding), whatever the machine's speed.
	if most := 6 + int(2*time.Since(start).Seconds()) + 1; acked > most || limited == 0 {
		t.Fatalf("%d acked, %d rate_limited; want at most %d acked", acked, limited, most)
	}
	mustOK(t, other.sendText(conv, "o1", "not limited by flood's budget"), protocol.TypeAck)
	time.Sleep(time.Duration(retry) * time.Millisecond)
	mustOK(t, conns[0].sendText(conv, "after", "x"), protocol.TypeAck)
}

// TestConnRequestLimit: requests on one connection share its budget; pings
// are never limited.
func TestConnRequestLimit(t *testing.T) {
	srv := servertest.Start(t, servertest.WithGateway(func(g *gateway.Config) {
		g.ConnRequestRate, g.ConnRequestBurst = 1, 5
	}))
	c := dialRaw(t, srv, "alice", "d")
	limited := 0
	for i := 0; i < 20; i++ {
		r := c.call(protocol.Frame{Type: protocol.TypeConvList})
		if r.Type == protocol.TypeError {
			if r.Code != protocol.CodeRateLimited || r.RetryAfter <= 0 {
				t.Fatalf("request %d: %s %q", i, r.Code, r.Error)
			}
			limited++
		}
	}
	if limited == 0 {
		t.Fatal("20 requests against a burst of 5: none rate_limited")
	}
	for i := 0; i < 20; i++ {
		mustOK(t, c.call(protocol.Frame{Type: protocol.TypePing}), protocol.TypePong)
	}
}

// TestSessionCapsPerUser: a user holds at most max_sessions_per_user
// sessions on a node, and max_poll_sessions_per_user poll sessions among
// them; a device reconnecting replaces its session and is not refused.
func TestSessionCapsPerUser(t *testing.T) {
	srv := servertest.Start(t, servertest.WithGateway(func(g *gateway.Config) {
		g.MaxSessionsPerUser, g.MaxPollSessionsPerUser = 2, 1
	}))
	dialRaw(t, srv, "alice", "d1")
	dialRaw(t, srv, "alice", "d2")
	_, resp, err := dialRawErr(srv.URL, srv.Token("alice"), "d3")
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("third device: %v %v, want 429", resp, err)
	}
	dialRaw(t, srv, "alice", "d2") // replaces d2's session

	p1 := &pollClient{t: t, base: srv.HTTPURL, token: srv.Token("bob"), device: "p1"}
	if status, _ := p1.poll(0); status != http.StatusOK {
		t.Fatalf("first poll session: %d", status)
	}
	p2 := &pollClient{t: t, base: srv.HTTPURL, token: srv.Token("bob"), device: "p2"}
	if status, _ := p2.poll(0); status != http.StatusTooManyRequests {
		t.Fatalf("second poll session: %d, want 429", status)
	}
}
