package clustertest

import (
	"testing"
	"time"
)

// TestRedisRestartMidStorm: the cluster runs on a private memory-only Redis
// which is killed and started again, empty, during a send storm. The
// gateways find their registry lease gone and register their open
// sessions again (Restore): the SDK clients stay connected, pushes reach
// them again (the holes the outage left are fetched), and every
// acknowledged message is stored exactly once with dense seqs.
func TestRedisRestartMidStorm(t *testing.T) {
	redis := startPrivateRedis(t)
	c := Start(t, Options{Gateways: 2, Chats: 2, Redis: redis.addr})
	s := startRawStorm(t, c, 6)
	time.Sleep(2 * time.Second)
	before := make([]int, len(s.watchers))
	for i, w := range s.watchers {
		before[i] = len(w.connections())
	}
	restarted := time.Now()
	redis.restart(time.Second)
	// A message of the group acknowledged once Redis is back must reach
	// every client over the connection it had: the gateways notice the lost
	// lease within a refresh (registry TTL/3, 10 s) and register the
	// sessions again.
	time.Sleep(500 * time.Millisecond)
	target := s.got.maxSeq(s.cs.group)
	deadline := time.Now().Add(25 * time.Second)
	for _, w := range s.watchers {
		for w.lastSeq(s.cs.group) < target {
			if time.Now().After(deadline) {
				t.Fatalf("SDK client of %s has the group up to seq %d, not %d acknowledged after the Redis restart, 25s later: pushes did not resume",
					w.user, w.lastSeq(s.cs.group), target)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Logf("pushes reached every SDK client %v after the Redis restart (down 1s)", time.Since(restarted).Round(100*time.Millisecond))
	for i, w := range s.watchers {
		if n := len(w.connections()); n != before[i] {
			t.Errorf("SDK client of %s connected %d times across the Redis restart (%v): its session should have been registered again, not closed",
				w.user, n-before[i], w.connections())
		}
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
