package e2eechat

import (
	"errors"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol/kt"
)

// Key transparency against the real node's log, on both store engines:
// every answer verified, checkpoints compared through messages.
func TestKTRealNode(t *testing.T) {
	t.Run("pebble", func(t *testing.T) { testKTRealNode(t, servertest.Start(t)) })
	t.Run("cassandra", func(t *testing.T) { testKTRealNode(t, cassandraServer(t)) })
}

func testKTRealNode(t *testing.T, srv *servertest.Server) {
	ctx := ctxT(t)
	alice := startDev(t, srv, "alice", "phone", 5)
	bob := startDev(t, srv, "bob", "phone", 5)
	alerts := []*ktEvents{watchKT(alice.m), watchKT(bob.m)}
	conv, err := alice.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	a1, err := alice.m.SendDirect(ctx, conv.ConvID, "bob", "hello")
	if err != nil {
		t.Fatal(err)
	}
	if o, err := bob.m.Open(firstMessage(t, bob, conv.ConvID, a1.Seq)); err != nil || o.Text != "hello" {
		t.Fatalf("bob: %+v %v", o, err)
	}
	ha, ok := alice.m.KTCheckpoint()
	if !ok || ha.Size == 0 {
		t.Fatalf("alice holds no checkpoint of the node's log: %+v", ha)
	}
	startDev(t, srv, "bob", "laptop", 5)
	b1, err := bob.m.SendDirect(ctx, conv.ConvID, "alice", "hi")
	if err != nil {
		t.Fatal(err)
	}
	if o, err := alice.m.Open(firstMessage(t, alice, conv.ConvID, b1.Seq)); err != nil || o.Text != "hi" {
		t.Fatalf("alice: %+v %v", o, err)
	}
	ha2, _ := alice.m.KTCheckpoint()
	hb, _ := bob.m.KTCheckpoint()
	if ha2 != hb || ha2.Size <= ha.Size {
		t.Fatalf("alice %+v, bob %+v after bob's laptop (alice had %d)", ha2, hb, ha.Size)
	}
	for _, a := range alerts {
		if evs := a.list(); len(evs) > 0 {
			t.Fatalf("key transparency events on an honest node: %+v", evs)
		}
	}
}

// The node is restarted on an old copy of its data directory (the log's
// last leaf lost), then appends again: alice, who saw the lost leaf,
// refuses the shorter log and then the diverged one.
func TestMaliciousServerKTRollbackRealNode(t *testing.T) {
	dir := t.TempDir()
	srv := servertest.Start(t, servertest.WithDataDir(dir))
	ctx := ctxT(t)
	store := e2ee.NewMemoryStore()
	alice := devOn(t, srv.URL, srv, "alice", "phone", store)
	if _, err := alice.m.PublishKeys(ctx, 5); err != nil {
		t.Fatal(err)
	}
	startDev(t, srv, "bob", "phone", 5)
	if _, err := alice.c.OpenDirectE2E(ctx, "bob"); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"alice", "bob"} {
		if _, err := alice.m.Devices(ctx, u, true); err != nil {
			t.Fatal(err)
		}
	}
	srv.Close()
	old := filepath.Join(t.TempDir(), "old")
	if out, err := exec.Command("cp", "-a", dir, old).CombinedOutput(); err != nil {
		t.Fatalf("copy the data directory: %v %s", err, out)
	}

	srv2 := servertest.Start(t, servertest.WithDataDir(dir))
	startDev(t, srv2, "bob", "laptop", 5)
	alice2 := devOn(t, srv2.URL, srv2, "alice", "phone", store)
	if _, err := alice2.m.Devices(ctx, "bob", true); err != nil {
		t.Fatal(err)
	}
	head, _ := alice2.m.KTCheckpoint()
	srv2.Close()

	srv3 := servertest.Start(t, servertest.WithDataDir(old))
	alice3 := devOn(t, srv3.URL, srv3, "alice", "phone", store)
	events := watchKT(alice3.m)
	if _, err := alice3.m.Devices(ctx, "alice", true); !errors.Is(err, ErrKTFork) || !errors.Is(err, kt.ErrRollback) {
		t.Fatalf("the node on its old log: %v, want ErrKTFork (rollback)", err)
	}
	startDev(t, srv3, "bob", "tablet", 5) // the old log grows another way
	if _, err := alice3.m.Devices(ctx, "bob", true); !errors.Is(err, ErrKTFork) {
		t.Fatalf("the diverged log: %v, want ErrKTFork", err)
	}
	if h, _ := alice3.m.KTCheckpoint(); h != head {
		t.Fatalf("alice's head moved from %+v to %+v", head, h)
	}
	if evs := events.list(); len(evs) != 2 {
		t.Fatalf("events %+v, want two", evs)
	}
}
