package client

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/parley-im/parley/internal/bus"
	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/server"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/internal/store/cassandra"
	"github.com/parley-im/parley/internal/testbin"
)

// droppingBus loses the group deliveries of chosen seqs after they left
// the owner, as a gateway that took them and lost them would: the owner
// sees them delivered, nothing re-sends them.
type droppingBus struct {
	bus.Bus
	mu      sync.Mutex
	lose    map[uint64]bool
	dropped int
}

func (b *droppingBus) Publish(ctx context.Context, node string, d bus.Delivery) error {
	b.mu.Lock()
	lose := d.Group != nil && b.lose[d.Seq]
	if lose {
		b.dropped++
	}
	b.mu.Unlock()
	if lose {
		return nil
	}
	return b.Bus.Publish(ctx, node, d)
}

// TestGroupDeliveriesLostFilledBySeq: in cluster mode a medium group's
// messages leave the owner as one delivery per gateway naming the
// gateway's list of members (no per-member registry read); deliveries
// lost on the way leave holes that the device fills from history by seq,
// and every message is handed over once, in order.
func TestGroupDeliveriesLostFilledBySeq(t *testing.T) {
	redis, nats, cass := os.Getenv("PARLEY_TEST_REDIS"), os.Getenv("PARLEY_TEST_NATS"), os.Getenv("PARLEY_TEST_CASSANDRA")
	if redis == "" || nats == "" || cass == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires PARLEY_TEST_REDIS, PARLEY_TEST_NATS and PARLEY_TEST_CASSANDRA (scripts/engines/up.sh)")
		}
		t.Skip("cluster engines not configured; run scripts/engines/up.sh and source its env")
	}
	ks := fmt.Sprintf("parley_gd_%d", time.Now().UnixNano()%1_000_000_000)
	ns := "gd" + ks[len("parley_gd_"):]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := cassandra.Migrate(ctx, cassandra.Config{Hosts: []string{cass}, Keyspace: ks}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	t.Cleanup(func() {
		cl := gocql.NewCluster(cass)
		cl.Timeout = 30 * time.Second
		if s, err := cl.CreateSession(); err == nil {
			_ = s.Query("DROP KEYSPACE IF EXISTS " + ks).Exec()
			s.Close()
		}
		testbin.DropStreams(t, nats, ns)
	})
	lost := map[uint64]bool{4: true, 5: true, 9: true}
	db := &droppingBus{lose: lost}
	srv := servertest.Start(t,
		servertest.WithConfig(func(c *config.Config) {
			c.Cluster.Redis, c.Cluster.NATS, c.Cluster.CassandraHosts, c.Cluster.Keyspace, c.Cluster.Namespace = redis, nats, cass, ks, ns
			c.Attach.MaxFileBytes = 0 // cluster mode needs S3 for attachments
		}),
		servertest.WithChat(func(c *chat.Config) { c.SmallBelow, c.LargeAbove = 3, 100 }),
		servertest.WithDeps(func(d *server.Deps) {
			d.WrapBus = func(b bus.Bus) bus.Bus { db.Bus = b; return db }
		}))
	alice := startE2E(t, srv.URL, srv.Token("alice"), "d1", nil)
	bob := startE2E(t, srv.URL, srv.Token("bob"), "d1", nil)
	c := ctxT(t)
	conv, err := alice.CreateGroup(c, "g", []string{"bob", "carol"})
	if err != nil {
		t.Fatal(err)
	}
	if conv.Tier != "medium" {
		t.Fatalf("group of 3 has tier %q, want medium", conv.Tier)
	}
	// Both online in the owner's index before the sends (the first
	// message, seq 1, is the group's creation event).
	var last uint64
	for i := 1; i <= 12; i++ {
		ack, err := alice.Send(c, conv.ConvID, fmt.Sprint(i))
		if err != nil {
			t.Fatal(err)
		}
		last = ack.Seq
	}
	eventually(t, "every message at bob", func() bool {
		s := bob.rec.seqs(conv.ConvID)
		return len(s) > 0 && s[len(s)-1] == last && len(s) >= int(last)-1
	})
	seqs := bob.rec.seqs(conv.ConvID)
	wantRun(t, seqs, seqs[0], last)
	db.mu.Lock()
	dropped := db.dropped
	db.mu.Unlock()
	if dropped == 0 {
		t.Fatal("no group delivery was dropped: the group's messages did not go by gateway list")
	}
}
