package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/protocol"
)

const waitLimit = 10 * time.Second

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p))
	return len(p), nil
}

// recorder drains a client's events (unless paused) and keeps them.
type recorder struct {
	mu     sync.Mutex
	events []Event
	done   chan struct{}
}

func record(c *Client) *recorder {
	r := &recorder{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for ev := range c.Events() {
			r.mu.Lock()
			r.events = append(r.events, ev)
			r.mu.Unlock()
		}
	}()
	return r
}

// seqs returns the seqs of conv's message events, in arrival order.
func (r *recorder) seqs(convID uint64) []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []uint64
	for _, ev := range r.events {
		if ev.Kind == EventMessage && ev.ConvID == convID {
			out = append(out, ev.Message.Seq)
		}
	}
	return out
}

func (r *recorder) count(kind EventKind) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, ev := range r.events {
		if ev.Kind == kind {
			n++
		}
	}
	return n
}

func (r *recorder) find(kind EventKind, convID uint64) *Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.events {
		if r.events[i].Kind == kind && r.events[i].ConvID == convID {
			return &r.events[i]
		}
	}
	return nil
}

func eventually(t *testing.T, what string, cond func() bool, state ...func() string) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			var detail string
			for _, s := range state {
				detail += " " + s()
			}
			t.Fatalf("timed out waiting for %s;%s", what, detail)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// wantRun checks that conv's messages arrived exactly as from..to.
func wantRun(t *testing.T, got []uint64, from, to uint64) {
	t.Helper()
	if uint64(len(got)) != to-from+1 {
		t.Fatalf("got %d messages %v, want seqs %d..%d", len(got), got, from, to)
	}
	for i, s := range got {
		if s != from+uint64(i) {
			t.Fatalf("message %d has seq %d, want %d (all: %v)", i, s, from+uint64(i), got)
		}
	}
}

type runningClient struct {
	*Client
	rec  *recorder
	errc chan error
}

func startClient(t *testing.T, fs *fakeServer, user, device string, edit func(*Config)) *runningClient {
	t.Helper()
	cfg := Config{URL: fs.URL, Token: user, Device: device, MinBackoff: 10 * time.Millisecond,
		MaxBackoff: 100 * time.Millisecond, RequestTimeout: 2 * time.Second, Logger: testLogger(t)}
	if edit != nil {
		edit(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	rc := &runningClient{Client: c, errc: make(chan error, 1)}
	go func() { rc.errc <- c.Run(context.Background()) }()
	t.Cleanup(func() { c.Close() })
	return rc
}

func (rc *runningClient) recordEvents() *runningClient { rc.rec = record(rc.Client); return rc }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	return ctx
}

func TestConfigValidate(t *testing.T) {
	ok := Config{URL: "ws://127.0.0.1:7480", Token: "t", Device: "cli"}
	tests := []struct {
		name string
		edit func(*Config)
		ok   bool
	}{
		{"valid", func(*Config) {}, true},
		{"wss with path", func(c *Config) { c.URL = "wss://h/v1/ws" }, true},
		{"token func", func(c *Config) {
			c.Token = ""
			c.TokenFunc = func(context.Context) (string, error) { return "t", nil }
		}, true},
		{"http scheme", func(c *Config) { c.URL = "http://h" }, false},
		{"no host", func(c *Config) { c.URL = "ws://" }, false},
		{"no token", func(c *Config) { c.Token = "" }, false},
		{"both tokens", func(c *Config) { c.TokenFunc = func(context.Context) (string, error) { return "", nil } }, false},
		{"bad device", func(c *Config) { c.Device = "a b" }, false},
		{"empty device", func(c *Config) { c.Device = "" }, false},
		{"min over max", func(c *Config) { c.MinBackoff, c.MaxBackoff = time.Second, time.Millisecond }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ok
			tc.edit(&cfg)
			err := cfg.Validate()
			if (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, does not wrap ErrInvalidConfig", err)
			}
		})
	}
}

func TestSyncFrames(t *testing.T) {
	pos := map[uint64]uint64{}
	for i := uint64(1); i <= 5; i++ {
		pos[i] = i * 10
	}
	frames := syncFrames(pos, 2)
	if len(frames) != 3 || !frames[0].All || frames[1].All || frames[2].All {
		t.Fatalf("got %d frames (all flags %v %v), want 3 with only the first all:true", len(frames), frames[0].All, frames[len(frames)-1].All)
	}
	var n int
	for _, f := range frames {
		for _, sc := range f.Convs {
			n++
			if sc.AfterSeq != pos[sc.ConvID] {
				t.Errorf("conv %d after_seq %d, want %d", sc.ConvID, sc.AfterSeq, pos[sc.ConvID])
			}
		}
	}
	if n != 5 {
		t.Fatalf("%d positions sent, want 5", n)
	}
	if f := syncFrames(nil, 2); len(f) != 1 || !f[0].All || len(f[0].Convs) != 0 {
		t.Fatalf("no positions: got %+v, want one all:true frame", f)
	}
}

func TestNewClientMsgID(t *testing.T) {
	a, b := NewClientMsgID(), NewClientMsgID()
	if len(a) != 32 || a == b {
		t.Fatalf("ids %q %q: want 32 hex chars, distinct", a, b)
	}
}

func TestSendReceiveMultiDevice(t *testing.T) {
	fs := newFakeServer(t)
	alice := startClient(t, fs, "alice", "phone", nil).recordEvents()
	bob1 := startClient(t, fs, "bob", "phone", nil).recordEvents()
	bob2 := startClient(t, fs, "bob", "laptop", nil).recordEvents()
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
	eventually(t, "delivered acks", func() bool {
		return fs.deliveredSeq("bob", "phone", info.ConvID) == n && fs.deliveredSeq("bob", "laptop", info.ConvID) == n
	})
	// Delivered frames are coalesced, not one per message.
	if got := len(fs.frames(protocol.TypeDelivered)); got >= 3*n {
		t.Errorf("%d delivered frames for %d messages on 3 devices: not coalesced", got, n)
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

func TestGapFetchedFromHistory(t *testing.T) {
	fs := newFakeServer(t)
	conv := fs.newConv(protocol.ConvDirect, "alice", "bob")
	lost := map[uint64]bool{3: true, 4: true, 7: true, 12: true, 13: true, 14: true}
	fs.dropPush = func(user, _ string, m protocol.Message) bool { return user == "bob" && lost[m.Seq] }
	bob := startClient(t, fs, "bob", "d1", nil).recordEvents()
	eventually(t, "connected", func() bool { return bob.rec.count(EventConnected) == 1 })
	for i := 1; i <= 20; i++ {
		fs.appendMessage(conv, "alice", "x")
	}
	eventually(t, "all messages", func() bool { return len(bob.rec.seqs(conv)) >= 20 })
	wantRun(t, bob.rec.seqs(conv), 1, 20)
	if len(fs.frames(protocol.TypeHistory)) == 0 {
		t.Fatal("holes were filled without a history request")
	}
}

func TestReconnectMidStreamNoGapNoDup(t *testing.T) {
	fs := newFakeServer(t)
	conv := fs.newConv(protocol.ConvGroup, "alice", "bob")
	bob := startClient(t, fs, "bob", "d1", nil).recordEvents()
	eventually(t, "connected", func() bool { return bob.rec.count(EventConnected) == 1 })
	for i := 1; i <= 300; i++ {
		fs.appendMessage(conv, "alice", "x")
		if i%60 == 0 {
			// Cut the connection abruptly while pushes are in flight, and
			// keep storing while the client is away (fewer than the 200
			// that would make the snapshot jump).
			connects := bob.rec.count(EventConnected)
			_ = fs.conn("bob", "d1").ws.Close()
			for j := 0; j < 30; j++ {
				i++
				fs.appendMessage(conv, "alice", "offline")
			}
			eventually(t, "reconnect", func() bool { return bob.rec.count(EventConnected) > connects })
		}
	}
	total := fs.logLen(conv)
	eventually(t, "all messages after reconnects", func() bool { return len(bob.rec.seqs(conv)) >= total }, func() string { return fmt.Sprint(bob.rec.seqs(conv)) })
	wantRun(t, bob.rec.seqs(conv), 1, uint64(total))
	if got := bob.rec.count(EventConnected); got < 2 {
		t.Fatalf("%d connections, want reconnects", got)
	}
	// Every reconnect's sync carried the position reached so far.
	var positioned int
	for _, f := range fs.frames(protocol.TypeSync) {
		if !f.All {
			t.Errorf("sync without all:true: %+v", f)
		}
		for _, sc := range f.Convs {
			if sc.ConvID == conv && sc.AfterSeq > 0 {
				positioned++
			}
		}
	}
	if positioned == 0 {
		t.Fatal("no sync carried the conversation's position")
	}
}

func TestSendRetriedWithSameIDAfterDisconnect(t *testing.T) {
	fs := newFakeServer(t)
	conv := fs.newConv(protocol.ConvDirect, "alice", "bob")
	var once sync.Once
	fs.intercept = func(fc *fakeConn, f *protocol.Frame) bool {
		hit := false
		if f.Type == protocol.TypeSend {
			once.Do(func() {
				hit = true
				fs.store(fc.user, fc.device, f) // stored, but the ack is lost
				_ = fc.ws.Close()
			})
		}
		return hit
	}
	alice := startClient(t, fs, "alice", "d1", nil).recordEvents()
	ack, err := alice.Send(ctxT(t), conv, "only once")
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	if !ack.Duplicate || ack.Seq != 1 {
		t.Fatalf("ack = %+v; want the stored message's ack with duplicate", ack)
	}
	sends := fs.frames(protocol.TypeSend)
	if len(sends) != 2 || sends[0].ClientMsgID != sends[1].ClientMsgID || sends[0].ClientMsgID != ack.ClientMsgID {
		t.Fatalf("sends %+v: want two attempts with one client_msg_id", sends)
	}
	if got := fs.logLen(conv); got != 1 {
		t.Fatalf("%d messages stored, want 1", got)
	}
	eventually(t, "own message", func() bool { return len(alice.rec.seqs(conv)) == 1 })
}

func TestSendRetriedAfterTimeout(t *testing.T) {
	fs := newFakeServer(t)
	conv := fs.newConv(protocol.ConvDirect, "alice", "bob")
	var once sync.Once
	fs.intercept = func(fc *fakeConn, f *protocol.Frame) bool {
		hit := false
		if f.Type == protocol.TypeSend {
			once.Do(func() { hit = true }) // swallowed: no answer at all
		}
		return hit
	}
	alice := startClient(t, fs, "alice", "d1", func(c *Config) { c.RequestTimeout = 200 * time.Millisecond })
	ack, err := alice.SendWithID(ctxT(t), conv, "my-id-1", "hello")
	if err != nil || ack.ClientMsgID != "my-id-1" || ack.Seq != 1 {
		t.Fatalf("SendWithID = %+v, %v", ack, err)
	}
	if sends := fs.frames(protocol.TypeSend); len(sends) != 2 || sends[1].ClientMsgID != "my-id-1" {
		t.Fatalf("sends %+v, want a retry of my-id-1", sends)
	}
	ack2, err := alice.SendWithID(ctxT(t), conv, "my-id-1", "hello")
	if err != nil || !ack2.Duplicate || ack2.Seq != 1 || fs.logLen(conv) != 1 {
		t.Fatalf("repeat SendWithID = %+v, %v, log %d; want duplicate of seq 1", ack2, err, fs.logLen(conv))
	}
}

func TestServerErrors(t *testing.T) {
	fs := newFakeServer(t)
	alice := startClient(t, fs, "alice", "d1", nil)
	ctx := ctxT(t)
	_, err := alice.Send(ctx, 999, "x")
	var e *Error
	if !errors.As(err, &e) || e.Code != protocol.CodeNotFound {
		t.Fatalf("Send to unknown conversation = %v, want *Error not_found", err)
	}
	big := make([]byte, protocol.DefaultLimits.MaxBodyBytes+1)
	for i := range big {
		big[i] = 'a'
	}
	conv := fs.newConv(protocol.ConvDirect, "alice", "bob")
	if _, err := alice.Send(ctx, conv, string(big)); !errors.As(err, &e) || e.Code != protocol.CodeTooLarge {
		t.Fatalf("oversized Send = %v, want too_large before sending", err)
	}
	// A retryable error is retried until it clears.
	var n int
	var mu sync.Mutex
	fs.intercept = func(fc *fakeConn, f *protocol.Frame) bool {
		mu.Lock()
		defer mu.Unlock()
		if f.Type == protocol.TypeSend && n < 2 {
			n++
			fc.send(&protocol.Frame{Type: protocol.TypeError, RID: f.RID, Code: protocol.CodeStoreUnavailable, Error: "try again", RetryAfter: 20})
			return true
		}
		return false
	}
	if ack, err := alice.Send(ctx, conv, "x"); err != nil || ack.Seq != 1 {
		t.Fatalf("Send after store_unavailable = %+v, %v", ack, err)
	}
}

func TestCreateGroupNotRepeatedAfterDisconnect(t *testing.T) {
	fs := newFakeServer(t)
	fs.intercept = func(fc *fakeConn, f *protocol.Frame) bool {
		if f.Type == protocol.TypeCreateGroup {
			_ = fc.ws.Close()
			return true
		}
		return false
	}
	alice := startClient(t, fs, "alice", "d1", nil)
	_, err := alice.CreateGroup(ctxT(t), "g", []string{"bob"})
	if !errors.Is(err, ErrDisconnected) {
		t.Fatalf("CreateGroup = %v, want ErrDisconnected", err)
	}
	if got := len(fs.frames(protocol.TypeCreateGroup)); got != 1 {
		t.Fatalf("create_group sent %d times, want 1", got)
	}
}

func TestUnauthorizedStops(t *testing.T) {
	fs := newFakeServer(t)
	c := startClient(t, fs, "bad", "d1", nil)
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
}

func TestReplacedStops(t *testing.T) {
	fs := newFakeServer(t)
	c := startClient(t, fs, "alice", "d1", nil).recordEvents()
	eventually(t, "connected", func() bool { return fs.conn("alice", "d1") != nil })
	fs.conn("alice", "d1").closeWith(protocol.CloseReplaced, "replaced")
	select {
	case err := <-c.errc:
		if !errors.Is(err, ErrReplaced) {
			t.Fatalf("Run = %v, want ErrReplaced", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("Run reconnected after 4009")
	}
	<-c.rec.done // Events is closed
	fs.mu.Lock()
	dials := fs.dials
	fs.mu.Unlock()
	if dials != 1 {
		t.Fatalf("%d dials, want 1", dials)
	}
}

func TestOverloadedHonoursRetryAfter(t *testing.T) {
	fs := newFakeServer(t)
	var mu sync.Mutex
	var dials []time.Time
	fs.refuse = func(w http.ResponseWriter, r *http.Request) bool {
		mu.Lock()
		defer mu.Unlock()
		dials = append(dials, time.Now())
		if len(dials) == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"code":"overloaded","error":"busy","retry_after_ms":300}`))
			return true
		}
		return false
	}
	c := startClient(t, fs, "alice", "d1", nil).recordEvents()
	eventually(t, "connected", func() bool { return c.rec.count(EventConnected) == 1 })
	mu.Lock()
	defer mu.Unlock()
	if gap := dials[1].Sub(dials[0]); gap < 300*time.Millisecond {
		t.Fatalf("redialled after %v, want at least retry_after_ms 300ms", gap)
	}
}

func TestGoAwayDelaysReconnect(t *testing.T) {
	fs := newFakeServer(t)
	c := startClient(t, fs, "alice", "d1", nil).recordEvents()
	eventually(t, "connected", func() bool { return c.rec.count(EventConnected) == 1 })
	fc := fs.conn("alice", "d1")
	fc.send(&protocol.Frame{Type: protocol.TypeGoAway, RetryAfter: 300})
	time.Sleep(20 * time.Millisecond)
	closed := time.Now()
	fc.closeWith(protocol.CloseGoingAway, "draining")
	eventually(t, "reconnected", func() bool { return c.rec.count(EventConnected) == 2 })
	if d := time.Since(closed); d < 300*time.Millisecond {
		t.Fatalf("reconnected after %v, want at least the goaway delay 300ms", d)
	}
}

func TestSnapshotJumpReportsSkipped(t *testing.T) {
	fs := newFakeServer(t)
	conv := fs.newConv(protocol.ConvGroup, "alice", "bob")
	for i := 0; i < 300; i++ {
		fs.appendMessage(conv, "alice", "x")
	}
	bob := startClient(t, fs, "bob", "d1", nil).recordEvents()
	eventually(t, "snapshot messages", func() bool { return len(bob.rec.seqs(conv)) >= 50 })
	ev := bob.rec.find(EventSnapshot, conv)
	if ev == nil || ev.Skipped != 250 || ev.Snapshot.MoreUnread != 250 || ev.Snapshot.Messages != nil {
		t.Fatalf("snapshot event %+v, want Skipped 250 without messages", ev)
	}
	wantRun(t, bob.rec.seqs(conv), 251, 300)
	fs.appendMessage(conv, "alice", "after")
	eventually(t, "next push", func() bool { return len(bob.rec.seqs(conv)) == 51 })
	wantRun(t, bob.rec.seqs(conv), 251, 301)
}

func TestOfflineThenResumeFromStoredPosition(t *testing.T) {
	fs := newFakeServer(t)
	conv := fs.newConv(protocol.ConvDirect, "alice", "bob")
	state := NewMemoryState()
	withState := func(c *Config) { c.State = state }
	bob := startClient(t, fs, "bob", "d1", withState).recordEvents()
	for i := 0; i < 5; i++ {
		fs.appendMessage(conv, "alice", "x")
	}
	eventually(t, "first five", func() bool { return len(bob.rec.seqs(conv)) == 5 })
	bob.Close()
	if pos, _ := state.Load(context.Background()); pos[conv] != 5 {
		t.Fatalf("stored position %d, want 5", pos[conv])
	}
	for i := 0; i < 3; i++ {
		fs.appendMessage(conv, "alice", "y")
	}
	bob2 := startClient(t, fs, "bob", "d1", withState).recordEvents()
	eventually(t, "offline messages", func() bool { return len(bob2.rec.seqs(conv)) >= 3 })
	wantRun(t, bob2.rec.seqs(conv), 6, 8)
	syncs := fs.frames(protocol.TypeSync)
	last := syncs[len(syncs)-1]
	if len(last.Convs) != 1 || last.Convs[0].AfterSeq != 5 {
		t.Fatalf("resume sync %+v, want after_seq 5", last.Convs)
	}
	eventually(t, "delivered after snapshot", func() bool { return fs.deliveredSeq("bob", "d1", conv) == 8 })
}

func TestFirstSightOfConversationViaPush(t *testing.T) {
	fs := newFakeServer(t)
	bob := startClient(t, fs, "bob", "d1", nil).recordEvents()
	eventually(t, "connected", func() bool { return bob.rec.count(EventConnected) == 1 })
	conv := fs.newConv(protocol.ConvGroup, "alice", "bob")
	fs.dropPush = func(user, _ string, m protocol.Message) bool { return user == "bob" && m.Seq == 1 }
	fs.appendMessage(conv, "alice", "one")
	fs.appendMessage(conv, "alice", "two")
	eventually(t, "both messages", func() bool { return len(bob.rec.seqs(conv)) >= 2 })
	wantRun(t, bob.rec.seqs(conv), 1, 2)
	if len(fs.frames(protocol.TypeConvList)) == 0 {
		t.Fatal("starting point found without the conversation list")
	}
}

func TestSlowApplicationLosesNothing(t *testing.T) {
	old := pushQueue
	pushQueue = 8
	t.Cleanup(func() { pushQueue = old })
	fs := newFakeServer(t)
	conv := fs.newConv(protocol.ConvGroup, "alice", "bob")
	other := fs.newConv(protocol.ConvDirect, "alice", "bob")
	bob := startClient(t, fs, "bob", "d1", func(c *Config) { c.EventBuffer = 4 })
	var first Event
	select {
	case first = <-bob.Events():
	case <-time.After(waitLimit):
		t.Fatal("no connected event")
	}
	if first.Kind != EventConnected {
		t.Fatalf("first event %v, want connected", first.Kind)
	}
	const n = 400
	for i := 0; i < n; i++ {
		fs.appendMessage(conv, "alice", "x")
	}
	fs.appendMessage(other, "alice", "y")
	// Requests still work while nobody reads Events.
	if _, err := bob.Send(ctxT(t), other, "still talking"); err != nil {
		t.Fatalf("Send while events back up: %v", err)
	}
	rec := record(bob.Client)
	eventually(t, "all messages", func() bool { return len(rec.seqs(conv)) >= n && len(rec.seqs(other)) >= 2 }, func() string { return fmt.Sprint(rec.seqs(conv), rec.seqs(other)) })
	wantRun(t, rec.seqs(conv), 1, n)
	wantRun(t, rec.seqs(other), 1, 2)
}

func TestHeartbeatPings(t *testing.T) {
	fs := newFakeServer(t)
	fs.heartbeatMS = 30
	startClient(t, fs, "alice", "d1", nil)
	eventually(t, "pings", func() bool { return len(fs.frames(protocol.TypePing)) >= 3 })
}

func TestCloseLifecycle(t *testing.T) {
	fs := newFakeServer(t)
	c, err := New(Config{URL: fs.URL, Token: "alice", Device: "d1"})
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

	rc := startClient(t, fs, "alice", "d2", nil)
	eventually(t, "connected", func() bool { _, ok := rc.Hello(); return ok })
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
}
