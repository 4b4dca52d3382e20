package faulttest

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
	"github.com/parley-im/parley/internal/bus"
	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/registry"
	"github.com/parley-im/parley/internal/server"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/cassandra"
	"github.com/parley-im/parley/internal/testbin"
)

// TestRandomFaultsCluster is the in-process run on the cluster engines
// (Redis registry, NATS bus and task ledger, Cassandra store with its
// outbox table): the same operations, faults and checks; a restart is a
// new process on the same keyspace, so the Cassandra outbox carries the
// fan-out over.
func TestRandomFaultsCluster(t *testing.T) {
	redis, nats, cass := os.Getenv("PARLEY_TEST_REDIS"), os.Getenv("PARLEY_TEST_NATS"), os.Getenv("PARLEY_TEST_CASSANDRA")
	if redis == "" || nats == "" || cass == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires PARLEY_TEST_REDIS, PARLEY_TEST_NATS and PARLEY_TEST_CASSANDRA (scripts/engines/up.sh)")
		}
		t.Skip("cluster engines not configured; run scripts/engines/up.sh and source its env")
	}
	sd := seed(t)
	ks := fmt.Sprintf("parley_ft_%d", time.Now().UnixNano()%1_000_000_000)
	cc := cassandra.Config{Hosts: []string{cass}, Keyspace: ks}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := cassandra.Migrate(ctx, cc); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	t.Cleanup(func() { dropKeyspace(t, cass, ks); testbin.DropStreams(t, nats, "ft"+ks[len("parley_ft_"):]) })
	n := newInproc(t, sd)
	n.srv.Close() // the embedded first start; from here on, the cluster engines
	cl := config.Default().Cluster
	cl.Redis, cl.NATS, cl.CassandraHosts, cl.Keyspace, cl.Namespace = redis, nats, cass, ks, "ft"+ks[len("parley_ft_"):]
	n.cluster = &cl
	n.restart()
	ops := 200
	if testing.Short() {
		ops = 80
	}
	run(t, n, sd, ops, 2)
}

// options are the in-process node's: tiers, fault wrappers, fast retries
// and, when set, the cluster engines.
func (n *inproc) options() []servertest.Option {
	return []servertest.Option{servertest.WithDataDir(n.dir), servertest.WithKey(n.key),
		servertest.WithChat(func(c *chat.Config) {
			c.SmallBelow, c.LargeAbove, c.InlineRows, c.EveryoneInterval = smallBelow, largeAbove, 3, 0
		}),
		servertest.WithConfig(func(c *config.Config) {
			if n.cluster != nil {
				c.Cluster = *n.cluster
				c.Attach.MaxFileBytes = 0 // attachments off: cluster mode needs S3 for them
			}
			c.Fanout.MinBackoff, c.Fanout.MaxBackoff, c.Fanout.Scan = 10*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond
		}),
		servertest.WithDeps(func(d *server.Deps) {
			d.WrapStore = func(s store.Store) store.Store { return flakyStore{s, n.f} }
			d.WrapRegistry = func(r registry.Registry) registry.Registry { return flakyRegistry{r, n.f} }
			d.WrapBus = func(b bus.Bus) bus.Bus { return flakyBus{b, n.f} }
		})}
}

// dropKeyspace removes the test's keyspace once the node is closed: tables
// left behind by many runs cost the single test node heap and start time.
func dropKeyspace(t *testing.T, host, ks string) {
	cl := gocql.NewCluster(host)
	cl.Timeout = 30 * time.Second
	s, err := cl.CreateSession()
	if err != nil {
		t.Logf("drop keyspace %s: %v", ks, err)
		return
	}
	defer s.Close()
	if err := s.Query("DROP KEYSPACE IF EXISTS " + ks).Exec(); err != nil {
		t.Logf("drop keyspace %s: %v", ks, err)
	}
}
