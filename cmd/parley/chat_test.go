package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/internal/servertest"
)

// syncBuffer is an io.Writer safe to read while the CLI writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func waitOutput(t *testing.T, out *syncBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(out.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestChatCLI drives `parley chat` through a pipe against a real server:
// it opens a direct conversation, sends, receives the peer's reply and
// lists the conversation.
func TestChatCLI(t *testing.T) {
	srv := servertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	bob, err := client.New(client.Config{URL: srv.URL, Token: srv.Token("bob"), Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = bob.Run(ctx) }()
	defer bob.Close()

	in, feed := io.Pipe()
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- runChat(ctx, []string{"-url", srv.URL, "-token", srv.Token("alice"), "-device", "cli", "-keys", t.TempDir()}, in, out)
	}()

	write := func(line string) {
		if _, err := io.WriteString(feed, line+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	write("/dm bob")
	write("hello from the terminal")
	waitOutput(t, out, "alice: hello from the terminal")

	// bob receives it through the SDK and answers.
	var conv uint64
	for conv == 0 {
		select {
		case ev := <-bob.Events():
			if ev.Kind == client.EventMessage && ev.Message.Body == "hello from the terminal" {
				conv = ev.ConvID
			}
		case <-ctx.Done():
			t.Fatal("bob never got the message")
		}
	}
	if _, err := bob.Send(ctx, conv, "hi terminal"); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, out, "bob: hi terminal")
	write("/list")
	waitOutput(t, out, "bob")
	write("/history 5")
	write("/quit")
	if err := <-done; err != nil {
		t.Fatalf("chat ended with %v\n%s", err, out.String())
	}
}
