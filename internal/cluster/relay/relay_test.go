package relay

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	natsio "github.com/nats-io/nats.go"

	"github.com/parley-im/parley/internal/store"
)

// The tests run against the NATS server at $PARLEY_TEST_NATS (they skip
// without it, and fail under CI=true), each in a namespace of its own.

func connect(t *testing.T) *natsio.Conn {
	t.Helper()
	url := os.Getenv("PARLEY_TEST_NATS")
	if url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires NATS: PARLEY_TEST_NATS is unset (scripts/engines/nats.sh start)")
		}
		t.Skip("PARLEY_TEST_NATS is unset; run scripts/engines/nats.sh start")
	}
	nc, err := natsio.Connect(url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// counts is a Tracker that counts each user's devices, as the presence
// tracker does.
type counts struct {
	mu sync.Mutex
	m  map[string]int
}

func newCounts() *counts { return &counts{m: map[string]int{}} }

func (c *counts) Connected(_ context.Context, u string) { c.mu.Lock(); c.m[u]++; c.mu.Unlock() }
func (c *counts) Disconnected(u string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m[u]--; c.m[u] <= 0 {
		delete(c.m, u)
	}
}
func (c *counts) Joined(uint64, []store.Member) {}
func (c *counts) Left(uint64, []string)         {}

func (c *counts) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.m))
	for u, n := range c.m {
		out[u] = n
	}
	return out
}

// run starts r until the test ends.
func run(t *testing.T, r *Relay) context.CancelFunc {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return cancel
}

// eventually waits (generously: the machine is shared) for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached in 60 s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func sameCounts(got, want map[string]int) bool {
	if len(got) != len(want) {
		return false
	}
	for u, n := range want {
		if got[u] != n {
			return false
		}
	}
	return true
}

var quiet = slog.New(slog.DiscardHandler)

// TestListBeyondMaxPayload: a gateway with more users than one NATS
// message holds; a process that starts later gets them all (its list
// comes in chunks, none over the max payload), then follows events.
func TestListBeyondMaxPayload(t *testing.T) {
	ns := fmt.Sprintf("relaytest%d", time.Now().UnixNano())
	ncA, ncB := connect(t), connect(t)
	a := New(ncA, ns, "gw-a", newCounts(), time.Hour, quiet)
	want := map[string]int{}
	pad := strings.Repeat("x", 40)
	n := int(ncA.MaxPayload())/40 + 1000 // well over one message's worth of 40-byte ids
	for i := range n {
		u := fmt.Sprintf("u%d-%s", i, pad)
		a.Local(u, true)
		want[u]++
		if i%7 == 0 { // a second device
			a.Local(u, true)
			want[u]++
		}
	}
	if chunks := chunk(want, int(ncA.MaxPayload())-1024); len(chunks) < 2 {
		t.Fatalf("%d users fit in one chunk: the test needs more", n)
	}
	run(t, a)
	bc := newCounts()
	b := New(ncB, ns, "chat-b", bc, time.Hour, quiet)
	run(t, b) // its hello makes a send its digest; the mismatch fetches a's list
	eventually(t, "b's view of a's users", func() bool { return sameCounts(bc.snapshot(), want) })

	a.Local("late", true)
	a.Local(fmt.Sprintf("u0-%s", pad), false)
	want["late"] = 1
	want[fmt.Sprintf("u0-%s", pad)]--
	if want[fmt.Sprintf("u0-%s", pad)] == 0 {
		delete(want, fmt.Sprintf("u0-%s", pad))
	}
	eventually(t, "b following a's events", func() bool { return sameCounts(bc.snapshot(), want) })
}

// TestLostEventRepaired: an event that never reaches another process
// (core NATS is at most once) is found by the next digest and repaired
// from the node's list; a node that goes silent loses its users.
func TestLostEventRepaired(t *testing.T) {
	ns := fmt.Sprintf("relaytest%d", time.Now().UnixNano())
	ncA, ncB := connect(t), connect(t)
	const resync = 200 * time.Millisecond
	a := New(ncA, ns, "gw-a", newCounts(), resync, quiet)
	for i := range 50 {
		a.Local(fmt.Sprint("u", i), true)
	}
	stopA := run(t, a)
	bc := newCounts()
	b := New(ncB, ns, "chat-b", bc, resync, quiet)
	run(t, b)
	eventually(t, "b's first view", func() bool { return len(bc.snapshot()) == 50 })

	// Lost events: a's users change without an announcement reaching b.
	a.local.Lock()
	a.local.dig.set(a.local.users, "u3", 0)
	a.local.dig.set(a.local.users, "ghost", 2)
	a.local.seq += 2
	a.local.Unlock()
	eventually(t, "b repaired by a's digest", func() bool {
		got := bc.snapshot()
		return len(got) == 50 && got["u3"] == 0 && got["ghost"] == 2
	})

	// a dies without announcing its disconnects.
	stopA()
	eventually(t, "b dropping the silent node", func() bool { return len(bc.snapshot()) == 0 && len(b.Views()) == 0 })
}
