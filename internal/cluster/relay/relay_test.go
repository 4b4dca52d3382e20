package relay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	natsio "github.com/nats-io/nats.go"
	goredis "github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/internal/presence"
	"github.com/parley-im/parley/internal/presence/presencetest"
	"github.com/parley-im/parley/internal/registry"
	rredis "github.com/parley-im/parley/internal/registry/redis"
)

// The tests run against the Redis at $PARLEY_TEST_REDIS and the NATS
// server at $PARLEY_TEST_NATS (they skip without them, and fail under
// CI=true), each in a namespace of its own.

func connect(t testing.TB) *natsio.Conn {
	t.Helper()
	url := os.Getenv("PARLEY_TEST_NATS")
	if url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires NATS: PARLEY_TEST_NATS is unset (scripts/engines/nats.sh start)")
		}
		t.Skip("PARLEY_TEST_NATS is unset; run scripts/engines/nats.sh start")
	}
	nc, err := natsio.Connect(url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func redisClient(t testing.TB) *goredis.Client {
	t.Helper()
	addr := os.Getenv("PARLEY_TEST_REDIS")
	if addr == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires Redis: PARLEY_TEST_REDIS is unset (scripts/engines/redis.sh start)")
		}
		t.Skip("PARLEY_TEST_REDIS is unset; run scripts/engines/redis.sh start")
	}
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	return c
}

func namespace() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "rl" + hex.EncodeToString(b)
}

var quiet = slog.New(slog.DiscardHandler)

// cluster is a deployment's engines for a test: one Redis registry per
// process, as each process has its own.
type cluster struct {
	t      testing.TB
	ns     string
	rdb    *goredis.Client
	ttl    time.Duration // registry lease TTL
	lastTT time.Duration
}

func newCluster(t testing.TB, lastSeenTTL time.Duration) *cluster {
	c := &cluster{t: t, ns: namespace(), rdb: redisClient(t), ttl: 2 * time.Second, lastTT: lastSeenTTL}
	t.Cleanup(func() {
		ctx := context.Background()
		keys, _ := c.rdb.Keys(ctx, c.ns+":*").Result()
		if len(keys) > 0 {
			c.rdb.Del(ctx, keys...)
		}
	})
	return c
}

func (c *cluster) registry() *rredis.Registry {
	reg, err := rredis.New(c.rdb, rredis.Config{Prefix: c.ns + ":", TTL: c.ttl, LeaseCache: -1})
	if err != nil {
		c.t.Fatal(err)
	}
	return reg
}

// process starts a relay for node on its own NATS connection, running
// until the test ends.
func (c *cluster) process(node string, reg registry.Registry, members Members) *Relay {
	r := New(connect(c.t), c.rdb, reg, members, Config{Namespace: c.ns, Node: node, Shards: 16,
		LastSeenTTL: c.lastTT, Resync: 200 * time.Millisecond, Logger: quiet})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	c.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			c.t.Errorf("Run: %v", err)
		}
	})
	return r
}

// gateway is node's registry and relay with its lease kept alive until
// killed.
type gateway struct {
	node  string
	reg   *rredis.Registry
	relay *Relay
	stop  chan struct{}
	once  sync.Once
	mu    sync.Mutex
	sess  map[string]string // user/device → session
}

func (c *cluster) gateway(node string) *gateway {
	g := &gateway{node: node, reg: c.registry(), stop: make(chan struct{}), sess: map[string]string{}}
	g.relay = c.process(node, g.reg, nil)
	go func() {
		tick := time.NewTicker(c.ttl / 4)
		defer tick.Stop()
		for {
			select {
			case <-g.stop:
				return
			case <-tick.C:
				_ = g.reg.Refresh(context.Background(), node)
			}
		}
	}()
	c.t.Cleanup(g.kill)
	return g
}

func (g *gateway) kill() { g.once.Do(func() { close(g.stop) }) }

func (g *gateway) connect(t testing.TB, user, device string) {
	s := g.register(t, user, device)
	g.mu.Lock()
	g.sess[user+"/"+device] = s
	g.mu.Unlock()
}

// register connects a device the test will not disconnect (the test
// keeps nothing of it).
func (g *gateway) register(t testing.TB, user, device string) string {
	ctx := context.Background()
	s := fmt.Sprintf("%s-%s-%d", g.node, device, time.Now().UnixNano())
	if _, err := g.reg.Register(ctx, registry.Entry{User: user, Device: device, Node: g.node, Session: s, Since: time.Now().UnixMilli()}); err != nil {
		t.Fatal(err)
	}
	g.relay.Changed(ctx, user, true)
	return s
}

func (g *gateway) disconnect(t testing.TB, user, device string) {
	ctx := context.Background()
	g.mu.Lock()
	s := g.sess[user+"/"+device]
	g.mu.Unlock()
	if err := g.reg.Unregister(ctx, user, device, s); err != nil {
		t.Fatal(err)
	}
	g.relay.Changed(ctx, user, false)
}

// TestConformance runs the directory suite on Redis and NATS: two
// processes, devices connecting to the first; killing it stops its
// registry lease's refresh, as kill -9 of a gateway does.
func TestConformance(t *testing.T) {
	presencetest.Run(t, func(t *testing.T, ttl time.Duration) presencetest.Deployment {
		c := newCluster(t, ttl)
		g := c.gateway("gw-a")
		b := c.process("chat-b", c.registry(), nil)
		return presencetest.Deployment{A: g.relay, B: b,
			Connect:    func(u, d string) { g.connect(t, u, d) },
			Disconnect: func(u, d string) { g.disconnect(t, u, d) },
			Kill:       g.kill,
		}
	})
}

var _ presence.Directory = (*Relay)(nil)
