package clustertest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/parley-im/parley/protocol"
)

// presenceWatcher is user's connection watching others' presence; it
// collects the presence pushes it receives.
type presenceWatcher struct {
	rc     *rawConn
	states chan protocol.PresenceState
}

// watchPresence connects user on g and watches users; it returns the
// connection and the states of the answer.
func watchPresence(t *testing.T, c *Cluster, g *Proc, user string, users ...string) (*presenceWatcher, []protocol.PresenceState) {
	t.Helper()
	rc, err := dialRaw(c, g, user, "watch")
	if err != nil {
		t.Fatal(err)
	}
	a, err := rc.call(protocol.Frame{Type: protocol.TypePresenceSub, Users: users}, 20*time.Second)
	if err != nil || a.Type != protocol.TypePresence {
		rc.close()
		t.Fatalf("presence_sub: %v %s", err, frameString(a))
	}
	w := &presenceWatcher{rc: rc, states: make(chan protocol.PresenceState, 100)}
	go func() {
		defer close(w.states)
		for {
			_ = rc.ws.SetReadDeadline(time.Now().Add(5 * time.Minute))
			_, data, err := rc.ws.ReadMessage()
			if err != nil {
				return
			}
			var f protocol.Frame
			if json.Unmarshal(data, &f) == nil && f.Type == protocol.TypePresence {
				for _, st := range f.States {
					w.states <- st
				}
			}
		}
	}()
	return w, a.States
}

// next waits for a push about user matching want.
func (w *presenceWatcher) next(t *testing.T, user, what string, want func(protocol.PresenceState) bool) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := time.After(120 * time.Second)
	for {
		select {
		case st, ok := <-w.states:
			if !ok {
				t.Fatalf("waiting for %s: the watcher's connection closed", what)
			}
			if st.UserID == user && want(st) {
				return time.Since(start)
			}
		case <-deadline:
			t.Fatalf("waiting for %s: no push in 120 s", what)
		}
	}
}

func isOnline(st protocol.PresenceState) bool  { return st.Online }
func isOffline(st protocol.PresenceState) bool { return !st.Online }

// TestPresenceAcrossGatewayDeathAndRedisRestart: presence lives in Redis
// (the session registry and last-seen keys) and is told on per-user-shard
// subjects. A watcher on one gateway sees a user on another come online,
// go offline with a last seen, come back, and go offline when that
// gateway is killed with -9 (once its registry lease lapses and a reread
// finds it gone: the documented bound). After a Redis restart, which
// loses the state of record, the gateways close their sessions, the
// clients connect again and presence is right again.
func TestPresenceAcrossGatewayDeathAndRedisRestart(t *testing.T) {
	redis := startPrivateRedis(t)
	c := Start(t, Options{Gateways: 2, Chats: 1, Redis: redis.addr, Extra: []string{"--presence.min-gap", "10ms", "--cluster.presence-resync", "2s"}})
	gwA, gwB := c.Gateways[0], c.Gateways[1]
	// alice and bob share a conversation, so bob may watch alice.
	setup, err := dialRaw(c, gwA, "alice", "setup")
	if err != nil {
		t.Fatal(err)
	}
	if r, err := setup.call(protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "bob"}, 20*time.Second); err != nil || r.Type != protocol.TypeConv {
		t.Fatalf("open direct: %v %s", err, frameString(r))
	}
	setup.close()

	w, initial := watchPresence(t, c, gwB, "bob", "alice")
	defer w.rc.close()
	if len(initial) != 1 || initial[0].Online {
		t.Fatalf("initial states = %+v, want alice offline", initial)
	}
	alice, err := dialRaw(c, gwA, "alice", "phone")
	if err != nil {
		t.Fatal(err)
	}
	w.next(t, "alice", "alice online", isOnline)
	before := time.Now().UnixMilli()
	alice.close()
	w.next(t, "alice", "alice offline with her last seen", func(st protocol.PresenceState) bool {
		return !st.Online && st.LastSeen >= before
	})
	alice, err = dialRaw(c, gwA, "alice", "phone")
	if err != nil {
		t.Fatal(err)
	}
	defer alice.close()
	w.next(t, "alice", "alice online again", isOnline)

	killed := time.Now().UnixMilli()
	c.Kill9(gwA)
	// Her gateway could not record her last seen: the process that found
	// her devices dead did.
	took := w.next(t, "alice", "alice offline after her gateway was killed, with a last seen", func(st protocol.PresenceState) bool {
		return !st.Online && st.LastSeen >= killed
	})
	t.Logf("alice seen offline %v after kill -9 of her gateway (bound: registry lease 30s + cluster.presence_resync, 2s here, + flush)", took.Round(100*time.Millisecond))

	// Redis restart: alice connects to the surviving gateway, Redis loses
	// everything, the gateway closes its sessions (lease lost), both
	// clients connect again and bob sees alice online.
	alice2, err := dialRaw(c, gwB, "alice", "laptop")
	if err != nil {
		t.Fatal(err)
	}
	w.next(t, "alice", "alice online on the other gateway", isOnline)
	redis.restart(time.Second)
	for range w.states { // the gateway closes bob's connection
	}
	alice2.close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		a, err := dialRaw(c, gwB, "alice", "laptop")
		if err == nil {
			defer a.close()
			w2, st := watchPresence(t, c, gwB, "bob", "alice")
			defer w2.rc.close()
			if len(st) == 1 && st[0].Online {
				break
			}
			w2.next(t, "alice", "alice online after the Redis restart", isOnline)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alice could not connect again after the Redis restart: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
