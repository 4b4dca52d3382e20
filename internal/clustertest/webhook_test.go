package clustertest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/protocol"
	"github.com/parley-im/parley/webhook"
)

// TestClusterWebhooks: on the real engines, a chat process delivers the
// webhooks of what its fan-out ran: a receiver that fails at first gets
// every message.created and recipient.offline (bob is offline, carol on
// another gateway is reached), signed and in seq order.
func TestClusterWebhooks(t *testing.T) {
	const secret = "cluster-secret"
	var (
		mu       sync.Mutex
		calls    int
		arrivals = map[uint64][]webhook.Event{}
		acked    = map[string]webhook.Event{}
		bad      []error
	)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ev, _, err := webhook.VerifyRequest(r, []byte(secret))
		mu.Lock()
		defer mu.Unlock()
		calls++
		if err != nil {
			bad = append(bad, err)
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		arrivals[ev.ConvID] = append(arrivals[ev.ConvID], ev)
		if calls <= 5 {
			http.Error(w, "warming up", http.StatusInternalServerError)
			return
		}
		acked[ev.ID] = ev
	}))
	defer recv.Close()
	cfg := filepath.Join(t.TempDir(), "parley.yaml")
	body := fmt.Sprintf("webhooks:\n  min_backoff: 20ms\n  max_backoff: 200ms\n  endpoints:\n    - {name: push, url: %q, secret: %q, preview: sender}\n", recv.URL, secret)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	c := Start(t, Options{Gateways: 2, Chats: 1, Extra: []string{"--config", cfg}})
	alice := dial(t, c, c.Gateways[0], "alice", "d")
	dial(t, c, c.Gateways[1], "carol", "d")
	group := must(t, alice.call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: "g", Members: []string{"bob", "carol"}}), protocol.TypeConv).Conv.ConvID
	var seqs []uint64
	for i := range 20 {
		a := must(t, alice.call(protocol.Frame{Type: protocol.TypeSend, ConvID: group, ClientMsgID: fmt.Sprint("m", i), Body: fmt.Sprint("hi ", i)}), protocol.TypeAck)
		seqs = append(seqs, a.Seq)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		missing := 0
		for _, s := range seqs {
			for _, typ := range []string{webhook.MessageCreated, webhook.RecipientOffline} {
				if _, ok := acked[webhook.ID(group, s, typ)]; !ok {
					missing++
				}
			}
		}
		mu.Unlock()
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d events missing; chat log:\n%s", missing, tail(c.Log(c.Chats[0]), 30))
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Fatalf("verification failed: %v", bad)
	}
	evs := arrivals[group]
	for i := 1; i < len(evs); i++ {
		a, b := evs[i-1], evs[i]
		if a.Seq > b.Seq || (a.Seq == b.Seq && slices.Index(webhook.Types, a.Type) > slices.Index(webhook.Types, b.Type)) {
			t.Fatalf("%s arrived after %s", b.ID, a.ID)
		}
	}
	var d webhook.OfflineData
	if err := json.Unmarshal(acked[webhook.ID(group, seqs[7], webhook.RecipientOffline)].Data, &d); err != nil ||
		!slices.Equal(d.Users, []string{"bob"}) || d.Preview == nil || d.Preview.Sender != "alice" || d.Preview.Body != "" {
		t.Fatalf("recipient.offline %+v (%v): want bob only, sender preview", d, err)
	}
}
