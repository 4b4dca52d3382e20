package main

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/internal/servertest"
)

// chatChildEnv holds the arguments (one per line) of the parley-chat that
// TestChatChildProcess runs as a second process.
const chatChildEnv = "PARLEY_CHAT_CHILD_ARGS"

// TestChatChildProcess is parley-chat in a second process, its standard
// input and output the pipes of the test that started it; run directly, it
// does nothing.
func TestChatChildProcess(t *testing.T) {
	v := os.Getenv(chatChildEnv)
	if v == "" {
		t.Skip("the second process of TestChatCLIE2EKeysLocked")
	}
	err := runChat(context.Background(), strings.Split(v, "\n"), os.Stdin, os.Stdout)
	if err != nil {
		os.Stdout.WriteString("exit: " + err.Error() + "\n")
		os.Exit(1)
	}
	os.Exit(0)
}

// TestChatCLIE2EKeysLocked: parley-chat in a second process, on a device
// whose key directory another process holds, says so and opens no E2E
// conversation (it would encrypt with the same message keys); once the
// holder lets go, the next command gets the keys.
func TestChatCLIE2EKeysLocked(t *testing.T) {
	srv := servertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	startE2EPeer(t, ctx, srv, "bob")
	keys := t.TempDir()
	server, err := serverDir(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	holder, err := e2ee.OpenFileStore(filepath.Join(keys, server, "alice", "cli"))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()

	args := []string{"-url", srv.URL, "-token", srv.Token("alice"), "-device", "cli", "-keys", keys}
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestChatChildProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), chatChildEnv+"="+strings.Join(args, "\n"))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	out := &syncBuffer{}
	copied := make(chan struct{})
	go func() { io.Copy(out, stdout); close(copied) }()
	const locked = "another parley-chat is using the keys of device cli"
	waitOutput(t, out, locked) // at connect, publishing keys
	io.WriteString(stdin, "/sdm bob\n")
	for deadline := time.Now().Add(15 * time.Second); strings.Count(out.String(), locked) < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("/sdm on held keys did not say so:\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if strings.Contains(out.String(), "end-to-end encrypted direct") {
		t.Fatalf("an E2E conversation opened on keys another process holds:\n%s", out.String())
	}

	if err := holder.Close(); err != nil {
		t.Fatal(err)
	}
	io.WriteString(stdin, "/sdm bob\n")
	waitOutput(t, out, "end-to-end encrypted direct with bob")
	io.WriteString(stdin, "/quit\n")
	<-copied
	if err := cmd.Wait(); err != nil {
		t.Fatalf("parley-chat: %v\n%s", err, out.String())
	}
	// It released the directory on quitting.
	again, err := e2ee.OpenFileStore(filepath.Join(keys, server, "alice", "cli"))
	if err != nil {
		t.Fatalf("after parley-chat quit: %v", err)
	}
	again.Close()
}
