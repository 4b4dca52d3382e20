package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// End-to-end tests: the SDK against a real in-process Parley node.

func startE2E(t *testing.T, url, token, device string, edit func(*Config)) *runningClient {
	t.Helper()
	cfg := Config{URL: url, Token: token, Device: device, MinBackoff: 10 * time.Millisecond,
		MaxBackoff: 200 * time.Millisecond, RequestTimeout: 3 * time.Second, Logger: testLogger(t)}
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
	rc.recordEvents()
	eventually(t, device+" connected", func() bool { return rc.rec.count(EventConnected) > 0 })
	return rc
}

// contiguous checks that seqs strictly increase by one.
func contiguous(t *testing.T, who string, seqs []uint64) {
	t.Helper()
	for i := 1; i < len(seqs); i++ {
		if seqs[i] != seqs[i-1]+1 {
			t.Fatalf("%s: seq %d follows %d (all: %v)", who, seqs[i], seqs[i-1], seqs)
		}
	}
}

func (r *recorder) messages(convID uint64) []protocol.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []protocol.Message
	for _, ev := range r.events {
		if ev.Kind == EventMessage && ev.ConvID == convID {
			out = append(out, *ev.Message)
		}
	}
	return out
}

func (r *recorder) hasSeq(convID, seq uint64) bool {
	for _, s := range r.seqs(convID) {
		if s == seq {
			return true
		}
	}
	return false
}

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
	eventually(t, "read receipt at alice", func() bool {
		alice.rec.mu.Lock()
		defer alice.rec.mu.Unlock()
		for _, ev := range alice.rec.events {
			if ev.Kind == EventReceipt && ev.Receipt.UserID == "bob" && ev.Receipt.State == protocol.StateRead && ev.Receipt.Seq == reply.Seq {
				return true
			}
		}
		return false
	})
	list, err := bob.Conversations(ctx)
	if err != nil || len(list) != 1 || list[0].ConvID != conv.ConvID || list[0].Unread != 0 {
		t.Fatalf("bob's Conversations = %+v, %v", list, err)
	}
	page, _, err := alice.History(ctx, conv.ConvID, HistoryQuery{Forward: true, Limit: 200})
	if err != nil || len(page) == 0 || page[len(page)-1].Seq != reply.Seq {
		t.Fatalf("History from the start = %d messages, %v", len(page), err)
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
		seqs := rc.rec.seqs(group.ConvID)
		contiguous(t, name, seqs)
		for _, a := range acks {
			if !rc.rec.hasSeq(group.ConvID, a.Seq) {
				t.Fatalf("%s misses seq %d", name, a.Seq)
			}
		}
	}
	// A third device of bob that connects later catches up by sync.
	bobTablet := startE2E(t, srv.URL, srv.Token("bob"), "tablet", nil)
	if !bobTablet.rec.hasSeq(group.ConvID, lastSeq) {
		t.Fatalf("late device got %v by sync, want up to %d", bobTablet.rec.seqs(group.ConvID), lastSeq)
	}
	contiguous(t, "bob/tablet", bobTablet.rec.seqs(group.ConvID))
}

func TestE2EReconnectMidStream(t *testing.T) {
	srv := servertest.Start(t)
	px := newCutProxy(t, strings.TrimPrefix(srv.URL, "ws://"))
	alice := startE2E(t, srv.URL, srv.Token("alice"), "phone", nil)
	bob := startE2E(t, "ws://"+px.addr(), srv.Token("bob"), "phone", nil)
	ctx := ctxT(t)
	conv, err := alice.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatalf("OpenDirect: %v", err)
	}
	var last uint64
	for i := 1; i <= 240; i++ {
		ack, err := alice.Send(ctx, conv.ConvID, fmt.Sprint(i))
		if err != nil {
			t.Fatalf("Send %d: %v", i, err)
		}
		last = ack.Seq
		if i%60 == 0 {
			connects := bob.rec.count(EventConnected)
			px.cut() // pushes in flight are lost with the connection
			eventually(t, "bob reconnects", func() bool { return bob.rec.count(EventConnected) > connects })
		}
	}
	eventually(t, "bob has everything", func() bool { return bob.rec.hasSeq(conv.ConvID, last) },
		func() string { return fmt.Sprint(bob.rec.seqs(conv.ConvID)) })
	seqs := bob.rec.seqs(conv.ConvID)
	contiguous(t, "bob", seqs)
	if seqs[0] > 1 {
		t.Fatalf("bob's first seq is %d", seqs[0])
	}
	if bob.rec.count(EventDisconnected) < 4 {
		t.Fatalf("%d disconnects, want 4", bob.rec.count(EventDisconnected))
	}
}

func TestE2ESendRetrySameIDAfterDisconnect(t *testing.T) {
	srv := servertest.Start(t)
	px := newCutProxy(t, strings.TrimPrefix(srv.URL, "ws://"))
	alice := startE2E(t, "ws://"+px.addr(), srv.Token("alice"), "phone", nil)
	bob := startE2E(t, srv.URL, srv.Token("bob"), "phone", nil)
	ctx := ctxT(t)
	conv, err := alice.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatalf("OpenDirect: %v", err)
	}
	// The send reaches the server but its ack never reaches alice; then the
	// connection drops. The SDK must resend the same frame, not a new one.
	px.blackhole(true)
	type result struct {
		ack Ack
		err error
	}
	done := make(chan result, 1)
	go func() {
		ack, err := alice.SendWithID(ctx, conv.ConvID, "retry-me-1", "exactly once")
		done <- result{ack, err}
	}()
	eventually(t, "message stored (bob sees it)", func() bool { return len(bob.rec.seqs(conv.ConvID)) > 0 })
	px.blackhole(false)
	px.cut()
	r := <-done
	if r.err != nil {
		t.Fatalf("SendWithID: %v", r.err)
	}
	if !r.ack.Duplicate {
		t.Fatalf("ack %+v: want the stored message's ack, marked duplicate", r.ack)
	}
	// And an explicit second attempt after the reconnect is deduplicated too.
	again, err := alice.SendWithID(ctx, conv.ConvID, "retry-me-1", "exactly once")
	if err != nil || !again.Duplicate || again.Seq != r.ack.Seq {
		t.Fatalf("repeat = %+v, %v; want duplicate of seq %d", again, err, r.ack.Seq)
	}
	page, _, err := bob.History(ctx, conv.ConvID, HistoryQuery{Forward: true, Limit: 200})
	if err != nil {
		t.Fatalf("History: %v", err)
	}
	n := 0
	for _, m := range page {
		if m.ClientMsgID == "retry-me-1" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d stored messages with the id, want 1", n)
	}
	eventually(t, "alice gets her own message once", func() bool { return alice.rec.hasSeq(conv.ConvID, r.ack.Seq) })
	contiguous(t, "alice", alice.rec.seqs(conv.ConvID))
}

func TestE2EOfflineCatchUp(t *testing.T) {
	srv := servertest.Start(t)
	alice := startE2E(t, srv.URL, srv.Token("alice"), "phone", nil)
	ctx := ctxT(t)
	conv, err := alice.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatalf("OpenDirect: %v", err)
	}
	state := NewMemoryState()
	bob := startE2E(t, srv.URL, srv.Token("bob"), "phone", func(c *Config) { c.State = state })
	first, err := alice.Send(ctx, conv.ConvID, "before")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "bob online gets it", func() bool { return bob.rec.hasSeq(conv.ConvID, first.Seq) })
	bob.Close()
	var last Ack
	for i := 0; i < 5; i++ {
		if last, err = alice.Send(ctx, conv.ConvID, fmt.Sprint("while away ", i)); err != nil {
			t.Fatal(err)
		}
	}
	bob2 := startE2E(t, srv.URL, srv.Token("bob"), "phone", func(c *Config) { c.State = state })
	seqs := bob2.rec.seqs(conv.ConvID)
	if len(seqs) != 5 || seqs[0] != first.Seq+1 || seqs[4] != last.Seq {
		t.Fatalf("after reconnect bob got %v, want %d..%d by sync before Connected", seqs, first.Seq+1, last.Seq)
	}
	if ev := bob2.rec.find(EventSnapshot, conv.ConvID); ev == nil || ev.Skipped != 0 {
		t.Fatalf("snapshot event %+v", ev)
	}
}

func TestE2EUnauthorized(t *testing.T) {
	srv := servertest.Start(t)
	c, err := New(Config{URL: srv.URL, Token: "not-a-jwt", Device: "phone", Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- c.Run(context.Background()) }()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrUnauthorized) {
			t.Fatalf("Run = %v, want ErrUnauthorized", err)
		}
	case <-time.After(waitLimit):
		c.Close()
		t.Fatal("Run kept retrying a bad token")
	}
}

// cutProxy forwards TCP to a server and can drop every connection at once
// (a network cut) or silently swallow server→client bytes (lost answers).
type cutProxy struct {
	ln     net.Listener
	target string
	hole   atomic.Bool
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]bool // guarded by mu
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, conns: make(map[net.Conn]bool)}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

func (p *cutProxy) blackhole(on bool) { p.hole.Store(on) }

func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

func (p *cutProxy) track(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		p.conns[c] = true
	}
}

func (p *cutProxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			down.Close()
			continue
		}
		p.track(down, up)
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(up, down)
			up.Close()
			down.Close()
		}()
		go func() {
			defer p.wg.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := up.Read(buf)
				if n > 0 && !p.hole.Load() {
					if _, werr := down.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			up.Close()
			down.Close()
		}()
	}
}
