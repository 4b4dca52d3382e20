package client

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/gateway"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// Cluster tests: Config.URLs against two real nodes. The nodes share a
// token key and nothing else (each has its own store), so these tests are
// about where the client connects, not about message continuity.

// startClusterClient starts a client over urls that tries urls[0] first.
func startClusterClient(t *testing.T, urls []string, token, device string) *runningClient {
	t.Helper()
	cfg := testConfig(t, "", token, device)
	cfg.URLs = urls
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	c.rot = newRotation(urls, func(int) int { return 0 })
	return run(t, c, true)
}

func connectedNodes(rc *runningClient) []string {
	evs, _ := rc.rec.all(EventConnected)
	var nodes []string
	for _, ev := range evs {
		nodes = append(nodes, ev.Hello.Node)
	}
	return nodes
}

type clusterMember struct {
	rc *runningClient
	px *proxy // in front of the first node, to see the goaway and count dials
}

// twoNodes starts nodes test1 (with drainTimeout) and test2 and two clients
// connected to test1 that have test2 next in their rotation.
func twoNodes(t *testing.T, drainTimeout time.Duration) (*servertest.Server, []clusterMember) {
	t.Helper()
	srv1 := servertest.Start(t, servertest.WithGateway(func(g *gateway.Config) { g.DrainTimeout = drainTimeout }))
	srv2 := servertest.Start(t, servertest.WithNode("test2"), servertest.WithKey(srv1.Key()))
	var members []clusterMember
	for _, user := range []string{"alice", "bob"} {
		px := newProxy(t, srv1.URL)
		rc := startClusterClient(t, []string{px.url(), srv2.URL}, srv1.Token(user), "d1")
		eventually(t, user+" connected", func() bool { return rc.rec.count(EventConnected) == 1 })
		if h, _ := rc.Hello(); h.Node != "test1" {
			t.Fatalf("%s first connected to %q, want test1", user, h.Node)
		}
		members = append(members, clusterMember{rc, px})
	}
	return srv1, members
}

// movedAfterGoAway checks that m is now on test2, got there no earlier than
// its goaway asked, and never dialled the drained node again; it returns
// the delay the goaway asked for.
func movedAfterGoAway(t *testing.T, m clusterMember) time.Duration {
	t.Helper()
	eventually(t, "moved to test2", func() bool { return m.rc.rec.count(EventConnected) == 2 })
	evs, at := m.rc.rec.all(EventConnected)
	if evs[1].Hello.Node != "test2" {
		t.Fatalf("reconnected to %v, want test2", connectedNodes(m.rc))
	}
	if h, _ := m.rc.Hello(); h.Node != "test2" {
		t.Fatalf("Hello().Node = %q, want test2", h.Node)
	}
	goaways := m.px.seen(toClient, protocol.TypeGoAway)
	if len(goaways) != 1 {
		t.Fatalf("%d goaways seen, want 1", len(goaways))
	}
	asked := time.Duration(goaways[0].f.RetryAfter) * time.Millisecond
	if waited := at[1].Sub(goaways[0].at); waited < asked {
		t.Fatalf("connected elsewhere %v after goaway, want at least its retry_after_ms %v", waited, asked)
	}
	if n := len(m.px.dials()); n != 1 {
		t.Fatalf("%d dials to the drained node, want 1", n)
	}
	return asked
}

// A draining node's goaway makes its clients leave by themselves once the
// delay it gave each of them is over, for the next gateway: the drain ends
// early instead of at its timeout, and nobody comes back to the drained node.
func TestClusterDrainMovesToNextGateway(t *testing.T) {
	const drainTimeout = 4 * time.Second
	srv1, members := twoNodes(t, drainTimeout)
	start := time.Now()
	drained := make(chan time.Duration, 1)
	go func() { srv1.Drain(context.Background()); drained <- time.Since(start) }()
	var longest time.Duration
	for _, m := range members {
		longest = max(longest, movedAfterGoAway(t, m))
		if dis, _ := m.rc.rec.all(EventDisconnected); len(dis) != 1 || !errors.Is(dis[0].Err, errMoving) {
			t.Fatalf("disconnect events %+v, want one: the client leaving after goaway", dis)
		}
	}
	if longest == 0 {
		t.Fatal("every goaway asked for no delay; the delay went untested")
	}
	select {
	case took := <-drained:
		if took >= drainTimeout-500*time.Millisecond {
			t.Fatalf("drain took %v: the clients did not leave by themselves", took)
		}
	case <-time.After(waitLimit):
		t.Fatal("drain did not end")
	}
}

// A node that stops right after its goaway closes the connections (1001)
// before their delay is over; the clients still wait out the rest of it.
func TestClusterGoAwayDelayOutlivesTheConnection(t *testing.T) {
	srv1, members := twoNodes(t, 4*time.Second)
	drained := make(chan struct{})
	go func() { srv1.Drain(context.Background()); close(drained) }()
	for _, m := range members {
		eventually(t, "goaway", func() bool { return len(m.px.seen(toClient, protocol.TypeGoAway)) == 1 })
	}
	srv1.Close()
	<-drained
	var longest time.Duration
	for _, m := range members {
		longest = max(longest, movedAfterGoAway(t, m))
	}
	if longest == 0 {
		t.Fatal("every goaway asked for no delay; the delay went untested")
	}
}

// A dead gateway in the list is skipped on the next attempt, and a node
// that stops (1001 without goaway) is left for the next one at once.
func TestClusterDeadAndStoppingNodesAreLeft(t *testing.T) {
	srv1 := servertest.Start(t)
	srv2 := servertest.Start(t, servertest.WithNode("test2"), servertest.WithKey(srv1.Key()))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "ws://" + ln.Addr().String()
	ln.Close()
	rc := startClusterClient(t, []string{dead, srv1.URL, srv2.URL}, srv1.Token("alice"), "d1")
	eventually(t, "connected past the dead gateway", func() bool { return rc.rec.count(EventConnected) == 1 })
	if nodes := connectedNodes(rc); nodes[0] != "test1" {
		t.Fatalf("connected to %v, want test1 after the dead one", nodes)
	}
	stopped := time.Now()
	srv1.Close()
	eventually(t, "moved to test2", func() bool { return rc.rec.count(EventConnected) == 2 })
	_, at := rc.rec.all(EventConnected)
	if nodes := connectedNodes(rc); nodes[1] != "test2" {
		t.Fatalf("connected to %v, want test2 after test1 stopped", nodes)
	}
	// One backoff step (MaxBackoff 200ms here) plus a handshake.
	if took := at[1].Sub(stopped); took > 2*time.Second {
		t.Fatalf("took %v to move on", took)
	}
	if dis, _ := rc.rec.all(EventDisconnected); len(dis) != 1 || !strings.Contains(dis[0].Err.Error(), "1001") {
		t.Fatalf("disconnect events %+v, want one 1001 close", dis)
	}
}

// With one URL there is no next gateway: a client leaving a draining node
// says it reconnects, and still leaves as a cluster client does.
func TestDrainOneURLSaysReconnecting(t *testing.T) {
	srv := servertest.Start(t, servertest.WithGateway(func(g *gateway.Config) { g.DrainTimeout = 2 * time.Second }))
	c, err := New(testConfig(t, srv.URL, srv.Token("alice"), "d1"))
	if err != nil {
		t.Fatal(err)
	}
	rc := run(t, c, true)
	eventually(t, "connected", func() bool { return rc.rec.count(EventConnected) == 1 })
	go srv.Drain(context.Background())
	eventually(t, "left", func() bool { return rc.rec.count(EventDisconnected) == 1 })
	dis, _ := rc.rec.all(EventDisconnected)
	msg := dis[0].Err.Error()
	if !errors.Is(dis[0].Err, errMoving) || strings.Contains(msg, "next gateway") || !strings.Contains(msg, "reconnecting") {
		t.Fatalf("the one-URL client left with %q, want a goaway that says it reconnects", msg)
	}
}
