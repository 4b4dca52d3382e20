package hookstest

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/hooks"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
	"github.com/parley-im/parley/webhook"
)

// The delivery tests: the webhooks of internal/hooks over a real HTTP
// receiver, on the engine under test.

const testSecret = "test-secret-0123456789"

// receiver is a real HTTP endpoint that verifies every request and answers
// as its behave function says.
type receiver struct {
	srv *httptest.Server
	// behave returns the status to answer, or 0 to stall (never answer
	// before the client gives up).
	behave func(ev webhook.Event, attempt int) int

	mu       sync.Mutex
	arrivals map[string][]webhook.Event // per endpoint path and conversation, in arrival order
	acked    map[string]webhook.Event   // answered 2xx
	attempts map[string]int
	bad      []string // verification failures
	stall    chan struct{}
}

func newReceiver(t testing.TB, behave func(webhook.Event, int) int) *receiver {
	r := &receiver{behave: behave, arrivals: map[string][]webhook.Event{}, acked: map[string]webhook.Event{},
		attempts: map[string]int{}, stall: make(chan struct{})}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(func() {
		close(r.stall)
		r.srv.Close()
	})
	return r
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	ev, _, err := webhook.VerifyRequest(req, []byte(testSecret))
	if err == nil && (req.Header.Get(webhook.HeaderID) != ev.ID || ev.ID != webhook.ID(ev.ConvID, ev.Seq, ev.Type)) {
		err = fmt.Errorf("id header %q, body id %q", req.Header.Get(webhook.HeaderID), ev.ID)
	}
	r.mu.Lock()
	if err != nil {
		r.bad = append(r.bad, err.Error())
		r.mu.Unlock()
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	r.attempts[ev.ID]++
	n := r.attempts[ev.ID]
	k := fmt.Sprintf("%s conv %d", req.URL.Path, ev.ConvID)
	r.arrivals[k] = append(r.arrivals[k], ev)
	r.mu.Unlock()
	code := r.behave(ev, n)
	if code == 0 {
		select {
		case <-r.stall:
		case <-req.Context().Done():
		}
		return
	}
	if code/100 == 2 {
		r.mu.Lock()
		r.acked[ev.ID] = ev
		r.mu.Unlock()
	}
	w.WriteHeader(code)
}

type memberList map[uint64][]store.Member

func (m memberList) Members(_ context.Context, conv uint64) ([]store.Member, error) {
	return m[conv], nil
}

func testConfig(url string) hooks.Config {
	return hooks.Config{
		MaxAttempts: 1000, MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		Endpoints: []hooks.Endpoint{{Name: "ep", URL: url, Secret: testSecret, Timeout: 300 * time.Millisecond, Concurrency: 4}},
	}
}

// start runs one process's webhooks on a queue proc opens, until the test
// ends or stop is called.
func start(t *testing.T, cfg hooks.Config, proc func() Instance, members hooks.Members) (*hooks.Hooks, func()) {
	t.Helper()
	in := proc()
	h, err := hooks.New(cfg, hooks.Options{Queue: in.Queue, Members: members})
	if err != nil {
		in.Queue.Close()
		in.close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			<-done
			if err := h.Close(); err != nil {
				t.Error(err)
			}
			in.close()
		})
	}
	t.Cleanup(stop)
	return h, stop
}

func textMsg(conv, seq uint64, sender, body string) store.Message {
	return store.Message{ConvID: conv, Seq: seq, MsgID: conv*1000 + seq, Sender: sender, Kind: protocol.KindText,
		Body: body, ServerTime: 1_900_000_000_000 + int64(seq)}
}

func systemMsg(conv, seq uint64, ev protocol.SystemEvent) store.Message {
	b, _ := json.Marshal(ev)
	m := textMsg(conv, seq, ev.Actor, string(b))
	m.Kind = protocol.KindSystem
	return m
}

// produce feeds conversations of messages to h as the fan-out would, each
// conversation in seq order, and returns the ids of the events expected.
func produce(t *testing.T, h *hooks.Hooks, convs, perConv int) []string {
	t.Helper()
	var want []string
	var wg sync.WaitGroup
	var mu sync.Mutex
	for c := 1; c <= convs; c++ {
		conv := uint64(c)
		wg.Go(func() {
			group := store.Conversation{ID: conv, Kind: store.Group}
			for s := 1; s <= perConv; s++ {
				seq := uint64(s)
				var f fanout.Fanned
				var ids []string
				if seq%10 == 1 {
					f = fanout.Fanned{Msg: systemMsg(conv, seq, protocol.SystemEvent{Event: "member_added", Actor: "alice", Users: []string{fmt.Sprintf("u%d", seq)}}), Conv: group}
					ids = []string{webhook.ID(conv, seq, webhook.MemberAdded)}
				} else {
					f = fanout.Fanned{Msg: textMsg(conv, seq, "alice", fmt.Sprintf("m%d", seq)), Conv: group,
						Recipients: []string{"alice", "bob", "carol"}, AllRecipients: true, Reached: []string{"alice", "carol"}}
					ids = []string{webhook.ID(conv, seq, webhook.MessageCreated), webhook.ID(conv, seq, webhook.RecipientOffline)}
				}
				if err := h.Fanned(context.Background(), f); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				want = append(want, ids...)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return want
}

func typeIndex(typ string) int { return slices.Index(webhook.Types, typ) }

// checkOrder: per conversation, arrivals never go back to an earlier event
// (a retry repeats the same one; the next starts only after it was
// acknowledged).
func (r *receiver) checkOrder(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for conv, evs := range r.arrivals {
		for i := 1; i < len(evs); i++ {
			a, b := evs[i-1], evs[i]
			if c := cmp.Or(cmp.Compare(a.Seq, b.Seq), cmp.Compare(typeIndex(a.Type), typeIndex(b.Type))); c > 0 {
				t.Fatalf("%s: %s arrived after %s", conv, b.ID, a.ID)
			}
		}
	}
	if len(r.bad) > 0 {
		t.Fatalf("requests failed verification: %v", r.bad)
	}
}

func (r *receiver) waitAcked(t *testing.T, want []string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		r.mu.Lock()
		missing := 0
		for _, id := range want {
			if _, ok := r.acked[id]; !ok {
				missing++
			}
		}
		extra := len(r.acked) + missing - len(want)
		r.mu.Unlock()
		if missing == 0 && extra == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %d of %d events not acknowledged, %d unexpected", within, missing, len(want), extra)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testDeliveryFailStallRecover: the receiver is down (503) at first, then
// stalls some requests past the endpoint's timeout and fails others twice;
// every event is delivered at least once, signed, in per-conversation order.
func testDeliveryFailStallRecover(t *testing.T, open Open) {
	var mu sync.Mutex
	down := true
	r := newReceiver(t, func(ev webhook.Event, attempt int) int {
		mu.Lock()
		d := down
		mu.Unlock()
		switch {
		case d:
			return http.StatusServiceUnavailable
		case ev.Seq%5 == 0 && ev.Type == webhook.MessageCreated && attempt == 1:
			return 0 // stall past the timeout
		case ev.Seq%7 == 0 && attempt <= 3:
			return http.StatusInternalServerError
		}
		return http.StatusNoContent
	})
	h, _ := start(t, testConfig(r.srv.URL), open(t), nil)
	want := produce(t, h, 4, 30)
	time.Sleep(300 * time.Millisecond) // some attempts against the down receiver
	mu.Lock()
	down = false
	mu.Unlock()
	r.waitAcked(t, want, 60*time.Second)
	r.checkOrder(t)
	// The receiver counts an event acknowledged before its answer reaches
	// the queue: the stats follow a moment later.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		st := h.Stats()[0]
		if st.Backlog == 0 && st.Delivered >= int64(len(want)) && st.Failed != 0 && st.Dead == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v, want backlog 0, delivered ≥ %d, some failures, no dead letters", st, len(want))
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.attempts[webhook.ID(1, 5, webhook.MessageCreated)] < 2 || r.attempts[webhook.ID(1, 7, webhook.MessageCreated)] < 4 {
		t.Fatalf("stalled or failing events were not retried: %v", r.attempts)
	}
	// The payloads are what was produced.
	var d webhook.OfflineData
	if err := json.Unmarshal(r.acked[webhook.ID(2, 3, webhook.RecipientOffline)].Data, &d); err != nil || !slices.Equal(d.Users, []string{"bob"}) || d.Sender != "alice" || d.Preview != nil {
		t.Fatalf("recipient.offline data %+v (%v)", d, err)
	}
	var md webhook.MemberData
	if err := json.Unmarshal(r.acked[webhook.ID(2, 11, webhook.MemberAdded)].Data, &md); err != nil || md.Actor != "alice" || !slices.Equal(md.Users, []string{"u11"}) {
		t.Fatalf("member.added data %+v (%v)", md, err)
	}
}

// testDeadLetter: an event refused MaxAttempts times becomes a dead letter
// and the conversation's later events go out.
func testDeadLetter(t *testing.T, open Open) {
	r := newReceiver(t, func(ev webhook.Event, _ int) int {
		if ev.Seq == 3 && ev.Type == webhook.MessageCreated {
			return http.StatusBadRequest
		}
		return http.StatusOK
	})
	cfg := testConfig(r.srv.URL)
	cfg.MaxAttempts = 3
	cfg.Endpoints[0].Events = []string{webhook.MessageCreated}
	h, _ := start(t, cfg, open(t), nil)
	conv := store.Conversation{ID: 9, Kind: store.Direct}
	var want []string
	for s := uint64(1); s <= 6; s++ {
		if err := h.Fanned(context.Background(), fanout.Fanned{Msg: textMsg(9, s, "alice", "x"), Conv: conv, Recipients: []string{"alice", "bob"}, AllRecipients: true}); err != nil {
			t.Fatal(err)
		}
		if s != 3 {
			want = append(want, webhook.ID(9, s, webhook.MessageCreated))
		}
	}
	r.waitAcked(t, want, 30*time.Second)
	r.checkOrder(t)
	dead, err := h.Dead(context.Background(), "ep")
	if err != nil || len(dead) != 1 {
		t.Fatalf("dead letters %s (%v), want one", dead, err)
	}
	var ev webhook.Event
	if err := json.Unmarshal(dead[0], &ev); err != nil || ev.ID != webhook.ID(9, 3, webhook.MessageCreated) {
		t.Fatalf("dead letter %s (%v)", dead[0], err)
	}
	r.mu.Lock()
	n := r.attempts[ev.ID]
	r.mu.Unlock()
	if n != 3 {
		t.Fatalf("dead event attempted %d times, want 3", n)
	}
	if st := h.Stats()[0]; st.Dead != 1 || st.Backlog != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// testQueueSurvivesRestart: events queued while the receiver is down are
// delivered by the next process on the same queue.
func testQueueSurvivesRestart(t *testing.T, open Open) {
	var mu sync.Mutex
	up := false
	r := newReceiver(t, func(webhook.Event, int) int {
		mu.Lock()
		defer mu.Unlock()
		if up {
			return http.StatusOK
		}
		return http.StatusBadGateway
	})
	proc := open(t)
	h, stop := start(t, testConfig(r.srv.URL), proc, nil)
	want := produce(t, h, 3, 12)
	time.Sleep(100 * time.Millisecond)
	stop()
	mu.Lock()
	up = true
	mu.Unlock()
	h2, _ := start(t, testConfig(r.srv.URL), proc, nil)
	if b := h2.Stats()[0].Backlog; b != int64(len(want)) {
		t.Fatalf("backlog after reopen %d, want %d", b, len(want))
	}
	r.waitAcked(t, want, 30*time.Second)
	r.checkOrder(t)
}

// testOfflinePreviewAndE2E: recipient.offline lists the members with no
// device reached (the sender never), per endpoint preview policy; an E2E
// conversation's events carry no body and no preview.
func testOfflinePreviewAndE2E(t *testing.T, open Open) {
	r := newReceiver(t, func(webhook.Event, int) int { return http.StatusOK })
	cfg := testConfig(r.srv.URL)
	base := cfg.Endpoints[0]
	cfg.Endpoints = nil
	for _, p := range []string{hooks.PreviewNone, hooks.PreviewSender, hooks.PreviewFull} {
		e := base
		e.Name, e.Preview, e.URL = "ep-"+p, p, r.srv.URL+"/"+p
		cfg.Endpoints = append(cfg.Endpoints, e)
	}
	members := memberList{3: {{UserID: "alice", JoinSeq: 1}, {UserID: "bob", JoinSeq: 1}, {UserID: "dan", JoinSeq: 1}, {UserID: "late", JoinSeq: 9}}}
	h, _ := start(t, cfg, open(t), members)
	ctx := context.Background()
	direct := store.Conversation{ID: 1, Kind: store.Direct}
	e2e := store.Conversation{ID: 2, Kind: store.Direct, E2E: true}
	large := store.Conversation{ID: 3, Kind: store.Group, Tier: 2}
	for _, f := range []fanout.Fanned{
		// A notice of the server API is a message.created; an admin's
		// membership change says so; device events produce nothing.
		{Msg: systemMsg(3, 1, protocol.SystemEvent{Event: "notice", Actor: "ops", Users: []string{}, Admin: true, Text: "maintenance"}), Conv: large},
		{Msg: systemMsg(3, 2, protocol.SystemEvent{Event: "member_added", Actor: "ops", Users: []string{"dan"}, Admin: true}), Conv: large},
		{Msg: systemMsg(3, 3, protocol.SystemEvent{Event: "device_added", Actor: "dan", Users: []string{"dan"}, Device: "d9"}), Conv: large},
		{Msg: textMsg(1, 1, "alice", "hello bob"), Conv: direct, Recipients: []string{"alice", "bob"}, AllRecipients: true, Reached: []string{"alice"}},
		{Msg: textMsg(1, 2, "alice", "all reached"), Conv: direct, Recipients: []string{"alice", "bob"}, AllRecipients: true, Reached: []string{"bob"}},
		{Msg: textMsg(2, 1, "alice", "ciphertext-envelope"), Conv: e2e, Recipients: []string{"alice", "bob"}, AllRecipients: true},
		// Large group: recipients are the members online; the offline
		// members come from the member list (joined by seq 5).
		{Msg: textMsg(3, 5, "alice", "to the group"), Conv: large, Recipients: []string{"alice", "bob"}, Reached: []string{"alice", "bob"}},
	} {
		if err := h.Fanned(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{}
	for range cfg.Endpoints {
		want = append(want, webhook.ID(1, 1, webhook.MessageCreated), webhook.ID(1, 1, webhook.RecipientOffline),
			webhook.ID(1, 2, webhook.MessageCreated), webhook.ID(2, 1, webhook.MessageCreated),
			webhook.ID(2, 1, webhook.RecipientOffline), webhook.ID(3, 5, webhook.MessageCreated), webhook.ID(3, 5, webhook.RecipientOffline),
			webhook.ID(3, 1, webhook.MessageCreated), webhook.ID(3, 2, webhook.MemberAdded))
	}
	// Three endpoints receive the same ids; count arrivals per path instead.
	deadline := time.Now().Add(20 * time.Second)
	for {
		r.mu.Lock()
		n := 0
		for _, evs := range r.arrivals {
			n += len(evs)
		}
		r.mu.Unlock()
		if n >= len(want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d requests arrived", n, len(want))
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.checkOrder(t)
	r.mu.Lock()
	defer r.mu.Unlock()
	offline := map[string][]webhook.OfflineData{}
	for _, evs := range r.arrivals {
		for _, ev := range evs {
			switch ev.Type {
			case webhook.RecipientOffline:
				var d webhook.OfflineData
				if err := json.Unmarshal(ev.Data, &d); err != nil {
					t.Fatal(err)
				}
				offline[ev.ID] = append(offline[ev.ID], d)
			}
			if ev.ConvID == 3 && ev.Seq == 3 {
				t.Fatalf("device event produced %s", ev.ID)
			}
			switch ev.Type {
			case webhook.MemberAdded:
				var d webhook.MemberData
				if err := json.Unmarshal(ev.Data, &d); err != nil || !d.Admin || d.Actor != "ops" {
					t.Fatalf("admin member.added %+v (%v)", d, err)
				}
			case webhook.MessageCreated:
				var d webhook.MessageData
				if err := json.Unmarshal(ev.Data, &d); err != nil {
					t.Fatal(err)
				}
				if ev.Seq == 1 && ev.ConvID == 3 && (d.Message.Kind != protocol.KindSystem || !strings.Contains(d.Message.Body, "maintenance")) {
					t.Fatalf("notice message.created %+v", d.Message)
				}
				if (ev.ConvID == 2) != (d.Message.Body == "" && d.E2E) {
					t.Fatalf("message.created %s: e2e %v body %q", ev.ID, d.E2E, d.Message.Body)
				}
			}
		}
	}
	if _, ok := offline[webhook.ID(1, 2, webhook.RecipientOffline)]; ok {
		t.Fatal("recipient.offline for a message that reached every recipient")
	}
	previews := map[string]bool{}
	for _, d := range offline[webhook.ID(1, 1, webhook.RecipientOffline)] {
		if !slices.Equal(d.Users, []string{"bob"}) {
			t.Fatalf("offline users %v, want [bob]", d.Users)
		}
		switch {
		case d.Preview == nil:
			previews["none"] = true
		case d.Preview.Sender == "alice" && d.Preview.Body == "":
			previews["sender"] = true
		case d.Preview.Sender == "alice" && d.Preview.Body == "hello bob":
			previews["full"] = true
		}
	}
	if len(previews) != 3 {
		t.Fatalf("previews seen %v, want none, sender and full", previews)
	}
	for _, d := range offline[webhook.ID(2, 1, webhook.RecipientOffline)] {
		if d.Preview != nil || !d.E2E || !slices.Equal(d.Users, []string{"bob"}) {
			t.Fatalf("E2E recipient.offline %+v: want bob, no preview", d)
		}
	}
	for _, d := range offline[webhook.ID(3, 5, webhook.RecipientOffline)] {
		if !slices.Equal(d.Users, []string{"dan"}) {
			t.Fatalf("large group offline %v, want [dan]", d.Users)
		}
	}
}

// testOrderWhileProducing: events produced while earlier ones are being
// delivered still go out one at a time per conversation, in order.
func testOrderWhileProducing(t *testing.T, open Open) {
	var mu sync.Mutex
	inflight := map[uint64]int{}
	var overlap []string
	r := newReceiver(t, func(ev webhook.Event, _ int) int {
		mu.Lock()
		inflight[ev.ConvID]++
		if inflight[ev.ConvID] > 1 {
			overlap = append(overlap, ev.ID)
		}
		mu.Unlock()
		time.Sleep(time.Millisecond)
		mu.Lock()
		inflight[ev.ConvID]--
		mu.Unlock()
		return http.StatusOK
	})
	cfg := testConfig(r.srv.URL)
	cfg.Endpoints[0].Events = []string{webhook.MessageCreated}
	h, _ := start(t, cfg, open(t), nil)
	var want []string
	var wmu sync.Mutex
	var wg sync.WaitGroup
	for c := uint64(1); c <= 4; c++ {
		wg.Go(func() {
			for s := uint64(1); s <= 150; s++ {
				if err := h.Fanned(context.Background(), fanout.Fanned{Msg: textMsg(c, s, "alice", "x"), Conv: store.Conversation{ID: c, Kind: store.Direct}}); err != nil {
					t.Error(err)
					return
				}
				wmu.Lock()
				want = append(want, webhook.ID(c, s, webhook.MessageCreated))
				wmu.Unlock()
				time.Sleep(time.Duration(s%3) * time.Millisecond)
			}
		})
	}
	wg.Wait()
	r.waitAcked(t, want, 30*time.Second)
	r.checkOrder(t)
	mu.Lock()
	defer mu.Unlock()
	if len(overlap) > 0 {
		t.Fatalf("deliveries of one conversation overlapped: %v", overlap)
	}
}

// testHandOver: a process produces events (one conversation's two
// fan-outs finishing out of seq order among them) while the receiver is
// down, attempts each conversation's first event once, and stops; the
// next process on the same queue delivers every event in per-conversation
// order, and one the receiver always refuses becomes a dead letter while
// its conversation goes on.
func testHandOver(t *testing.T, open Open) {
	var mu sync.Mutex
	down := true
	poisoned := webhook.ID(3, 5, webhook.MessageCreated)
	rcv := newReceiver(t, func(ev webhook.Event, _ int) int {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case down:
			return http.StatusServiceUnavailable
		case ev.ID == poisoned:
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	proc := open(t)
	cfg := testConfig(rcv.srv.URL)
	cfg.MinBackoff, cfg.MaxBackoff = time.Minute, time.Minute
	h1, stop1 := start(t, cfg, proc, nil)
	want := produce(t, h1, 6, 12)
	group := store.Conversation{ID: 7, Kind: store.Group}
	for _, seq := range []uint64{2, 1} { // fan-outs that finished out of seq order
		if err := h1.Fanned(context.Background(), fanout.Fanned{Msg: textMsg(7, seq, "alice", "x"), Conv: group,
			Recipients: []string{"alice"}, AllRecipients: true, Reached: []string{"alice"}}); err != nil {
			t.Fatal(err)
		}
		want = append(want, webhook.ID(7, seq, webhook.MessageCreated))
	}
	time.Sleep(500 * time.Millisecond)
	stop1()
	if st := h1.Stats()[0]; st.Delivered != 0 || st.Failed == 0 {
		t.Fatalf("first process: stats %+v, want failed attempts and nothing delivered", st)
	}

	cfg = testConfig(rcv.srv.URL)
	cfg.MaxAttempts = 4
	mu.Lock()
	down = false
	mu.Unlock()
	h2, _ := start(t, cfg, proc, nil)
	rcv.waitAcked(t, slices.DeleteFunc(want, func(id string) bool { return id == poisoned }), 30*time.Second)
	rcv.checkOrder(t)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st := h2.Stats()[0]
		if st.Dead == 1 && st.Backlog == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v, want 1 dead and no backlog", st)
		}
	}
	dead, err := h2.Dead(context.Background(), "ep")
	if err != nil || len(dead) != 1 {
		t.Fatalf("dead letters %d (%v), want 1", len(dead), err)
	}
	var ev webhook.Event
	if err := json.Unmarshal(dead[0], &ev); err != nil || ev.ID != poisoned {
		t.Fatalf("dead letter %s (%v), want %s", dead[0], err, poisoned)
	}
}

// BenchmarkProduceDeliver: events of 200 conversations produced by 16
// goroutines (as the 16 fan-out workers do) and delivered to a receiver
// that answers at once; reports the time per event to produce and to
// deliver all.
func BenchmarkProduceDeliver(b *testing.B, open Open) {
	r := newReceiver(b, func(webhook.Event, int) int { return http.StatusOK })
	cfg := testConfig(r.srv.URL)
	cfg.Endpoints[0].Events = []string{webhook.MessageCreated}
	in := open(b)()
	h, err := hooks.New(cfg, hooks.Options{Queue: in.Queue})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	defer func() { cancel(); <-done; h.Close(); in.close() }()
	const convs = 200
	b.ResetTimer()
	begin := time.Now()
	const workers = 16
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < b.N; i += workers {
				c := uint64(i%convs) + 1
				s := uint64(i/convs) + 1
				if err := h.Fanned(ctx, fanout.Fanned{Msg: textMsg(c, s, "alice", "x"), Conv: store.Conversation{ID: c, Kind: store.Group}}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	produced := time.Since(begin)
	for h.Stats()[0].Delivered < int64(b.N) {
		time.Sleep(5 * time.Millisecond)
	}
	b.ReportMetric(float64(produced.Nanoseconds())/float64(b.N), "ns-produce/event")
	b.ReportMetric(float64(time.Since(begin).Nanoseconds())/float64(b.N), "ns-total/event")
}
