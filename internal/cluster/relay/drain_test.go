package relay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	natsio "github.com/nats-io/nats.go"

	pnats "github.com/parley-im/parley/internal/bus/nats"
	"github.com/parley-im/parley/internal/store"
)

// blockingTracker blocks its first Joined until release is closed.
type blockingTracker struct {
	entered, release chan struct{}
	joined           atomic.Int32
	returned         atomic.Bool
}

func (b *blockingTracker) Connected(context.Context, string) {}
func (b *blockingTracker) Disconnected(string)               {}
func (b *blockingTracker) Left(uint64, []string)             {}
func (b *blockingTracker) Joined(uint64, []store.Member) {
	if b.joined.Add(1) == 1 {
		close(b.entered)
		<-b.release
		b.returned.Store(true)
	}
}

func drainConn(t *testing.T) *natsio.Conn {
	t.Helper()
	url := os.Getenv("PARLEY_TEST_NATS")
	if url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires NATS: PARLEY_TEST_NATS is unset")
		}
		t.Skip("PARLEY_TEST_NATS is unset")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nc, err := pnats.Connect(ctx, pnats.ConnConfig{URL: url, Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// The relay's shutdown (Run's ctx ending) waits for a handler in
// progress, and no handler runs once Run has returned.
func TestRunDrainsHandlers(t *testing.T) {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	ns := "drain" + hex.EncodeToString(b)
	tr := &blockingTracker{entered: make(chan struct{}), release: make(chan struct{})}
	r := New(drainConn(t), nil, nil, tr, Config{Namespace: ns, Node: "a", Resync: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- r.Run(ctx) }()
	pub := drainConn(t)
	event, _ := json.Marshal(membersEvent{Node: "b", Conv: 1, Joined: []store.Member{{UserID: "u"}}})
	// Run subscribes asynchronously: publish until the handler runs.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		if err := pub.Publish(subjectMembers(ns), event); err != nil {
			t.Fatal(err)
		}
		select {
		case <-tr.entered:
			break wait
		case <-tick.C:
		case <-time.After(20 * time.Second):
			t.Fatal("the relay never handled a membership event")
		}
	}
	cancel()
	select {
	case err := <-ran:
		t.Fatalf("Run returned (%v) while a handler was running", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(tr.release)
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if !tr.returned.Load() {
		t.Fatal("Run returned before the handler did")
	}
	n := tr.joined.Load()
	for range 5 {
		_ = pub.Publish(subjectMembers(ns), event)
	}
	_ = pub.Flush()
	time.Sleep(100 * time.Millisecond)
	if got := tr.joined.Load(); got != n {
		t.Fatalf("%d handler calls after Run returned", got-n)
	}
}
