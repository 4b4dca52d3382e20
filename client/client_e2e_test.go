package client

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/gateway"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// End-to-end tests: the SDK against a real in-process Parley node, without
// faults (faults_test.go injects them; cluster_test.go runs two nodes).

func TestE2ETwoUsersChat(t *testing.T) {
	srv := servertest.Start(t)
	alice := startE2E(t, srv.URL, srv.Token("alice"), "phone", nil)
	bob := startE2E(t, srv.URL, srv.Token("bob"), "phone", nil)
	ctx := ctxT(t)
	conv, err := alice.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatalf("OpenDirect: %v", err)
	}
	var last uint64
	for i := 0; i < 10; i++ {
		ack, err := alice.Send(ctx, conv.ConvID, fmt.Sprintf("hello %d", i))
		if err != nil {
			t.Fatalf("Send: %v", err)
		}
		if ack.Seq <= last || ack.Duplicate {
			t.Fatalf("ack %+v after seq %d", ack, last)
		}
		last = ack.Seq
	}
	reply, err := bob.Send(ctx, conv.ConvID, "hi alice")
	if err != nil {
		t.Fatalf("bob Send: %v", err)
	}
	for name, rc := range map[string]*runningClient{"alice": alice, "bob": bob} {
		eventually(t, name+" has the reply", func() bool { return rc.rec.hasSeq(conv.ConvID, reply.Seq) })
		contiguous(t, name, rc.rec.seqs(conv.ConvID))
	}
	got := bob.rec.messages(conv.ConvID)
	var texts []string
	for _, m := range got {
		if m.Kind == protocol.KindText {
			texts = append(texts, m.Sender+":"+m.Body)
		}
	}
	if len(texts) != 11 || texts[0] != "alice:hello 0" || texts[10] != "bob:hi alice" {
		t.Fatalf("bob saw %q", texts)
	}
	// Read receipts reach the peer of a direct conversation.
	if err := bob.MarkRead(ctx, conv.ConvID, reply.Seq); err != nil {
		t.Fatalf("MarkRead: %v", err)
	}
	eventually(t, "read receipt at alice", func() bool { return alice.rec.receipt("bob", "", protocol.StateRead, reply.Seq) })
	list, err := bob.Conversations(ctx)
	if err != nil || len(list) != 1 || list[0].ConvID != conv.ConvID || list[0].Unread != 0 {
		t.Fatalf("bob's Conversations = %+v, %v", list, err)
	}
	page, _, err := alice.History(ctx, conv.ConvID, HistoryQuery{Forward: true, Limit: 200})
	if err != nil || len(page) == 0 || page[len(page)-1].Seq != reply.Seq {
		t.Fatalf("History from the start = %d messages, %v", len(page), err)
	}
}

// TestE2EFirstSightThroughPushStartsWithSnapshot: a conversation created
// after the client synced reaches it through a push; the client names the
// starting point the conversation list gave with an EventSnapshot before the
// first message, as a sync would have.
func TestE2EFirstSightThroughPushStartsWithSnapshot(t *testing.T) {
	srv := servertest.Start(t)
	alice := startE2E(t, srv.URL, srv.Token("alice"), "phone", nil)
	bob := startE2E(t, srv.URL, srv.Token("bob"), "phone", nil)
	ctx := ctxT(t)
	conv, err := alice.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatalf("OpenDirect: %v", err)
	}
	for i := 0; i < 3; i++ {
		if _, err := alice.Send(ctx, conv.ConvID, fmt.Sprintf("hello %d", i)); err != nil {
			t.Fatalf("Send: %v", err)
		}
	}
	eventually(t, "bob has the three messages", func() bool { return bob.rec.hasSeq(conv.ConvID, 3) })
	bob.rec.mu.Lock()
	defer bob.rec.mu.Unlock()
	var kinds []string
	for _, ev := range bob.rec.events {
		if ev.ConvID != conv.ConvID {
			continue
		}
		switch ev.Kind {
		case EventSnapshot:
			if ev.Snapshot.FromSeq != 0 || ev.Snapshot.Kind != "direct" || ev.Snapshot.JoinSeq != 1 {
				t.Errorf("starting point %+v, want from_seq 0 of a direct conversation joined at 1", *ev.Snapshot)
			}
			kinds = append(kinds, "snapshot")
		case EventMessage:
			kinds = append(kinds, fmt.Sprint(ev.Message.Seq))
		}
	}
	if fmt.Sprint(kinds) != "[snapshot 1 2 3]" {
		t.Fatalf("bob's events for the conversation: %v, want [snapshot 1 2 3]", kinds)
	}
}

func TestE2EOtherDeviceOfSameUser(t *testing.T) {
	srv := servertest.Start(t)
	alice := startE2E(t, srv.URL, srv.Token("alice"), "phone", nil)
	bobPhone := startE2E(t, srv.URL, srv.Token("bob"), "phone", nil)
	bobLaptop := startE2E(t, srv.URL, srv.Token("bob"), "laptop", nil)
	ctx := ctxT(t)
	group, err := alice.CreateGroup(ctx, "friends", []string{"bob"})
	if err != nil {
		t.Fatalf("CreateGroup: %v", err)
	}
	var acks []Ack
	for i := 0; i < 20; i++ {
		sender := alice
		if i%4 == 3 {
			sender = bobPhone // the laptop gets bob's own messages too
		}
		ack, err := sender.Send(ctx, group.ConvID, fmt.Sprintf("m%d", i))
		if err != nil {
			t.Fatalf("Send %d: %v", i, err)
		}
		acks = append(acks, ack)
	}
	lastSeq := acks[len(acks)-1].Seq
	for name, rc := range map[string]*runningClient{"bob/phone": bobPhone, "bob/laptop": bobLaptop} {
		eventually(t, name+" has everything", func() bool { return rc.rec.hasSeq(group.ConvID, lastSeq) })
		contiguous(t, name, rc.rec.seqs(group.ConvID))
		for _, a := range acks {
			if !rc.rec.hasSeq(group.ConvID, a.Seq) {
				t.Fatalf("%s misses seq %d", name, a.Seq)
			}
		}
	}
	// A third device of bob that connects later catches up by sync, from
	// bob's read position: his own last message (seq 20) moved it there,
	// so the tablet starts after it.
	more, err := alice.Send(ctx, group.ConvID, "after bob's last")
	if err != nil {
		t.Fatal(err)
	}
	bobTablet := startE2E(t, srv.URL, srv.Token("bob"), "tablet", nil)
	if got := bobTablet.rec.seqs(group.ConvID); len(got) != 1 || got[0] != more.Seq || more.Seq != lastSeq+1 {
		t.Fatalf("late device got %v by sync, want [%d] (after bob's own seq %d)", got, lastSeq+1, lastSeq)
	}
}

// Messages reach every device in order, the devices acknowledge them with
// coalesced delivered frames, and the request methods answer.
func TestE2ESendReceiveMultiDevice(t *testing.T) {
	srv := servertest.Start(t)
	px := newProxy(t, srv.URL) // bob's devices, to count their frames
	alice := startE2E(t, srv.URL, srv.Token("alice"), "phone", nil)
	bob1 := startE2E(t, px.url(), srv.Token("bob"), "phone", nil)
	bob2 := startE2E(t, px.url(), srv.Token("bob"), "laptop", nil)
	ctx := ctxT(t)
	info, err := alice.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatalf("OpenDirect: %v", err)
	}
	again, err := bob1.OpenDirect(ctx, "alice")
	if err != nil || again.ConvID != info.ConvID {
		t.Fatalf("bob's OpenDirect = %v, %v; want the same conversation %d", again.ConvID, err, info.ConvID)
	}
	const n = 20
	for i := 1; i <= n; i++ {
		ack, err := alice.Send(ctx, info.ConvID, fmt.Sprintf("hi %d", i))
		if err != nil {
			t.Fatalf("Send %d: %v", i, err)
		}
		if ack.Seq != uint64(i) || ack.Duplicate || len(ack.ClientMsgID) != 32 {
			t.Fatalf("ack %d = %+v", i, ack)
		}
	}
	for _, rc := range []*runningClient{alice, bob1, bob2} {
		eventually(t, "every message on every device", func() bool { return len(rc.rec.seqs(info.ConvID)) >= n })
		wantRun(t, rc.rec.seqs(info.ConvID), 1, n)
	}
	// Each device acknowledges up to n; the peer of a direct conversation
	// hears of it.
	eventually(t, "both devices acknowledge everything", func() bool {
		upTo := 0
		for _, f := range px.sent(protocol.TypeDelivered) {
			if f.ConvID == info.ConvID && f.Seq == n {
				upTo++
			}
		}
		return upTo == 2
	})
	eventually(t, "delivered receipt at alice", func() bool { return alice.rec.receipt("bob", "", protocol.StateDelivered, n) })
	if got := len(px.sent(protocol.TypeDelivered)); got >= 2*n {
		t.Errorf("%d delivered frames for %d messages on 2 devices: not coalesced", got, n)
	}
	if seq, ok := bob2.LastSeq(info.ConvID); !ok || seq != n {
		t.Errorf("LastSeq = %d, %v; want %d", seq, ok, n)
	}
	if err := bob1.MarkRead(ctx, info.ConvID, n); err != nil {
		t.Fatalf("MarkRead: %v", err)
	}
	list, err := bob2.Conversations(ctx)
	if err != nil || len(list) != 1 || list[0].Unread != 0 || list[0].ReadSeq != n {
		t.Fatalf("Conversations = %+v, %v; want one conversation read to %d", list, err, n)
	}
	page, more, err := bob2.History(ctx, info.ConvID, HistoryQuery{BeforeSeq: 11, Limit: 5})
	if err != nil || !more || len(page) != 5 || page[0].Seq != 6 || page[4].Seq != 10 {
		t.Fatalf("History(before 11, 5) = %v more=%v err=%v; want 6..10 with more", seqsOf(page), more, err)
	}
}

// A restarted client syncs from the position its StateStore kept, gets
// exactly what it missed before EventConnected, and acknowledges it.
func TestE2EOfflineThenResumeFromStoredPosition(t *testing.T) {
	srv := servertest.Start(t)
	px := newProxy(t, srv.URL)
	alice := startE2E(t, srv.URL, srv.Token("alice"), "phone", nil)
	ctx := ctxT(t)
	conv, err := alice.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatalf("OpenDirect: %v", err)
	}
	state := NewMemoryState()
	withState := func(c *Config) { c.State = state }
	bob := startE2E(t, px.url(), srv.Token("bob"), "phone", withState)
	for i := 0; i < 5; i++ {
		if _, err := alice.Send(ctx, conv.ConvID, fmt.Sprint("online ", i)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "first five", func() bool { return len(bob.rec.seqs(conv.ConvID)) == 5 })
	bob.Close()
	if pos, _ := state.Load(ctx); pos[conv.ConvID] != 5 {
		t.Fatalf("stored position %d, want 5", pos[conv.ConvID])
	}
	for i := 0; i < 3; i++ {
		if _, err := alice.Send(ctx, conv.ConvID, fmt.Sprint("while away ", i)); err != nil {
			t.Fatal(err)
		}
	}
	bob2 := startE2E(t, px.url(), srv.Token("bob"), "phone", withState)
	// startE2E returned at EventConnected: the sync's messages came before it.
	wantRun(t, bob2.rec.seqs(conv.ConvID), 6, 8)
	if ev := bob2.rec.find(EventSnapshot, conv.ConvID); ev == nil || ev.Skipped != 0 {
		t.Fatalf("snapshot event %+v", ev)
	}
	syncs := px.sent(protocol.TypeSync)
	last := syncs[len(syncs)-1]
	if !last.All || len(last.Convs) != 1 || last.Convs[0].ConvID != conv.ConvID || last.Convs[0].AfterSeq != 5 {
		t.Fatalf("resume sync %+v, want all:true with after_seq 5", last)
	}
	eventually(t, "delivered after snapshot", func() bool { return alice.rec.receipt("bob", "phone", protocol.StateDelivered, 8) })
}

// A conversation too far behind is jumped: the snapshot says how much was
// skipped, the latest messages follow, and later pushes continue from there.
func TestE2ESnapshotJumpReportsSkipped(t *testing.T) {
	// The server's range limit and latest count (200 and 50 by default)
	// scaled down, so the test stores 30 messages rather than 300.
	srv := servertest.Start(t, servertest.WithChat(func(c *chat.Config) { c.SnapshotRangeLimit, c.SnapshotLatest = 20, 5 }))
	alice := startE2E(t, srv.URL, srv.Token("alice"), "phone", nil)
	ctx := ctxT(t)
	group, err := alice.CreateGroup(ctx, "g", []string{"bob"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 30; i++ {
		if _, err := alice.Send(ctx, group.ConvID, "x"); err != nil {
			t.Fatal(err)
		}
	}
	bob := startE2E(t, srv.URL, srv.Token("bob"), "d1", nil)
	ev := bob.rec.find(EventSnapshot, group.ConvID)
	if ev == nil || ev.Skipped != 25 || ev.Snapshot.MoreUnread != 25 || ev.Snapshot.Messages != nil {
		t.Fatalf("snapshot event %+v, want Skipped 25 without messages", ev)
	}
	wantRun(t, bob.rec.seqs(group.ConvID), 26, 30)
	if _, err := alice.Send(ctx, group.ConvID, "after"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "next push", func() bool { return len(bob.rec.seqs(group.ConvID)) == 6 })
	wantRun(t, bob.rec.seqs(group.ConvID), 26, 31)
}

func TestE2EUnauthorized(t *testing.T) {
	srv := servertest.Start(t)
	tokens := map[string]string{
		"forged":  "not-a-jwt",
		"expired": servertest.MintToken(t, srv.Key(), "alice", -time.Hour),
	}
	for name, token := range tokens {
		t.Run(name, func(t *testing.T) {
			c := launch(t, testConfig(t, srv.URL, token, "phone"), false)
			select {
			case err := <-c.errc:
				if !errors.Is(err, ErrUnauthorized) {
					t.Fatalf("Run = %v, want ErrUnauthorized", err)
				}
			case <-time.After(waitLimit):
				t.Fatal("Run kept retrying a refused token")
			}
			if _, err := c.Send(ctxT(t), 1, "x"); !errors.Is(err, ErrClosed) {
				t.Fatalf("Send after Run returned = %v, want ErrClosed", err)
			}
		})
	}
}

// A second connection of the same user and device makes the server close
// the first with 4009; that client stops instead of fighting back.
func TestE2EReplacedStops(t *testing.T) {
	srv := servertest.Start(t)
	px := newProxy(t, srv.URL)
	first := startE2E(t, px.url(), srv.Token("alice"), "d1", nil)
	second := startE2E(t, srv.URL, srv.Token("alice"), "d1", nil)
	select {
	case err := <-first.errc:
		if !errors.Is(err, ErrReplaced) {
			t.Fatalf("Run = %v, want ErrReplaced", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("Run did not stop after 4009")
	}
	<-first.rec.done // Events is closed
	if evs, _ := first.rec.all(EventDisconnected); len(evs) != 1 || !errors.Is(evs[0].Err, ErrReplaced) {
		t.Fatalf("disconnect events %+v, want one with ErrReplaced", evs)
	}
	if n := len(px.dials()); n != 1 {
		t.Fatalf("%d dials by the replaced client, want 1", n)
	}
	if _, ok := second.Hello(); !ok || second.rec.count(EventDisconnected) != 0 {
		t.Fatal("the newer connection did not stay")
	}
}

// The client pings every heartbeat_ms the hello announces, so a server with
// a short idle timeout keeps it.
func TestE2EHeartbeatPings(t *testing.T) {
	srv := servertest.Start(t, servertest.WithGateway(func(g *gateway.Config) {
		g.HeartbeatInterval, g.IdleTimeout = 50*time.Millisecond, 400*time.Millisecond
	}))
	px := newProxy(t, srv.URL)
	c := startE2E(t, px.url(), srv.Token("alice"), "d1", nil)
	// 30 pings take 1.5s: the server's once-a-second idle sweep has run.
	eventually(t, "pings", func() bool { return len(px.sent(protocol.TypePing)) >= 30 })
	if n := c.rec.count(EventDisconnected); n != 0 {
		t.Fatalf("%d disconnects: the server found the client idle", n)
	}
	if pongs := len(px.framesOf(toClient, protocol.TypePong)); pongs == 0 {
		t.Fatal("no pong came back")
	}
}

func TestE2ECloseLifecycle(t *testing.T) {
	srv := servertest.Start(t)
	c, err := New(testConfig(t, srv.URL, srv.Token("alice"), "d1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, open := <-c.Events(); open {
		t.Fatal("Events open after Close")
	}
	if err := c.Run(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Run after Close = %v, want ErrClosed", err)
	}

	rc := startE2E(t, srv.URL, srv.Token("alice"), "d2", nil)
	if err := rc.Run(context.Background()); !errors.Is(err, ErrRunning) {
		t.Fatalf("second Run = %v, want ErrRunning", err)
	}
	done := make(chan struct{})
	go func() { rc.Close(); rc.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(waitLimit):
		t.Fatal("Close did not return")
	}
	if err := <-rc.errc; err != nil {
		t.Fatalf("Run after Close = %v, want nil", err)
	}
	<-rc.rec.done
	if evs, _ := rc.rec.all(EventDisconnected); len(evs) != 1 || evs[0].Err != nil {
		t.Fatalf("disconnect events %+v, want one with a nil Err (closed by the client)", evs)
	}
}
