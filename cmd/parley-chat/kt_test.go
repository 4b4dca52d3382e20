package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/internal/servertest"
)

// TestChatCLIKeyTransparency: `parley-chat` monitors its user's entries in
// the key transparency log at start, quietly on an honest node, and warns
// when the server's answers stop verifying against the log keys it pinned
// (here: the server now signs with another deployment's keys).
func TestChatCLIKeyTransparency(t *testing.T) {
	srv := servertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	keys := t.TempDir()
	write, out, done := runE2ECLI(t, ctx, srv, "alice", keys)
	waitOutput(t, out, "connected")
	var dev string
	for dev == "" {
		if m, _ := filepath.Glob(filepath.Join(keys, "*", "alice", "cli", "kt%2Fmonitor")); len(m) == 1 {
			dev = filepath.Dir(m[0])
		}
		if ctx.Err() != nil {
			t.Fatalf("the log was never monitored\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	write("/quit")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if strings.Contains(strings.ToLower(out.String()), "key transparency") {
		t.Fatalf("warnings on an honest node:\n%s", out.String())
	}

	// Pin another deployment's log keys in alice's store: the server's
	// answers no longer verify, as if it had swapped its log.
	other := servertest.Start(t)
	c, err := client.New(client.Config{URL: other.URL, Token: other.Token("x"), Device: "d"})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Run(ctx) }()
	k, err := c.KTKeys(ctx)
	_ = c.Close()
	if err != nil {
		t.Fatal(err)
	}
	st, err := e2ee.OpenFileStore(dev)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(k)
	if err := st.Save("kt/keys", b); err != nil {
		t.Fatal(err)
	}
	if err := st.Delete("kt/head"); err != nil {
		t.Fatal(err)
	}
	st.Close()

	write, out, done = runE2ECLI(t, ctx, srv, "alice", keys)
	waitOutput(t, out, "! key transparency: a key answer for alice was refused")
	write("/quit")
	if err := <-done; err != nil {
		t.Fatalf("chat ended with %v\n%s", err, out.String())
	}
}
