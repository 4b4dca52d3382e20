package push

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"

	pnats "github.com/parley-im/parley/internal/bus/nats"
	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/hooks"
	hjetstream "github.com/parley-im/parley/internal/hooks/jetstream"
	hpebble "github.com/parley-im/parley/internal/hooks/pebble"
	"github.com/parley-im/parley/internal/store"
	spebble "github.com/parley-im/parley/internal/store/pebble"
	"github.com/parley-im/parley/protocol"
)

// engines opens the pusher's queue on each engine: Pebble on disk, and
// JetStream on $PARLEY_TEST_NATS (skipped without it, except in CI).
var engines = map[string]func(t *testing.T) hooks.Queue{
	"pebble": func(t *testing.T) hooks.Queue {
		q, err := hpebble.Open(hpebble.Config{Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		return q
	},
	"jetstream": func(t *testing.T) hooks.Queue {
		url := os.Getenv("PARLEY_TEST_NATS")
		if url == "" {
			if os.Getenv("CI") == "true" {
				t.Fatal("CI requires NATS: PARLEY_TEST_NATS is unset")
			}
			t.Skip("PARLEY_TEST_NATS is unset; run scripts/engines/up.sh")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		nc, err := pnats.Connect(ctx, pnats.ConnConfig{URL: url, Name: t.Name()})
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		ns := "pu" + hex.EncodeToString(b)
		t.Cleanup(func() {
			js, _ := njs.New(nc)
			for _, s := range []string{strings.ToUpper(ns) + "_HOOKS", strings.ToUpper(ns) + "_HOOKS_DEAD"} {
				_ = js.DeleteStream(context.Background(), s)
			}
			nc.Close()
		})
		q, err := hjetstream.Open(ctx, hjetstream.Config{NATS: nc, Namespace: ns, Owner: allPartitions(4), Node: "n1"})
		if err != nil {
			t.Fatal(err)
		}
		return q
	},
}

// allPartitions holds every partition (the lease logic has its own tests).
type allPartitions int

func (n allPartitions) Partitions() int { return int(n) }
func (allPartitions) Holds(int) bool    { return true }
func (n allPartitions) Watch(f func(int, bool)) {
	for p := range int(n) {
		f(p, true)
	}
}

// rig is a pusher on a real store and queue, sending to the local
// providers.
type rig struct {
	t    *testing.T
	prov *providers
	st   store.Store
	p    *Pusher
	stop func()
	ids  atomic.Uint64
}

func newRig(t *testing.T, queue func(*testing.T) hooks.Queue, tune func(*Config)) *rig {
	prov := newProviders(t)
	st, err := spebble.Open(context.Background(), spebble.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	cfg := prov.config()
	if tune != nil {
		tune(&cfg)
	}
	p, err := New(cfg, Options{Queue: queue(t), Store: st, Client: prov.srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	r := &rig{t: t, prov: prov, st: st, p: p}
	r.stop = sync.OnceFunc(func() { cancel(); <-done; p.Close() })
	t.Cleanup(r.stop)
	return r
}

func (r *rig) conv(id uint64, kind store.ConvKind, e2e bool, users ...string) store.Conversation {
	c := store.Conversation{ID: id, Kind: kind, E2E: e2e, CreatedAt: time.Now().UnixMilli()}
	var ms []store.Member
	for _, u := range users {
		ms = append(ms, store.Member{ConvID: id, UserID: u})
	}
	if err := r.st.CreateConversation(context.Background(), c, ms); err != nil {
		r.t.Fatal(err)
	}
	return c
}

func (r *rig) register(reg store.PushReg) {
	reg.UpdatedAt = time.Now().UnixMilli()
	if _, err := r.st.PushRegister(context.Background(), reg, 8); err != nil {
		r.t.Fatal(err)
	}
}

// send stores a message and hands its fan-out to the pusher as the
// fan-out would: every member a recipient, reached the ones online.
func (r *rig) send(c store.Conversation, sender, body string, members, online []string) store.Message {
	r.t.Helper()
	res, err := r.st.Append(context.Background(), store.Append{Rows: true, Msg: store.Message{ConvID: c.ID, MsgID: r.ids.Add(1), Sender: sender,
		ClientMsgID: fmt.Sprint("c", r.ids.Load()), Kind: protocol.KindText, Body: body, ServerTime: time.Now().UnixMilli()}})
	if err != nil {
		r.t.Fatal(err)
	}
	if err := r.p.Fanned(context.Background(), fanout.Fanned{Msg: res.Msg, Conv: c, Recipients: members, AllRecipients: true, Reached: online}); err != nil {
		r.t.Fatal(err)
	}
	return res.Msg
}

// wait waits until the providers recorded n requests (and a little more
// for any beyond), returning them.
func (r *rig) wait(n int) []pushReq {
	r.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for len(r.prov.requests()) < n {
		if time.Now().After(deadline) {
			r.t.Fatalf("providers got %d requests, want %d: %+v", len(r.prov.requests()), n, r.prov.requests())
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	return r.prov.requests()
}

func byProvider(reqs []pushReq, token string) []pushReq {
	var out []pushReq
	for _, q := range reqs {
		if q.Token == token {
			out = append(out, q)
		}
	}
	return out
}

func eachEngine(t *testing.T, f func(t *testing.T, q func(*testing.T) hooks.Queue)) {
	for _, name := range []string{"pebble", "jetstream"} {
		t.Run(name, func(t *testing.T) { f(t, engines[name]) })
	}
}

func str(v any) string { s, _ := v.(string); return s }

// TestPusherRequests: a message to an offline user reaches each of the
// user's registrations with the exact request its provider documents
// (headers, payload, badge, collapse id, preview full); an E2E
// conversation's carries no content (APNs background push, FCM data-only,
// Web Push without title or body); an online recipient gets none; tokens
// the providers call unregistered are removed; a 429 with Retry-After is
// retried after it and delivered once.
func TestPusherRequests(t *testing.T) {
	eachEngine(t, func(t *testing.T, queue func(*testing.T) hooks.Queue) {
		r := newRig(t, queue, nil)
		ep, p256, auth := r.prov.subscription("bob-laptop")
		r.register(store.PushReg{UserID: "bob", DeviceID: "phone", Provider: "apns", Token: "b0b0", Topic: "im.parley.app", Sandbox: true})
		r.register(store.PushReg{UserID: "bob", DeviceID: "tablet", Provider: "fcm", Token: "bob-fcm"})
		r.register(store.PushReg{UserID: "bob", DeviceID: "laptop", Provider: "webpush", Token: ep, P256dh: p256, Auth: auth})
		deadEP, dp, da := r.prov.subscription("dead-carol")
		r.register(store.PushReg{UserID: "carol", DeviceID: "phone", Provider: "apns", Token: "dead01", Topic: "im.parley.app"})
		r.register(store.PushReg{UserID: "carol", DeviceID: "old", Provider: "apns", Token: "bad02", Topic: "im.parley.app"})
		r.register(store.PushReg{UserID: "carol", DeviceID: "tab", Provider: "fcm", Token: "dead-fcm"})
		r.register(store.PushReg{UserID: "carol", DeviceID: "web", Provider: "webpush", Token: deadEP, P256dh: dp, Auth: da})
		r.register(store.PushReg{UserID: "dave", DeviceID: "phone", Provider: "fcm", Token: "dave-fcm"})
		r.prov.mu.Lock()
		r.prov.throttle["dave-fcm"] = 1
		r.prov.mu.Unlock()

		direct := r.conv(1, store.Direct, false, "alice", "bob")
		m := r.send(direct, "alice", "lunch at noon?", []string{"alice", "bob"}, []string{"alice"})
		reqs := r.wait(3)
		if len(reqs) != 3 {
			t.Fatalf("requests %d, want 3 (one per registration of bob): %+v", len(reqs), reqs)
		}
		a := byProvider(reqs, "b0b0")[0]
		for h, want := range map[string]string{"apns-topic": "im.parley.app", "apns-push-type": "alert", "apns-priority": "10", "apns-collapse-id": "c1"} {
			if got := a.Header.Get(h); got != want {
				t.Errorf("apns %s = %q, want %q", h, got, want)
			}
		}
		aps := a.Payload["aps"].(map[string]any)
		alert := aps["alert"].(map[string]any)
		if alert["title"] != "alice" || alert["body"] != "lunch at noon?" || aps["badge"] != 1.0 || aps["content-available"] != nil ||
			a.Payload["conv_id"] != "1" || a.Payload["seq"] != float64(m.Seq) || a.Payload["count"] != 1.0 {
			t.Errorf("apns payload %v", a.Payload)
		}
		f := byProvider(reqs, "bob-fcm")[0]
		data := f.Payload["data"].(map[string]any)
		notif := f.Payload["notification"].(map[string]any)
		android := f.Payload["android"].(map[string]any)
		if data["conv_id"] != "1" || data["seq"] != fmt.Sprint(m.Seq) || data["badge"] != "1" || notif["title"] != "alice" || notif["body"] != "lunch at noon?" ||
			android["collapse_key"] != "c1" || android["priority"] != "HIGH" {
			t.Errorf("fcm message %v", f.Payload)
		}
		w := byProvider(reqs, ep)[0]
		if w.Payload["title"] != "alice" || w.Payload["body"] != "lunch at noon?" || w.Payload["conv_id"] != "1" || w.Header.Get("Topic") != "c1" || w.Header.Get("Urgency") != "high" {
			t.Errorf("web push %v %v", w.Payload, w.Header)
		}

		// E2E: no content anywhere in the requests.
		e2e := r.conv(2, store.Group, true, "alice", "bob", "carol", "dave")
		secret := "e2e-ciphertext-SECRET"
		r.send(e2e, "alice", secret, []string{"alice", "bob", "carol", "dave"}, []string{"alice"})
		reqs = r.wait(7)[3:]
		for _, q := range reqs {
			b, _ := json.Marshal(q.Payload)
			if strings.Contains(string(b), "SECRET") || strings.Contains(string(b), "alice") {
				t.Errorf("%s request of an E2E conversation carries content: %s", q.Provider, b)
			}
		}
		a = byProvider(reqs, "b0b0")[0]
		aps = a.Payload["aps"].(map[string]any)
		if a.Header.Get("apns-push-type") != "background" || a.Header.Get("apns-priority") != "5" || aps["content-available"] != 1.0 || aps["alert"] != nil || aps["sound"] != nil || aps["badge"] != 2.0 {
			t.Errorf("apns E2E push %v %v", a.Header, a.Payload)
		}
		f = byProvider(reqs, "bob-fcm")[0]
		if f.Payload["notification"] != nil || f.Payload["data"].(map[string]any)["e2e"] != "1" {
			t.Errorf("fcm E2E message %v", f.Payload)
		}
		w = byProvider(reqs, ep)[0]
		if w.Payload["title"] != nil || w.Payload["body"] != nil || w.Payload["e2e"] != true {
			t.Errorf("web push E2E payload %v", w.Payload)
		}
		dave := byProvider(reqs, "dave-fcm")
		if len(dave) != 1 || dave[0].At.Sub(a.At) < 900*time.Millisecond {
			t.Errorf("dave's throttled FCM token: %d requests, the last %v after bob's (Retry-After: 1)", len(dave), dave[len(dave)-1].At.Sub(a.At))
		}
		// Carol's tokens the providers reject are gone.
		waitFor(t, func() bool { regs, _ := r.st.PushRegs(context.Background(), "carol"); return len(regs) == 0 }, "carol's unregistered tokens removed")
		st := r.p.Stats()
		if st[0].Removed != 2 || st[1].Removed != 1 || st[2].Removed != 1 || st[0].Sent != 2 || st[1].Sent != 3 || st[2].Sent != 2 {
			t.Errorf("stats %+v", st)
		}
		if b, d := r.p.Backlog(); b != 0 || d != 0 {
			t.Errorf("backlog %d, dead %d after delivery", b, d)
		}
	})
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPusherFloodCollapsed: 200 messages to one device within a burst
// make a notification or two, the last carrying the last seq and the
// count of all 200; none is lost (the queue is empty after).
func TestPusherFloodCollapsed(t *testing.T) {
	eachEngine(t, func(t *testing.T, queue func(*testing.T) hooks.Queue) {
		r := newRig(t, queue, func(c *Config) { c.Burst = 300 * time.Millisecond })
		r.register(store.PushReg{UserID: "bob", DeviceID: "phone", Provider: "apns", Token: "b0b0", Topic: "im.parley.app"})
		c := r.conv(5, store.Direct, false, "alice", "bob")
		var last store.Message
		for i := range 200 {
			last = r.send(c, "alice", fmt.Sprint("flood ", i), []string{"alice", "bob"}, []string{"alice"})
		}
		reqs := r.wait(1)
		time.Sleep(time.Second)
		reqs = r.prov.requests()
		if len(reqs) > 3 {
			t.Fatalf("a flood of 200 made %d notifications, want at most 3", len(reqs))
		}
		end := reqs[len(reqs)-1].Payload
		if end["seq"] != float64(last.Seq) || end["count"] != 200.0 || end["aps"].(map[string]any)["badge"] != 200.0 {
			t.Fatalf("the last notification %v, want seq %d and count 200", end, last.Seq)
		}
		waitFor(t, func() bool { b, _ := r.p.Backlog(); return b == 0 }, "the queue empties")
		t.Logf("200 messages: %d notifications, %d collapsed", len(reqs), r.p.Collapsed())
	})
}

// TestPusherLateEventSuperseded: an event that reaches the queue after a
// later message of its conversation was notified (its fan-out ran late,
// as the outbox's after a crash) is superseded, not sent: the device
// never goes back to an older message, and the one shown already counts
// it.
func TestPusherLateEventSuperseded(t *testing.T) {
	eachEngine(t, func(t *testing.T, queue func(*testing.T) hooks.Queue) {
		r := newRig(t, queue, func(c *Config) { c.Burst = 20 * time.Millisecond })
		r.register(store.PushReg{UserID: "bob", DeviceID: "phone", Provider: "apns", Token: "b0b0", Topic: "im.parley.app"})
		c := r.conv(6, store.Direct, false, "alice", "bob")
		var msgs []store.Message
		for i := range 2 {
			res, err := r.st.Append(context.Background(), store.Append{Rows: true, Msg: store.Message{ConvID: c.ID, MsgID: r.ids.Add(1), Sender: "alice",
				ClientMsgID: fmt.Sprint("late", i), Kind: protocol.KindText, Body: fmt.Sprint("m", i), ServerTime: time.Now().UnixMilli()}})
			if err != nil {
				t.Fatal(err)
			}
			msgs = append(msgs, res.Msg)
		}
		fanned := func(m store.Message) {
			if err := r.p.Fanned(context.Background(), fanout.Fanned{Msg: m, Conv: c, Recipients: []string{"alice", "bob"}, AllRecipients: true, Reached: []string{"alice"}}); err != nil {
				t.Fatal(err)
			}
		}
		fanned(msgs[1])
		r.wait(1)
		fanned(msgs[0]) // late
		waitFor(t, func() bool { b, _ := r.p.Backlog(); return b == 0 }, "the queue empties")
		time.Sleep(300 * time.Millisecond)
		reqs := r.prov.requests()
		if len(reqs) != 1 || reqs[0].Payload["seq"] != float64(msgs[1].Seq) || reqs[0].Payload["count"] != 2.0 {
			t.Fatalf("requests %+v, want one for seq %d counting 2", reqs, msgs[1].Seq)
		}
		if r.p.Collapsed() != 1 {
			t.Fatalf("collapsed %d, want 1 (the late event)", r.p.Collapsed())
		}
	})
}
