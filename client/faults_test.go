package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/gateway"
	"github.com/parley-im/parley/internal/server"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// Fault tests: the SDK against a real node, with the fault injected by the
// proxy (lost frames, cuts, an unreachable node) or by a store wrapper on
// the real engine (a failing durable write).

// Lost pushes leave holes; the client fills them from history and hands
// over every message once, in order.
func TestGapFetchedFromHistory(t *testing.T) {
	srv := servertest.Start(t)
	px := newProxy(t, srv.URL)
	lost := map[uint64]bool{3: true, 4: true, 7: true, 12: true, 13: true, 14: true}
	px.setRule(func(dir direction, f *protocol.Frame) verdict {
		if dir == toClient && f.Type == protocol.TypeMsg && lost[f.Message.Seq] {
			return drop
		}
		return pass
	})
	alice := startE2E(t, srv.URL, srv.Token("alice"), "d1", nil)
	bob := startE2E(t, px.url(), srv.Token("bob"), "d1", nil)
	ctx := ctxT(t)
	conv, err := alice.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 20; i++ {
		if _, err := alice.Send(ctx, conv.ConvID, fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	// Well before the server's 5s re-send of the lost pushes.
	eventually(t, "all messages", func() bool { return len(bob.rec.seqs(conv.ConvID)) >= 20 })
	wantRun(t, bob.rec.seqs(conv.ConvID), 1, 20)
	if len(px.sent(protocol.TypeHistory)) == 0 {
		t.Fatal("holes were filled without a history request")
	}
}

// Connections cut while pushes are in flight, with messages stored while
// the client is away: every message arrives once, in order, and every
// reconnect's sync carries the position reached.
func TestReconnectMidStreamNoGapNoDup(t *testing.T) {
	srv := servertest.Start(t)
	px := newProxy(t, srv.URL)
	alice := startE2E(t, srv.URL, srv.Token("alice"), "phone", nil)
	bob := startE2E(t, px.url(), srv.Token("bob"), "phone", nil)
	ctx := ctxT(t)
	group, err := alice.CreateGroup(ctx, "g", []string{"bob"})
	if err != nil {
		t.Fatal(err)
	}
	var last uint64
	send := func(body string) {
		t.Helper()
		ack, err := alice.Send(ctx, group.ConvID, body)
		if err != nil {
			t.Fatalf("Send: %v", err)
		}
		last = ack.Seq
	}
	for i := 1; i <= 240; i++ {
		send(fmt.Sprint(i))
		if i%60 == 0 {
			connects := bob.rec.count(EventConnected)
			px.down(true)
			px.cut() // pushes in flight are lost with the connection
			// Fewer than the 200 that would make the snapshot jump.
			for j := 0; j < 30; j++ {
				send("while away")
			}
			px.down(false)
			eventually(t, "bob reconnects", func() bool { return bob.rec.count(EventConnected) > connects })
		}
	}
	eventually(t, "bob has everything", func() bool { return bob.rec.hasSeq(group.ConvID, last) },
		func() string { return fmt.Sprint(bob.rec.seqs(group.ConvID)) })
	wantRun(t, bob.rec.seqs(group.ConvID), 1, last)
	if n := bob.rec.count(EventDisconnected); n < 4 {
		t.Fatalf("%d disconnects, want 4", n)
	}
	syncs := px.sent(protocol.TypeSync)
	if len(syncs) < 5 {
		t.Fatalf("%d syncs, want one per connection", len(syncs))
	}
	for i, f := range syncs {
		if !f.All {
			t.Errorf("sync %d without all:true: %+v", i, f)
		}
		if i == 0 {
			continue
		}
		if len(f.Convs) != 1 || f.Convs[0].ConvID != group.ConvID || f.Convs[0].AfterSeq == 0 {
			t.Errorf("reconnect sync %d carries %+v, want the group's position", i, f.Convs)
		}
	}
}

// The send is stored but its ack is lost with the connection: the client
// sends the same frame again on the next connection and gets the original
// ack back, marked duplicate; nothing is stored twice.
func TestSendRetriedWithSameIDAfterDisconnect(t *testing.T) {
	srv := servertest.Start(t)
	px := newProxy(t, srv.URL)
	alice := startE2E(t, px.url(), srv.Token("alice"), "phone", nil)
	bob := startE2E(t, srv.URL, srv.Token("bob"), "phone", nil)
	ctx := ctxT(t)
	conv, err := alice.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatalf("OpenDirect: %v", err)
	}
	px.setRule(onFirst(frameIs(toClient, protocol.TypeAck), dropCut))
	ack, err := alice.Send(ctx, conv.ConvID, "exactly once")
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	if !ack.Duplicate {
		t.Fatalf("ack %+v: want the stored message's ack, marked duplicate", ack)
	}
	sends := px.sent(protocol.TypeSend)
	if len(sends) != 2 || sends[0].ClientMsgID != ack.ClientMsgID || sends[1].ClientMsgID != ack.ClientMsgID {
		t.Fatalf("sends %+v: want two attempts with client_msg_id %s", sends, ack.ClientMsgID)
	}
	// An explicit second attempt after the reconnect is deduplicated too.
	again, err := alice.SendWithID(ctx, conv.ConvID, ack.ClientMsgID, "exactly once")
	if err != nil || !again.Duplicate || again.Seq != ack.Seq {
		t.Fatalf("repeat = %+v, %v; want duplicate of seq %d", again, err, ack.Seq)
	}
	wantStoredOnce(t, bob, conv.ConvID, ack.ClientMsgID)
	eventually(t, "alice gets her own message", func() bool { return alice.rec.hasSeq(conv.ConvID, ack.Seq) })
	wantRun(t, alice.rec.seqs(conv.ConvID), 1, 1)
}

func wantStoredOnce(t *testing.T, reader *runningClient, convID uint64, clientMsgID string) {
	t.Helper()
	page, _, err := reader.History(ctxT(t), convID, HistoryQuery{Forward: true, Limit: 200})
	if err != nil {
		t.Fatalf("History: %v", err)
	}
	n := 0
	for _, m := range page {
		if m.ClientMsgID == clientMsgID {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d stored messages with client_msg_id %s, want 1", n, clientMsgID)
	}
}

// The ack is lost but the connection stays: the attempt times out and the
// same frame is sent again on the same connection.
func TestSendRetriedAfterTimeout(t *testing.T) {
	srv := servertest.Start(t)
	px := newProxy(t, srv.URL)
	alice := startE2E(t, px.url(), srv.Token("alice"), "d1", func(c *Config) { c.RequestTimeout = 300 * time.Millisecond })
	ctx := ctxT(t)
	conv, err := alice.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	px.setRule(onFirst(frameIs(toClient, protocol.TypeAck), drop))
	ack, err := alice.SendWithID(ctx, conv.ConvID, "my-id-1", "hello")
	if err != nil || ack.ClientMsgID != "my-id-1" || ack.Seq != 1 || !ack.Duplicate {
		t.Fatalf("SendWithID = %+v, %v; want the first attempt's ack (seq 1, duplicate)", ack, err)
	}
	if sends := px.sent(protocol.TypeSend); len(sends) != 2 || sends[1].ClientMsgID != "my-id-1" {
		t.Fatalf("sends %+v, want a retry of my-id-1", sends)
	}
	if n := alice.rec.count(EventDisconnected); n != 0 {
		t.Fatalf("%d disconnects: the retry should reuse the connection", n)
	}
	ack2, err := alice.SendWithID(ctx, conv.ConvID, "my-id-1", "hello")
	if err != nil || !ack2.Duplicate || ack2.Seq != 1 {
		t.Fatalf("repeat SendWithID = %+v, %v; want duplicate of seq 1", ack2, err)
	}
	wantStoredOnce(t, alice, conv.ConvID, "my-id-1")
}

// failingAppends makes the real store's Append fail while left > 0, the way
// a full disk or an unreachable database does; everything else is the
// real Pebble store.
type failingAppends struct {
	store.Store
	left  atomic.Int64
	calls atomic.Int64
}

func (f *failingAppends) Append(ctx context.Context, a store.Append) (store.AppendResult, error) {
	f.calls.Add(1)
	if f.left.Add(-1) >= 0 {
		return store.AppendResult{}, errors.New("injected append failure")
	}
	return f.Store.Append(ctx, a)
}

func TestServerErrors(t *testing.T) {
	faulty := &failingAppends{}
	srv := servertest.Start(t, servertest.WithDeps(func(d *server.Deps) {
		d.WrapStore = func(s store.Store) store.Store { faulty.Store = s; return faulty }
	}))
	px := newProxy(t, srv.URL)
	alice := startE2E(t, px.url(), srv.Token("alice"), "d1", nil)
	ctx := ctxT(t)
	var e *Error
	if _, err := alice.Send(ctx, 999, "x"); !errors.As(err, &e) || e.Code != protocol.CodeNotMember || e.Retryable() {
		t.Fatalf("Send to unknown conversation = %v, want a non-retryable *Error not_member", err)
	}
	conv, err := alice.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("a", protocol.DefaultLimits.MaxBodyBytes+1)
	if _, err := alice.Send(ctx, conv.ConvID, big); !errors.As(err, &e) || e.Code != protocol.CodeTooLarge {
		t.Fatalf("oversized Send = %v, want too_large", err)
	}
	for _, f := range px.sent(protocol.TypeSend) {
		if len(f.Body) > protocol.DefaultLimits.MaxBodyBytes {
			t.Fatal("the oversized body was sent; want it refused before sending")
		}
	}
	// A retryable error (store_unavailable) is retried until it clears.
	faulty.left.Store(2)
	calls := faulty.calls.Load()
	ack, err := alice.Send(ctx, conv.ConvID, "x")
	if err != nil || ack.Seq != 1 || ack.Duplicate {
		t.Fatalf("Send after store_unavailable = %+v, %v", ack, err)
	}
	if n := faulty.calls.Load() - calls; n != 3 {
		t.Fatalf("%d append attempts, want 2 failures and a success", n)
	}
	unavailable := 0
	for _, f := range px.framesOf(toClient, protocol.TypeError) {
		if f.Code == protocol.CodeStoreUnavailable {
			unavailable++
		}
	}
	if unavailable != 2 {
		t.Fatalf("%d store_unavailable answers, want 2", unavailable)
	}
}

// create_group carries no idempotency key: when the connection ends with
// the request in flight the outcome is unknown, and the client reports it
// instead of creating a second group.
func TestCreateGroupNotRepeatedAfterDisconnect(t *testing.T) {
	srv := servertest.Start(t)
	px := newProxy(t, srv.URL)
	alice := startE2E(t, px.url(), srv.Token("alice"), "d1", nil)
	px.setRule(onFirst(frameIs(toClient, protocol.TypeConv), dropCut)) // created, answer lost
	ctx := ctxT(t)
	_, err := alice.CreateGroup(ctx, "g", []string{"bob"})
	if !errors.Is(err, ErrDisconnected) {
		t.Fatalf("CreateGroup = %v, want ErrDisconnected", err)
	}
	if got := len(px.sent(protocol.TypeCreateGroup)); got != 1 {
		t.Fatalf("create_group sent %d times, want 1", got)
	}
	list, err := alice.Conversations(ctx) // waits for the reconnect
	if err != nil || len(list) != 1 || list[0].Kind != protocol.ConvGroup {
		t.Fatalf("Conversations = %+v, %v; want the one group", list, err)
	}
}

// A conversation the client first hears of through a push whose
// predecessor was lost: the conversation list gives its starting point and
// history fills the hole.
func TestFirstSightOfConversationViaPush(t *testing.T) {
	srv := servertest.Start(t)
	px := newProxy(t, srv.URL)
	bob := startE2E(t, px.url(), srv.Token("bob"), "d1", nil)
	alice := startE2E(t, srv.URL, srv.Token("alice"), "d1", nil)
	px.setRule(onFirst(frameIs(toClient, protocol.TypeMsg), drop))
	ctx := ctxT(t)
	group, err := alice.CreateGroup(ctx, "g", []string{"bob"})
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{"one", "two"} {
		if _, err := alice.Send(ctx, group.ConvID, body); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "both messages", func() bool { return len(bob.rec.seqs(group.ConvID)) >= 2 })
	wantRun(t, bob.rec.seqs(group.ConvID), 1, 2)
	if len(px.sent(protocol.TypeConvList)) == 0 {
		t.Fatal("starting point found without the conversation list")
	}
}

// An application that stops reading Events loses nothing: pushes dropped
// meanwhile are fetched again once it catches up, and requests keep working.
func TestSlowApplicationLosesNothing(t *testing.T) {
	old := pushQueue
	pushQueue = 8
	t.Cleanup(func() { pushQueue = old })
	srv := servertest.Start(t)
	alice := startE2E(t, srv.URL, srv.Token("alice"), "d1", nil)
	ctx := ctxT(t)
	group, err := alice.CreateGroup(ctx, "g", []string{"bob"})
	if err != nil {
		t.Fatal(err)
	}
	direct, err := alice.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, srv.URL, srv.Token("bob"), "d1")
	cfg.EventBuffer = 4
	bob := launch(t, cfg, false)
	select {
	case first := <-bob.Events():
		if first.Kind != EventConnected {
			t.Fatalf("first event %v, want connected", first.Kind)
		}
	case <-time.After(waitLimit):
		t.Fatal("no connected event")
	}
	const n = 200
	for i := 0; i < n; i++ {
		if _, err := alice.Send(ctx, group.ConvID, "x"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := alice.Send(ctx, direct.ConvID, "y"); err != nil {
		t.Fatal(err)
	}
	// Requests still work while nobody reads Events. (Not in a
	// conversation with unseen messages: bob's own send would move his read
	// position past them, and a conversation this device has not seen yet
	// starts at the read position.)
	own, err := bob.OpenDirect(ctx, "carol")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bob.Send(ctx, own.ConvID, "still talking"); err != nil {
		t.Fatalf("Send while events back up: %v", err)
	}
	rec := record(bob.Client)
	eventually(t, "all messages", func() bool { return len(rec.seqs(group.ConvID)) >= n && len(rec.seqs(direct.ConvID)) >= 1 },
		func() string { return fmt.Sprint(rec.seqs(group.ConvID), rec.seqs(direct.ConvID)) })
	wantRun(t, rec.seqs(group.ConvID), 1, n)
	wantRun(t, rec.seqs(direct.ConvID), 1, 1)
}

// A node over its handshake rate answers 503 overloaded with a jittered
// retry_after_ms; the client waits at least that long before the next try.
func TestOverloadedHonoursRetryAfter(t *testing.T) {
	srv := servertest.Start(t, servertest.WithGateway(func(g *gateway.Config) { g.HandshakeRate, g.HandshakeBurst = 2, 1 }))
	px := newProxy(t, srv.URL)
	// Take the only token with an authenticated (non-upgrade) request:
	// the budget is charged after authentication, so the client's first
	// handshake is refused.
	req, err := http.NewRequest(http.MethodGet, srv.HTTPURL+"/v1/ws?device=x", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+srv.Token("mallory"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	c := startE2E(t, px.url(), srv.Token("alice"), "d1", nil)
	hs, dials := px.handshakes(), px.dials()
	if len(hs) < 2 || hs[0].status != http.StatusServiceUnavailable || len(dials) < 2 {
		t.Fatalf("handshakes %+v: want a 503 first", hs)
	}
	var body struct {
		Code       protocol.Code `json:"code"`
		RetryAfter int64         `json:"retry_after_ms"`
	}
	if err := json.Unmarshal(hs[0].json(), &body); err != nil || body.Code != protocol.CodeOverloaded || body.RetryAfter <= 0 {
		t.Fatalf("refusal body %q: want overloaded with retry_after_ms", hs[0].body)
	}
	asked := time.Duration(body.RetryAfter) * time.Millisecond
	if gap := dials[1].Sub(hs[0].at); gap < asked {
		t.Fatalf("redialled %v after the refusal, want at least retry_after_ms %v", gap, asked)
	}
	if n := c.rec.count(EventConnected); n != 1 {
		t.Fatalf("%d connections, want 1", n)
	}
}
