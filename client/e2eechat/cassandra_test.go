package e2eechat

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/parley-im/parley/internal/server"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/cassandra"
	"github.com/parley-im/parley/protocol"
)

// E2E traffic through a node whose chat service stores in Cassandra: no
// plaintext canary in any Cassandra table afterwards.
func TestE2ENoPlaintextInCassandra(t *testing.T) {
	cs, cfg := cassandraStore(t)
	ctx := ctxT(t)
	ks := cfg.Keyspace
	admin, err := func() (*gocql.Session, error) {
		c := gocql.NewCluster(cfg.Hosts...)
		c.Keyspace = ks
		c.Timeout = 30 * time.Second
		return c.CreateSession()
	}()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	logs := &syncBuf{}
	srv := servertest.Start(t, servertest.WithDeps(func(d *server.Deps) {
		d.WrapStore = func(store.Store) store.Store { return cs }
		d.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}))
	alice := startDev(t, srv, "alice", "phone", 3)
	bob := startDev(t, srv, "bob", "phone", 3)
	conv, err := alice.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	a1, err := alice.m.SendDirect(ctx, conv.ConvID, "bob", canary+" direct")
	if err != nil {
		t.Fatal(err)
	}
	wantText(t, "bob", bob.read(t, conv.ConvID), a1.Seq, canary+" direct")
	g, err := alice.c.CreateGroupE2E(ctx, "g", []string{"bob"})
	if err != nil {
		t.Fatal(err)
	}
	g1, err := alice.m.SendGroup(ctx, g.ConvID, []string{"alice", "bob"}, canary+" group")
	if err != nil {
		t.Fatal(err)
	}
	wantText(t, "bob", bob.read(t, g.ConvID), g1.Seq, canary+" group")
	ed, err := alice.m.EditGroup(ctx, g.ConvID, g1.Seq, []string{"alice", "bob"}, canary+" group edited")
	if err != nil {
		t.Fatal(err)
	}
	// The edited target as Cassandra rewrote it and the edit event check
	// out against their sealed labels; so does the sealed recall, whose
	// envelope the recall event keeps.
	bobTablet := startDev(t, srv, "bob", "tablet", 3)
	alice.read(t, g.ConvID) // device_added: alice's next distribution reaches the tablet
	g2, err := alice.m.SendGroup(ctx, g.ConvID, []string{"alice", "bob"}, canary+" group, for the tablet")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := alice.m.EditGroup(ctx, g.ConvID, g2.Seq, []string{"alice", "bob"}, canary+" group, for the tablet, edited"); err != nil {
		t.Fatal(err)
	}
	wantText(t, "bob", bob.read(t, g.ConvID), ed.Seq, canary+" group edited")
	wantText(t, "bob", bob.read(t, g.ConvID), g1.Seq, canary+" group edited") // its edit applied to the copy
	got := bobTablet.read(t, g.ConvID)                                        // the rewritten target first, then its edit
	wantText(t, "bob's tablet", got, g2.Seq, canary+" group, for the tablet, edited")
	if _, err := alice.m.RecallDirect(ctx, conv.ConvID, a1.Seq, "bob"); err != nil {
		t.Fatal(err)
	}
	for _, m := range bob.history(t, conv.ConvID) {
		if _, err := bob.m.Open(m); err != nil && m.Kind == protocol.KindRecall {
			t.Fatalf("alice's recall on Cassandra: %v", err)
		}
	}
	if o, err := bob.m.Open(firstMessage(t, bob, conv.ConvID, a1.Seq)); err != nil || !o.Recalled {
		t.Fatalf("alice's recalled message on Cassandra: %+v %v", o, err)
	}

	var tables []string
	it := admin.Query(`SELECT table_name FROM system_schema.tables WHERE keyspace_name = ?`, ks).Iter()
	var name string
	for it.Scan(&name) {
		tables = append(tables, name)
	}
	if err := it.Close(); err != nil || len(tables) < 10 {
		t.Fatalf("tables %v %v", tables, err)
	}
	rows := 0
	for _, tbl := range tables {
		iter := admin.Query(`SELECT * FROM ` + tbl).Iter()
		for {
			row := map[string]any{}
			if !iter.MapScan(row) {
				break
			}
			rows++
			// %s prints blobs and text as text.
			if s := fmt.Sprintf("%s", row); strings.Contains(s, "CANARY-7f3a9c") {
				t.Fatalf("plaintext canary in table %s: %s", tbl, s)
			}
		}
		if err := iter.Close(); err != nil {
			t.Fatalf("scan %s: %v", tbl, err)
		}
	}
	if rows < 10 {
		t.Fatalf("only %d rows: the check would prove nothing", rows)
	}
	srv.Close()
	assertNoCanary(t, srv.DataDir, logs.String())
}

// cassandraStore is a store on a fresh keyspace of PARLEY_TEST_CASSANDRA
// (skipped without it, except under CI), dropped after the test; cfg
// names the keyspace.
func cassandraStore(t *testing.T) (store.Store, cassandra.Config) {
	t.Helper()
	addr := os.Getenv("PARLEY_TEST_CASSANDRA")
	if addr == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires Cassandra: set PARLEY_TEST_CASSANDRA")
		}
		t.Skip("PARLEY_TEST_CASSANDRA not set")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := cassandra.Config{Hosts: []string{addr}, Keyspace: fmt.Sprintf("parley_e2ee_%d", time.Now().UnixNano()%1_000_000_000)}
	if err := cassandra.Migrate(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	cs, err := cassandra.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.Close()
		c := gocql.NewCluster(addr)
		c.Timeout = 30 * time.Second
		if admin, err := c.CreateSession(); err == nil {
			admin.Query(`DROP KEYSPACE IF EXISTS ` + cfg.Keyspace).Exec()
			admin.Close()
		}
	})
	return cs, cfg
}

// cassandraServer starts a node whose chat service stores in a fresh
// Cassandra keyspace (see cassandraStore).
func cassandraServer(t *testing.T) *servertest.Server {
	t.Helper()
	cs, _ := cassandraStore(t)
	return servertest.Start(t, servertest.WithDeps(func(d *server.Deps) {
		d.WrapStore = func(store.Store) store.Store { return cs }
	}))
}
