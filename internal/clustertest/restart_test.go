package clustertest

import (
	"testing"
	"time"
)

// TestRedisRestartMidStorm: the cluster runs on a private memory-only Redis
// which is killed and started again, empty, during a send storm. Gateways
// find their registry lease gone and close their sessions, so clients
// register again: the SDK clients end with every message, and every
// acknowledged message is stored exactly once with dense seqs.
func TestRedisRestartMidStorm(t *testing.T) {
	redis := startPrivateRedis(t)
	c := Start(t, Options{Gateways: 2, Chats: 2, Redis: redis.addr})
	s := startRawStorm(t, c, 6)
	for _, w := range s.watchers {
		// Pushes stop until the gateways find their lease gone (up to
		// 10s); the reconnect sync may then be over the range limit.
		w.allowSkipping()
	}
	time.Sleep(2 * time.Second)
	before := make([]int, len(s.watchers))
	for i, w := range s.watchers {
		before[i] = len(w.connections())
	}
	restarted := time.Now()
	redis.restart(time.Second)
	// Gateways refresh their lease every TTL/3 (10s): within that they
	// notice it is gone and close their sessions.
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; i < len(s.watchers); {
		if len(s.watchers[i].connections()) > before[i] {
			if i++; i == len(s.watchers) {
				t.Logf("every SDK client reconnected within %v of the Redis restart", time.Since(restarted).Round(100*time.Millisecond))
			}
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("SDK client of %s kept its connection for 20s after Redis lost every registration (connections %v): gateways did not close sessions whose lease was lost",
				s.watchers[i].user, s.watchers[i].connections())
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second)
	s.finish()
}

// TestNATSRestartDeliveriesResume: the cluster runs on a private NATS
// (JetStream on disk) which is killed and restarted mid-conversation. Sends
// fail over the outage and are retried; once NATS is back, pushes flow
// again and the clients fill the gaps the outage left: every client ends
// with every message, in order, once.
func TestNATSRestartDeliveriesResume(t *testing.T) {
	nats := startPrivateNATS(t)
	c := Start(t, Options{Gateways: 2, Chats: 2, NATS: nats.URL()})
	l := startSDKLoad(t, c, 6, 40*time.Millisecond)
	time.Sleep(2 * time.Second)
	acked := l.got.total()
	restarted := time.Now()
	nats.restart(time.Second)
	// Deliveries resume: messages acknowledged after the restart reach the
	// clients (checked in full by finish).
	deadline := time.Now().Add(20 * time.Second)
	for l.got.total() < acked+20 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d messages acknowledged in the 20s after NATS came back (%d before)", l.got.total()-acked, acked)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("20 more messages acknowledged %v after NATS was killed (down 1s)", time.Since(restarted).Round(100*time.Millisecond))
	time.Sleep(2 * time.Second)
	l.finish()
}
