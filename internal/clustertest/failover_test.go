package clustertest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestKillGatewayClientsResume: SDK clients spread over three gateways chat
// while the gateway holding most of them is killed with SIGKILL. Its clients
// move to the other gateways, and each client's delivered stream equals the
// stored history: per conversation strictly increasing and dense from the
// first snapshot, nothing lost, nothing twice.
func TestKillGatewayClientsResume(t *testing.T) {
	c := Start(t, Options{Gateways: 3, Chats: 2})
	l := startSDKLoad(t, c, 8, 40*time.Millisecond)
	time.Sleep(1500 * time.Millisecond)

	counts := nodeCounts(l.watchers)
	victim := c.Gateways[0]
	for _, g := range c.Gateways {
		if counts[g.Name] > counts[victim.Name] {
			victim = g
		}
	}
	var moved []*watcher
	for _, w := range l.watchers {
		if n := w.connections(); n[len(n)-1] == victim.Name {
			moved = append(moved, w)
		}
	}
	if len(moved) == 0 {
		t.Fatalf("no SDK client on any gateway: %v", counts)
	}
	c.Kill9(victim)
	time.Sleep(3 * time.Second)
	l.finish()

	for _, w := range moved {
		nodes := w.connections()
		if last := nodes[len(nodes)-1]; last == victim.Name {
			t.Errorf("%s was on %s when it was killed and never connected elsewhere (connections %v)", w.user, victim.Name, nodes)
		}
	}
	t.Logf("%d of %d clients were on the killed gateway %s and resumed elsewhere", len(moved), len(l.watchers), victim.Name)
}

// TestKillChatDuringSendStorm: raw-frame senders on every gateway retry each
// message with its client_msg_id until acknowledged while each chat process
// in turn is killed with SIGKILL and restarted. Every acknowledged message
// is stored exactly once at its seq, seqs are dense, no seq was
// acknowledged for two messages, and SDK clients receive every message in
// order.
func TestKillChatDuringSendStorm(t *testing.T) {
	c := Start(t, Options{Gateways: 2, Chats: 2})
	s := startRawStorm(t, c, 8)
	// Each chat process in turn dies with requests in flight and comes
	// back while the other serves.
	for _, p := range c.Chats {
		time.Sleep(1500 * time.Millisecond)
		c.Kill9(p)
		time.Sleep(1500 * time.Millisecond)
		c.Restart(p)
	}
	time.Sleep(1500 * time.Millisecond)
	s.finish()
}

// rawStorm is raw senders plus two SDK clients reading the same
// conversations.
type rawStorm struct {
	t        *testing.T
	c        *Cluster
	cs       convSet
	got      *acked
	stop     chan struct{}
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	watchers []*watcher
}

func startRawStorm(t *testing.T, c *Cluster, users int) *rawStorm {
	t.Helper()
	names := make([]string, users)
	for i := range names {
		names[i] = fmt.Sprintf("u%d", i)
	}
	s := &rawStorm{t: t, c: c, got: newAcked(), stop: make(chan struct{})}
	s.cs = setupConvs(t, c, c.Gateways[0], names)
	// u0 reads the group and its direct conversation, u3 the group and
	// another direct one.
	s.watchers = []*watcher{startWatcher(t, c, names[0]), startWatcher(t, c, names[3])}
	waitConnected(t, s.watchers, 20*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	s.cancel = cancel
	for _, u := range names {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			rawSender(ctx, c, u, s.cs.convsOf[u], s.got, s.stop, 30*time.Millisecond)
		}()
	}
	return s
}

// finish stops the senders (each finishes its pending message) and checks
// storage and the SDK clients' streams.
func (s *rawStorm) finish() {
	t := s.t
	t.Helper()
	close(s.stop)
	s.wg.Wait()
	s.cancel()
	hist := histories(t, s.c, s.cs)
	verifyStored(t, hist, s.got)
	waitCaughtUp(t, s.watchers, s.cs, hist, 30*time.Second)
	verifyStreams(t, s.watchers, hist)
}

// TestRollingRestartOfGateways: under continuous sends from SDK clients,
// every gateway in turn is stopped with SIGTERM (goaway, drain) and started
// again. Clients follow the goaways to other gateways; nothing is lost or
// duplicated.
func TestRollingRestartOfGateways(t *testing.T) {
	c := Start(t, Options{Gateways: 3, Chats: 2, Extra: []string{"--gateway.drain-timeout", "2s"}})
	l := startSDKLoad(t, c, 6, 40*time.Millisecond)
	time.Sleep(time.Second)
	for _, g := range c.Gateways {
		start := time.Now()
		c.Stop(g)
		d := time.Since(start)
		if d > 10*time.Second {
			t.Errorf("gateway %s took %v to drain and stop (drain timeout 2s)", g.Name, d)
		}
		t.Logf("%s drained and stopped in %v", g.Name, d.Round(10*time.Millisecond))
		c.Restart(g)
		time.Sleep(time.Second)
	}
	l.finish()
	// Each client started on some gateway, and every gateway was drained:
	// each must have connected at least twice.
	for _, w := range l.watchers {
		if n := w.connections(); len(n) < 2 {
			t.Errorf("%s connected only to %v although every gateway was restarted", w.user, n)
		}
	}
}
