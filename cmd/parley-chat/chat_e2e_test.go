package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/client/e2eechat"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// TestChatCLIE2E: `parley-chat` opens an end-to-end encrypted direct
// conversation, sends and reads encrypted messages, lists it as E2E and
// prints the safety number; its keys are files of mode 0600.
func TestChatCLIE2E(t *testing.T) {
	srv := servertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	bob, err := client.New(client.Config{URL: srv.URL, Token: srv.Token("bob"), Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = bob.Run(ctx) }()
	defer bob.Close()
	st := e2ee.NewMemoryStore()
	bobDev, err := e2ee.OpenDevice(st, e2ee.Address{User: "bob", Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	bm := e2eechat.New(bob, bobDev, st)
	if _, err := bm.PublishKeys(ctx, 5); err != nil {
		t.Fatal(err)
	}

	keys := t.TempDir()
	in, feed := io.Pipe()
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- runChat(ctx, []string{"-url", srv.URL, "-token", srv.Token("alice"), "-device", "cli", "-keys", keys}, in, out)
	}()
	write := func(line string) {
		if _, err := io.WriteString(feed, line+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	waitOutput(t, out, "connected")
	write("/sdm bob")
	waitOutput(t, out, "end-to-end encrypted direct with bob")
	write("a secret for bob")
	waitOutput(t, out, "alice: a secret for bob")

	// Bob decrypts it with the SDK and answers encrypted.
	var conv uint64
	for conv == 0 {
		select {
		case ev := <-bob.Events():
			if ev.Kind != client.EventMessage || ev.Message.Kind != protocol.KindText {
				continue
			}
			o, err := bm.Open(*ev.Message)
			if err != nil {
				t.Fatalf("bob cannot open: %v", err)
			}
			if o.Text != "a secret for bob" {
				t.Fatalf("bob read %q", o.Text)
			}
			if ev.Message.Body == o.Text {
				t.Fatal("the server carried plaintext")
			}
			conv = ev.ConvID
		case <-ctx.Done():
			t.Fatal("bob never got the message")
		}
	}
	if _, err := bm.SendDirect(ctx, conv, "alice", "an encrypted answer"); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, out, "bob: an encrypted answer")
	write("/list")
	waitOutput(t, out, "[e2e]")
	write("/safety bob")
	waitOutput(t, out, "safety number with bob/phone:")
	want := e2ee.FormatSafetyNumber(e2ee.SafetyNumber("bob", bobDev.IdentityKey(), "alice", mustIdentity(t, bm, ctx)))
	waitOutput(t, out, want)
	write("/quit")
	if err := <-done; err != nil {
		t.Fatalf("chat ended with %v\n%s", err, out.String())
	}
	if !regexp.MustCompile(`safety number with bob/phone: (\d{5} ){11}\d{5}`).MatchString(out.String()) {
		t.Fatalf("safety number not printed as 12 groups of 5 digits:\n%s", out.String())
	}
	files, _ := filepath.Glob(filepath.Join(keys, "alice", "cli", "*"))
	if len(files) == 0 {
		t.Fatal("no key files")
	}
	for _, f := range files {
		if st, err := os.Stat(f); err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: mode %v %v", f, st.Mode(), err)
		}
	}
}

func mustIdentity(t *testing.T, bm *e2eechat.Messenger, ctx context.Context) e2ee.PublicKey {
	k, ok, err := bm.Device().PeerIdentity(e2ee.Address{User: "alice", Device: "cli"})
	if err != nil || !ok {
		t.Fatalf("alice's identity unknown to bob: %v", err)
	}
	return k
}

// TestChatCLIE2EGroup: a CLI member of an E2E group someone else created
// reads its messages and answers with /use (members from conv_info).
func TestChatCLIE2EGroup(t *testing.T) {
	srv := servertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	alice, err := client.New(client.Config{URL: srv.URL, Token: srv.Token("alice"), Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = alice.Run(ctx) }()
	defer alice.Close()
	go func() {
		for range alice.Events() {
		}
	}()
	st := e2ee.NewMemoryStore()
	ad, _ := e2ee.OpenDevice(st, e2ee.Address{User: "alice", Device: "phone"})
	am := e2eechat.New(alice, ad, st)
	if _, err := am.PublishKeys(ctx, 3); err != nil {
		t.Fatal(err)
	}

	in, feed := io.Pipe()
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- runChat(ctx, []string{"-url", srv.URL, "-token", srv.Token("bob"), "-device", "cli", "-keys", t.TempDir()}, in, out)
	}()
	write := func(line string) {
		if _, err := io.WriteString(feed, line+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	waitOutput(t, out, "connected")
	g, err := alice.CreateGroupE2E(ctx, "crew", []string{"bob"})
	if err != nil {
		t.Fatal(err)
	}
	// The CLI publishes its keys once connected.
	for {
		devs, err := am.Devices(ctx, "bob", true)
		if err != nil {
			t.Fatal(err)
		}
		if len(devs) == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("bob's CLI never published keys")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := am.Send(ctx, g.ConvID, "hello crew"); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, out, "alice: hello crew")
	write("/use " + strconv.FormatUint(g.ConvID, 10))
	write("hello alice")
	waitOutput(t, out, "bob: hello alice")
	deadline := time.Now().Add(30 * time.Second)
	for {
		msgs, _, err := alice.History(ctx, g.ConvID, client.HistoryQuery{Forward: true, Limit: 50})
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, m := range msgs {
			if o, err := am.Open(m); err == nil && o.Text == "hello alice" && m.Sender == "bob" {
				found = true
			}
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alice never read bob's answer\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	write("/quit")
	if err := <-done; err != nil {
		t.Fatalf("chat ended with %v\n%s", err, out.String())
	}
}
