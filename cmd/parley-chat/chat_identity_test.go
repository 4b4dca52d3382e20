package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/client/e2eechat"
	"github.com/parley-im/parley/internal/servertest"
)

// cliRun is one parley-chat process in a test: its input and output.
type cliRun struct {
	t    *testing.T
	out  *syncBuffer
	feed *io.PipeWriter
	done chan error
}

func runCLI(t *testing.T, ctx context.Context, args ...string) *cliRun {
	t.Helper()
	in, feed := io.Pipe()
	r := &cliRun{t: t, out: &syncBuffer{}, feed: feed, done: make(chan error, 1)}
	go func() { r.done <- runChat(ctx, args, in, r.out) }()
	t.Cleanup(func() { feed.Close() })
	return r
}

func (r *cliRun) write(line string) {
	r.t.Helper()
	if _, err := io.WriteString(r.feed, line+"\n"); err != nil {
		r.t.Fatal(err)
	}
}

func (r *cliRun) quit() {
	r.t.Helper()
	r.write("/quit")
	if err := <-r.done; err != nil {
		r.t.Fatalf("chat ended with %v\n%s", err, r.out.String())
	}
}

// sdkDevice is an SDK device of user on srv with its own account key,
// its keys published.
func sdkDevice(t *testing.T, ctx context.Context, srv *servertest.Server, user, device string, replace bool) *e2eechat.Messenger {
	t.Helper()
	c, err := client.New(client.Config{URL: srv.URL, Token: srv.Token(user), Device: device})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Run(ctx) }()
	t.Cleanup(func() { c.Close() })
	go func() {
		for range c.Events() {
		}
	}()
	st := e2ee.NewMemoryStore()
	d, err := e2ee.OpenDevice(st, e2ee.Address{User: user, Device: device})
	if err != nil {
		t.Fatal(err)
	}
	m := e2eechat.New(c, d, st)
	if replace {
		if err := m.ReplaceAccount(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.PublishKeys(ctx, 5); err != nil {
		t.Fatal(err)
	}
	return m
}

// A verified peer reinstalls (a new account key): the CLI warns with the
// new safety number, refuses to send until /verify, then sends.
func TestChatCLIIdentityChange(t *testing.T) {
	srv := servertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sdkDevice(t, ctx, srv, "bob", "phone", false)
	cli := runCLI(t, ctx, "-url", srv.URL, "-token", srv.Token("alice"), "-device", "cli", "-keys", t.TempDir())
	waitOutput(t, cli.out, "connected")
	cli.write("/sdm bob")
	waitOutput(t, cli.out, "end-to-end encrypted direct with bob")
	cli.write("/verify bob")
	waitOutput(t, cli.out, "bob verified, safety number")
	cli.write("/safety bob")
	waitOutput(t, cli.out, "(verified)")
	cli.write("before the reinstall")
	waitOutput(t, cli.out, "alice: before the reinstall")

	// bob reinstalls: a new device state, a new account key.
	bob2 := sdkDevice(t, ctx, srv, "bob", "phone", true)
	cli.write("after the reinstall")
	waitOutput(t, cli.out, "SAFETY NUMBER CHANGED with bob")
	want, err := bob2.SafetyNumber(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, cli.out, "new safety number: "+e2ee.FormatSafetyNumber(want))
	waitOutput(t, cli.out, "/verify USER to send again")
	if strings.Contains(cli.out.String(), "alice: after the reinstall") {
		t.Fatalf("sent to a changed verified peer:\n%s", cli.out.String())
	}
	cli.write("/safety bob")
	waitOutput(t, cli.out, "CHANGED since you verified")
	cli.write("/verify bob")
	waitOutput(t, cli.out, "bob verified, safety number "+e2ee.FormatSafetyNumber(want))
	cli.write("verified again")
	waitOutput(t, cli.out, "alice: verified again")
	cli.quit()
}

// A second device of a user under another -keys directory is refused
// (account_conflict) with how to link it; /export-account and -link FILE
// link it; -new-account starts the account over.
func TestChatCLILinkDevice(t *testing.T) {
	srv := servertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	phone := runCLI(t, ctx, "-url", srv.URL, "-token", srv.Token("alice"), "-device", "phone", "-keys", t.TempDir())
	waitOutput(t, phone.out, "connected")
	exported := filepath.Join(t.TempDir(), "account.key")
	phone.write("/export-account " + exported)
	waitOutput(t, phone.out, "account key written to "+exported)
	if st, err := os.Stat(exported); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("exported account key: %v %v", st, err)
	}
	phone.quit()

	laptopKeys := t.TempDir()
	laptop := runCLI(t, ctx, "-url", srv.URL, "-token", srv.Token("alice"), "-device", "laptop", "-keys", laptopKeys)
	waitOutput(t, laptop.out, "connected")
	waitOutput(t, laptop.out, "already has devices under another account key")
	waitOutput(t, laptop.out, "-link FILE")
	waitOutput(t, laptop.out, "-new-account")
	laptop.quit()

	linked := runCLI(t, ctx, "-url", srv.URL, "-token", srv.Token("alice"), "-device", "laptop", "-keys", laptopKeys, "-link", exported)
	waitOutput(t, linked.out, "connected")
	linked.write("/sdm bob2")
	waitOutput(t, linked.out, "end-to-end encrypted direct with bob2")
	linked.quit()
	if strings.Contains(linked.out.String(), "account key") {
		t.Fatalf("the linked device was refused:\n%s", linked.out.String())
	}
	// Both devices are alice's now, under one account key.
	bob := sdkDevice(t, ctx, srv, "bob2", "phone", false)
	devs, err := bob.Devices(ctx, "alice", true)
	if err != nil || len(devs) != 2 {
		t.Fatalf("alice's certified devices as bob2 sees them: %v %v", devs, err)
	}

	// Starting over from a third directory drops the other two.
	fresh := runCLI(t, ctx, "-url", srv.URL, "-token", srv.Token("alice"), "-device", "tablet", "-keys", t.TempDir(), "-new-account")
	waitOutput(t, fresh.out, "connected")
	fresh.write("/sdm bob2")
	waitOutput(t, fresh.out, "end-to-end encrypted direct with bob2")
	fresh.quit()
	if devs, err := bob.Devices(ctx, "alice", true); err != nil || len(devs) != 1 || devs[0] != "tablet" {
		t.Fatalf("after -new-account alice's devices: %v %v", devs, err)
	}
}
