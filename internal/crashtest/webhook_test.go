package crashtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/protocol"
	"github.com/parley-im/parley/webhook"
)

// TestKill9WebhooksDelivered kills the server with SIGKILL while clients
// send and the webhook receiver is down, then again after it came back,
// and checks that every acknowledged message's message.created event is
// delivered (signed) after the restarts, the first arrivals of each
// conversation in seq order.
func TestKill9WebhooksDelivered(t *testing.T) {
	if testing.Short() {
		t.Skip("crash cycles take ~15s")
	}
	const secret = "crash-test-secret"
	var (
		mu        sync.Mutex
		up        bool
		first     = map[uint64][]uint64{} // conv → seqs in order of first arrival
		seen      = map[string]bool{}
		delivered = map[string]bool{}
		bad       []error
		log       []string // every arrival, for a failure's report
	)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ev, _, err := webhook.VerifyRequest(r, []byte(secret))
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			bad = append(bad, err)
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		log = append(log, fmt.Sprintf("%s conv %d seq %d attempt %s up %v", time.Now().Format("15:04:05.000"), ev.ConvID, ev.Seq, r.Header.Get(webhook.HeaderAttempt), up))
		if !seen[ev.ID] {
			seen[ev.ID] = true
			first[ev.ConvID] = append(first[ev.ConvID], ev.Seq)
		}
		if !up {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		delivered[ev.ID] = true
	}))
	defer recv.Close()

	cfgFile := filepath.Join(t.TempDir(), "parley.yaml")
	cfg := fmt.Sprintf(`webhooks:
  max_attempts: 1000
  min_backoff: 20ms
  max_backoff: 200ms
  endpoints:
    - name: bots
      url: %s
      secret: %s
      events: [message.created]
      timeout: 2s
`, recv.URL, secret)
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	n := &node{t: t, addr: freeAddr(t), dataDir: t.TempDir(), keyHex: hex.EncodeToString(key), args: []string{"--config", cfgFile}}
	n.start()

	admin, err := n.dial("w0")
	if err != nil {
		t.Fatal(err)
	}
	group, err := admin.call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: "hooks", Members: []string{"w1", "w2"}})
	if err != nil || group.Type != protocol.TypeConv {
		t.Fatalf("create group: %v %+v", err, group)
	}
	d, err := admin.call(protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "w1"})
	if err != nil || d.Type != protocol.TypeConv {
		t.Fatalf("open direct: %v %+v", err, d)
	}
	admin.ws.Close()
	convs := []uint64{group.Conv.ConvID, d.Conv.ConvID}

	got := &acked{seqs: map[uint64]map[uint64]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, u := range []string{"w0", "w1"} {
		wg.Go(func() { sender(ctx, n, u, convs, got, stop) })
	}
	// Receiver down: events queue up; the first kill leaves them queued
	// (and some fan-outs not yet run).
	time.Sleep(1500 * time.Millisecond)
	n.kill9()
	t.Log(time.Now().Format("15:04:05.000"), "killed 1")
	mu.Lock()
	up = true
	mu.Unlock()
	n.start()
	time.Sleep(1500 * time.Millisecond)
	n.kill9() // with deliveries in flight
	t.Log(time.Now().Format("15:04:05.000"), "killed 2")
	n.start()
	t.Log(time.Now().Format("15:04:05.000"), "started 3")
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	defer n.stop()
	got.mu.Lock()
	if got.err != nil {
		t.Fatal(got.err)
	}
	var want []string
	for conv, seqs := range got.seqs {
		for seq := range seqs {
			want = append(want, webhook.ID(conv, seq, webhook.MessageCreated))
		}
	}
	got.mu.Unlock()
	if len(want) < 20 {
		t.Fatalf("only %d messages acknowledged", len(want))
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		mu.Lock()
		missing := 0
		for _, id := range want {
			if !delivered[id] {
				missing++
			}
		}
		mu.Unlock()
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d acknowledged messages have no delivered message.created", missing, len(want))
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Fatalf("signature verification failed: %v", bad)
	}
	for conv, seqs := range first {
		for i := 1; i < len(seqs); i++ {
			if seqs[i] <= seqs[i-1] {
				for _, l := range log {
					t.Log(l)
				}
				t.Fatalf("conv %d: seq %d first arrived after seq %d", conv, seqs[i], seqs[i-1])
			}
		}
	}
	t.Logf("%d messages acknowledged, all delivered as webhooks across two kill -9", len(want))
}
