package main

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/client/e2eechat"
	"github.com/parley-im/parley/internal/servertest"
)

// TestChatCLIE2ERotatesKeysAtStart: a parley-chat started on keys made
// three days ago replaces its signed prekey and last-resort KEM key on the
// server (e2eechat.DefaultRotation: every two days).
func TestChatCLIE2ERotatesKeysAtStart(t *testing.T) {
	srv := servertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	keys := t.TempDir()
	server, err := serverDir(srv.URL)
	if err != nil {
		t.Fatal(err)
	}

	// An earlier run of alice's parley-chat, three days ago.
	st, err := e2ee.OpenFileStore(filepath.Join(keys, server, "alice", "cli"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := e2ee.OpenDevice(st, e2ee.Address{User: "alice", Device: "cli"})
	if err != nil {
		t.Fatal(err)
	}
	d.SetClock(func() time.Time { return time.Now().Add(-72 * time.Hour) })
	c, err := client.New(client.Config{URL: srv.URL, Token: srv.Token("alice"), Device: "cli"})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); c.Run(runCtx) }()
	go func() {
		for range c.Events() {
		}
	}()
	if _, err := e2eechat.New(c, d, st).PublishKeys(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := st.Save("published", []byte{1}); err != nil {
		t.Fatal(err)
	}
	stop()
	c.Close()
	<-ran
	st.Close()

	bob := startE2EPeer(t, ctx, srv, "bob")
	if _, err := bob.c.OpenDirectE2E(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	ids := func() (uint32, uint32) {
		bs, err := bob.c.FetchBundles(ctx, "alice", "cli")
		if err != nil || len(bs) != 1 || bs[0].KEMPreKey == nil {
			t.Fatalf("alice's bundle: %+v %v", bs, err)
		}
		return bs[0].SignedPreKey.ID, bs[0].KEMPreKey.ID
	}
	spk1, kem1 := ids()

	write, out, done := runE2ECLI(t, ctx, srv, "alice", keys)
	waitOutput(t, out, "connected")
	for deadline := time.Now().Add(15 * time.Second); ; {
		spk, kem := ids()
		if spk != spk1 && kem != kem1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("keys of three days not rotated at start (signed prekey %d, KEM %d):\n%s", spk, kem, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	write("/quit")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
