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

// TestClusterWebhooksSurviveChatDeath: the webhook queue of cluster mode
// is JetStream, shared by the chat processes. With the receiver down,
// two senders per conversation send to conversations owned by two chat
// processes; the owner of some of them is killed with SIGKILL right after
// the last ACK and never comes back. Once the receiver is up, the
// survivor (the new owner of the dead process's partitions) delivers
// every ACKed message's message.created, and the first arrivals of each
// conversation are in seq order.
func TestClusterWebhooksSurviveChatDeath(t *testing.T) {
	const secret = "cluster-secret"
	var (
		mu    sync.Mutex
		up    bool
		first = map[uint64][]uint64{} // conv → seqs in first-arrival order
		seen  = map[string]bool{}
		bad   []error
	)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if !up {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		ev, _, err := webhook.VerifyRequest(r, []byte(secret))
		if err != nil {
			bad = append(bad, err)
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		if !seen[ev.ID] {
			seen[ev.ID] = true
			first[ev.ConvID] = append(first[ev.ConvID], ev.Seq)
		}
	}))
	defer recv.Close()
	cfg := filepath.Join(t.TempDir(), "parley.yaml")
	body := fmt.Sprintf("webhooks:\n  min_backoff: 20ms\n  max_backoff: 300ms\n  max_attempts: 100000\n  endpoints:\n    - {name: bots, url: %q, secret: %q, events: [message.created]}\n", recv.URL, secret)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	c := Start(t, Options{Gateways: 2, Chats: 2, Extra: []string{"--config", cfg}})
	time.Sleep(3 * time.Second) // the partitions spread over both chat processes
	alice := dial(t, c, c.Gateways[0], "alice", "d")
	var convs []uint64
	owners := map[string][]uint64{}
	for i := 0; i < 40 && (len(owners) < 2 || len(convs) < 6); i++ {
		conv := must(t, alice.call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: fmt.Sprint("g", i), Members: []string{"bob"}}), protocol.TypeConv).Conv.ConvID
		node, _ := c.waitOwner(conv, "", 10*time.Second)
		convs = append(convs, conv)
		owners[node] = append(owners[node], conv)
	}
	if len(owners) < 2 {
		t.Fatalf("owners %v: the partitions did not spread over both chat processes", owners)
	}
	victimName, _ := c.owner(convs[0])
	victim := c.chat(victimName)
	t.Logf("%d conversations, owners %v; killing %s", len(convs), owners, victim.Name)

	// Two senders per conversation, on two gateways, with the receiver down.
	var (
		amu   sync.Mutex
		acked = map[uint64][]uint64{}
		wg    sync.WaitGroup
	)
	for i, user := range []string{"alice", "bob"} {
		conn, err := dialRaw(c, c.Gateways[i], user, "s")
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			defer conn.close()
			for n := range 8 {
				for _, conv := range convs {
					f, err := conn.call(protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: fmt.Sprint(user, n), Body: "m"}, 20*time.Second)
					if err != nil || f.Type != protocol.TypeAck {
						continue // not ACKed: no event owed
					}
					amu.Lock()
					acked[conv] = append(acked[conv], f.Seq)
					amu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	c.Kill9(victim)
	for _, conv := range owners[victim.Name] {
		c.waitOwner(conv, victim.Name, 30*time.Second)
	}
	mu.Lock()
	up = true
	mu.Unlock()

	total := 0
	for _, s := range acked {
		total += len(s)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		missing := 0
		mu.Lock()
		for conv, seqs := range acked {
			for _, s := range seqs {
				if !seen[webhook.ID(conv, s, webhook.MessageCreated)] {
					missing++
				}
			}
		}
		mu.Unlock()
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			survivor := c.Chats[0]
			if survivor == victim {
				survivor = c.Chats[1]
			}
			t.Fatalf("%d of %d ACKed messages' events never delivered; survivor's log:\n%s", missing, total, tail(c.Log(survivor), 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Fatalf("verification failed: %v", bad)
	}
	for conv, seqs := range first {
		if !slices.IsSorted(seqs) {
			t.Fatalf("conv %d: first arrivals out of seq order: %v", conv, seqs)
		}
	}
	t.Logf("%d ACKed messages, every event delivered after %s died", total, victim.Name)
}
