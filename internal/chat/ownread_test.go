package chat

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// unreadOf returns user's conv_list row of conv.
func unreadOf(t *testing.T, r *receiptRig, svc *Service, user string, conv uint64) protocol.ConvSummary {
	t.Helper()
	resp := r.call(svc, user, &protocol.Frame{Type: protocol.TypeConvList})
	if resp == nil || resp.Type != protocol.TypeConvList {
		t.Fatalf("conv_list of %s answered %+v", user, resp)
	}
	for _, s := range resp.List {
		if s.ConvID == conv {
			return s
		}
	}
	t.Fatalf("conv %d not in %s's list %+v", conv, user, resp.List)
	return protocol.ConvSummary{}
}

func expectUnread(t *testing.T, r *receiptRig, svc *Service, what, user string, conv, unread, readSeq uint64) {
	t.Helper()
	s := unreadOf(t, r, svc, user, conv)
	if s.Unread != unread || s.ReadSeq != readSeq {
		t.Fatalf("%s: %s's row unread %d read_seq %d (last %d), want unread %d read_seq %d", what, user, s.Unread, s.ReadSeq, s.LastSeq, unread, readSeq)
	}
}

// TestOwnMessagesNeverUnread: send, edit, recall, state messages and the
// membership events a user causes move that user's read position to their
// seq before the ack, so conv_list never counts them as unread; other
// members' counts are unchanged. A move over the user's own previous
// message pushes no receipt; one over others' messages pushes the read
// receipt a read would.
func TestOwnMessagesNeverUnread(t *testing.T) {
	r := newReceiptRig(t)
	svc := r.service()
	conv := r.call(svc, "a", &protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "b"}).Conv.ConvID
	send := func(user, id string, f protocol.Frame) *protocol.Frame {
		t.Helper()
		f.ConvID, f.ClientMsgID = conv, id
		if f.Type == "" {
			f.Type = protocol.TypeSend
		}
		ack := r.call(svc, user, &f)
		if ack == nil || ack.Type != protocol.TypeAck {
			t.Fatalf("%s by %s answered %+v", f.Type, user, ack)
		}
		return ack
	}
	for i, id := range []string{"m1", "m2", "m3"} {
		if ack := send("a", id, protocol.Frame{Kind: protocol.KindText, Body: id}); ack.Seq != uint64(i+1) {
			t.Fatalf("seq %d", ack.Seq)
		}
	}
	expectUnread(t, r, svc, "after three sends", "a", conv, 0, 3)
	expectUnread(t, r, svc, "after three sends", "b", conv, 3, 0)
	if got := r.receipts(); len(got) != 0 {
		t.Fatalf("sends pushed receipts %+v", got)
	}
	// A duplicate answers the original and changes nothing.
	if ack := send("a", "m2", protocol.Frame{Kind: protocol.KindText, Body: "m2"}); !ack.Duplicate || ack.Seq != 2 {
		t.Fatalf("duplicate answered %+v", ack)
	}
	expectUnread(t, r, svc, "after a duplicate", "a", conv, 0, 3)

	// Edit, recall and a state message are the sender's own too.
	send("a", "e1", protocol.Frame{Type: protocol.TypeEdit, TargetSeq: 1, Body: "m1'"})
	send("a", "r1", protocol.Frame{Type: protocol.TypeRecall, TargetSeq: 2})
	send("a", "s1", protocol.Frame{Kind: protocol.KindState, CoalesceKey: "k", Body: "5"})
	expectUnread(t, r, svc, "after edit, recall, state", "a", conv, 0, 6)
	expectUnread(t, r, svc, "after edit, recall, state", "b", conv, 6, 0)

	// b answers without reading first: b's position moves to its message
	// (replying covers what came before it), a's count shows b's message
	// only, and since the move passed over a's messages the read receipt
	// goes out as for a read.
	send("b", "b1", protocol.Frame{Kind: protocol.KindText, Body: "hi"})
	expectUnread(t, r, svc, "after b's reply", "b", conv, 0, 7)
	expectUnread(t, r, svc, "after b's reply", "a", conv, 1, 6)
	if got := r.receipts(); len(got) != 1 || got[0].State != protocol.StateRead || got[0].UserID != "b" || got[0].Seq != 7 {
		t.Fatalf("b's reply pushed %+v, want b's read receipt at 7", got)
	}
	// b's next message follows its own: no receipt.
	send("b", "b2", protocol.Frame{Kind: protocol.KindText, Body: "again"})
	if got := r.receipts(); len(got) != 0 {
		t.Fatalf("b's second message pushed receipts %+v", got)
	}
	// An explicit read still sends its receipts.
	r.call(svc, "a", &protocol.Frame{Type: protocol.TypeRead, ConvID: conv, Seq: 8})
	if got := r.receipts(); len(got) != 1 || got[0].State != protocol.StateRead || got[0].UserID != "a" || got[0].Seq != 8 {
		t.Fatalf("read pushed %+v, want a's read receipt at 8", got)
	}
	expectUnread(t, r, svc, "after a's read", "a", conv, 0, 8)

	// A refused send moves nothing.
	if resp := r.call(svc, "a", &protocol.Frame{Type: protocol.TypeEdit, ConvID: conv, ClientMsgID: "bad", TargetSeq: 7, Body: "x"}); resp == nil || resp.Code != protocol.CodeForbidden {
		t.Fatalf("edit of b's message answered %+v", resp)
	}
	expectUnread(t, r, svc, "after a refused edit", "a", conv, 0, 8)
	expectUnread(t, r, svc, "after a refused edit", "b", conv, 0, 8)
}

// TestOwnMessagesNeverUnreadEveryTier: in a small, a medium and a large
// group (tiny thresholds), the sender's own messages and the membership
// events it causes are never unread for it; the other members count them.
// A membership event after others' unread messages does not mark them read.
func TestOwnMessagesNeverUnreadEveryTier(t *testing.T) {
	r := newReceiptRig(t)
	cfg := DefaultConfig()
	cfg.SmallBelow, cfg.LargeAbove = 3, 4 // 2 members small, 3–4 medium, 5+ large
	r.node++
	svc := newService(t, cfg, r.st, r.reg, r.b, r.led, r.node)
	for _, tc := range []struct {
		tier    string
		members []string
	}{
		{"small", []string{"b"}},
		{"medium", []string{"b", "c"}},
		{"large", []string{"b", "c", "d", "e"}},
	} {
		g := r.call(svc, "a", &protocol.Frame{Type: protocol.TypeCreateGroup, Name: tc.tier, Members: tc.members})
		if g == nil || g.Conv == nil || g.Conv.Tier != tc.tier {
			t.Fatalf("create_group answered %+v, want tier %s", g, tc.tier)
		}
		conv := g.Conv.ConvID
		for i := range 3 {
			ack := r.call(svc, "a", &protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: "m" + string(rune('0'+i)), Kind: protocol.KindText, Body: "x"})
			if ack == nil || ack.Type != protocol.TypeAck {
				t.Fatalf("%s: send answered %+v", tc.tier, ack)
			}
		}
		expectUnread(t, r, svc, tc.tier+" sends", "a", conv, 0, 3)
		expectUnread(t, r, svc, tc.tier+" sends", "b", conv, 3, 0)
		// The owner's membership change: its own event.
		if resp := r.call(svc, "a", &protocol.Frame{Type: protocol.TypeAddMembers, ConvID: conv, Members: []string{"z"}}); resp == nil || resp.Type != protocol.TypeConv {
			t.Fatalf("%s: add_members answered %+v", tc.tier, resp)
		}
		expectUnread(t, r, svc, tc.tier+" add_members", "a", conv, 0, 4)
		expectUnread(t, r, svc, tc.tier+" add_members", "b", conv, 4, 0)
		// b's message is b's own, unread for a.
		if ack := r.call(svc, "b", &protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: "b", Kind: protocol.KindText, Body: "y"}); ack == nil || ack.Seq != 5 {
			t.Fatalf("%s: b's send answered %+v", tc.tier, ack)
		}
		expectUnread(t, r, svc, tc.tier+" b's send", "b", conv, 0, 5)
		expectUnread(t, r, svc, tc.tier+" b's send", "a", conv, 1, 4)
		// a's next membership change comes after b's unread message: it
		// does not mark b's message read (nor send a receipt), so a counts
		// both until it reads.
		r.receipts()
		if resp := r.call(svc, "a", &protocol.Frame{Type: protocol.TypeMute, ConvID: conv, UserID: "b", Muted: false}); resp == nil || resp.Type != protocol.TypeConv {
			t.Fatalf("%s: mute answered %+v", tc.tier, resp)
		}
		expectUnread(t, r, svc, tc.tier+" mute after b's send", "a", conv, 2, 4)
		if got := r.receipts(); len(got) != 0 {
			t.Fatalf("%s: a membership change pushed receipts %+v", tc.tier, got)
		}
		r.call(svc, "a", &protocol.Frame{Type: protocol.TypeRead, ConvID: conv, Seq: 6})
		expectUnread(t, r, svc, tc.tier+" a's read", "a", conv, 0, 6)
		// z joined at 4: its own member_added event, b's message, the unmute.
		expectUnread(t, r, svc, tc.tier+" b's send", "z", conv, 3, 0)
	}
}

// TestOwnMessagesPerDeviceReadScope: with read positions per device, the
// sending device's position moves; the user's other devices still count
// the message until they read it.
func TestOwnMessagesPerDeviceReadScope(t *testing.T) {
	r := newReceiptRig(t)
	cfg := DefaultConfig()
	cfg.ReadScope = ReadPerDevice
	r.node++
	svc := newService(t, cfg, r.st, r.reg, r.b, r.led, r.node)
	conv := r.call(svc, "a", &protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "b"}).Conv.ConvID
	if ack := r.call(svc, "a", &protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: "m", Kind: protocol.KindText, Body: "x"}); ack == nil || ack.Seq != 1 {
		t.Fatalf("send answered %+v", ack)
	}
	list := func(device string) protocol.ConvSummary {
		var got *protocol.Frame
		svc.Handle(context.Background(), Caller{User: "a", Device: device}, &protocol.Frame{Type: protocol.TypeConvList}, func(f *protocol.Frame) { got = f })
		if got == nil || len(got.List) != 1 {
			t.Fatalf("conv_list answered %+v", got)
		}
		return got.List[0]
	}
	if s := list("d"); s.Unread != 0 || s.ReadSeq != 1 {
		t.Fatalf("sending device's row %+v, want read", s)
	}
	if s := list("other"); s.Unread != 1 || s.ReadSeq != 0 {
		t.Fatalf("other device's row %+v, want unread 1", s)
	}
}

// countingStore counts the reads a send may skip.
type countingStore struct {
	store.Store
	mu                       sync.Mutex
	convs, member, positions int
}

func (c *countingStore) Conversation(ctx context.Context, id uint64) (store.Conversation, error) {
	c.mu.Lock()
	c.convs++
	c.mu.Unlock()
	return c.Store.Conversation(ctx, id)
}

func (c *countingStore) Member(ctx context.Context, conv uint64, user string) (store.Member, error) {
	c.mu.Lock()
	c.member++
	c.mu.Unlock()
	return c.Store.Member(ctx, conv, user)
}

func (c *countingStore) Read(ctx context.Context, user, device string, conv uint64) (uint64, error) {
	c.mu.Lock()
	c.positions++
	c.mu.Unlock()
	return c.Store.Read(ctx, user, device, conv)
}

func (c *countingStore) reads() (int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.convs, c.member
}

func (c *countingStore) counts() (convs, member, positions int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.convs, c.member, c.positions
}

// TestDirectSendRemembersConversation: once a direct conversation and its
// members are known, its members' sends read neither the conversation nor
// the membership again; anyone else is still refused, as a non-member.
func TestDirectSendRemembersConversation(t *testing.T) {
	r := newReceiptRig(t)
	cs := &countingStore{Store: r.st}
	r.st = cs
	svc := r.service()
	conv := r.call(svc, "a", &protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "b"}).Conv.ConvID
	send := func(user, id string) *protocol.Frame {
		return r.call(svc, user, &protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: id, Kind: protocol.KindText, Body: id})
	}
	for i := range 2 { // the first fans out (members known), the second remembers
		if ack := send("a", fmt.Sprint("w", i)); ack == nil || ack.Type != protocol.TypeAck {
			t.Fatalf("send answered %+v", ack)
		}
	}
	c0, m0 := cs.reads()
	for i := range 5 {
		user := []string{"a", "b"}[i%2]
		if ack := send(user, fmt.Sprint("m", i)); ack == nil || ack.Type != protocol.TypeAck || ack.Seq != uint64(3+i) {
			t.Fatalf("send %d by %s answered %+v", i, user, ack)
		}
	}
	if c1, m1 := cs.reads(); c1 != c0 || m1 != m0 {
		t.Errorf("5 sends read the conversation %d and a membership %d times, want 0 and 0", c1-c0, m1-m0)
	}
	// A non-member is refused, with or without anything remembered.
	if resp := send("c", "x"); resp == nil || resp.Code != protocol.CodeNotMember {
		t.Errorf("a non-member's send answered %+v", resp)
	}
	// A restarted process reads once more.
	svc2 := r.service()
	if ack := r.call(svc2, "a", &protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: "n", Kind: protocol.KindText, Body: "n"}); ack == nil || ack.Type != protocol.TypeAck {
		t.Fatalf("send after a restart answered %+v", ack)
	}
	if c2, m2 := cs.reads(); c2 == c0 || m2 == m0 {
		t.Errorf("a restarted process did not read the conversation and membership")
	}
}

// TestSendRemembersOwnReadPosition: the store raises the sender's read
// position with the append, and a send takes the position before the
// message from memory once this process has seen it, and still pushes the
// read receipt exactly when the move passes others' messages.
func TestSendRemembersOwnReadPosition(t *testing.T) {
	r := newReceiptRig(t)
	cs := &countingStore{Store: r.st}
	r.st = cs
	svc := r.service()
	conv := r.call(svc, "a", &protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "b"}).Conv.ConvID
	send := func(user, id string) {
		t.Helper()
		ack := r.call(svc, user, &protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: id, Kind: protocol.KindText, Body: id})
		if ack == nil || ack.Type != protocol.TypeAck {
			t.Fatalf("send by %s answered %+v", user, ack)
		}
	}
	readReceipts := func() (out []string) {
		for _, f := range r.receipts() {
			if f.State == protocol.StateRead {
				out = append(out, fmt.Sprint(f.UserID, "@", f.Seq))
			}
		}
		return out
	}
	// Warm-up: each member's first send reads its position (alongside
	// the append), then remembers it.
	send("a", "w1")
	send("b", "w2")
	send("b", "w3")
	r.receipts()
	_, _, p0 := cs.counts()
	send("a", "m4") // a passes 2 and 3
	send("a", "m5") // own only
	send("b", "m6") // b passes 4 and 5
	if _, _, p1 := cs.counts(); p1 != p0 {
		t.Errorf("3 sends read the read position %d times, want 0", p1-p0)
	}
	if got := fmt.Sprint(readReceipts()); got != "[a@4 b@6]" {
		t.Errorf("read receipts %s, want a@4 and b@6", got)
	}
	expectUnread(t, r, svc, "after the sends", "a", conv, 1, 5)
	expectUnread(t, r, svc, "after the sends", "b", conv, 0, 6)
}

// bulkStore raises delivered positions in bulk (store.DeliveredRaiser),
// counting the calls, with Pebble's SetDelivered underneath.
type bulkStore struct {
	store.Store
	mu    sync.Mutex
	calls int
	fail  bool
}

func (b *bulkStore) RaiseDelivered(ctx context.Context, ps []store.Delivered) error {
	b.mu.Lock()
	b.calls++
	fail := b.fail
	b.mu.Unlock()
	if fail {
		return errors.New("engine down")
	}
	for _, p := range ps {
		if _, err := b.SetDelivered(ctx, p.User, p.ConvID, p.Seq); err != nil {
			return err
		}
	}
	return nil
}

// TestFlushPositionsInBulk: with a store that raises delivered positions
// in bulk, a flush hands it every raised position in one call; a failed
// call keeps them raised in memory for the next flush.
func TestFlushPositionsInBulk(t *testing.T) {
	ctx := context.Background()
	r := newReceiptRig(t)
	bs := &bulkStore{Store: r.st}
	r.st = bs
	svc := r.service()
	conv := r.call(svc, "a", &protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "b"}).Conv.ConvID
	for _, id := range []string{"m1", "m2"} {
		if ack := r.call(svc, "a", &protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: id, Kind: protocol.KindText, Body: id}); ack == nil || ack.Type != protocol.TypeAck {
			t.Fatalf("send answered %+v", ack)
		}
	}
	r.call(svc, "b", &protocol.Frame{Type: protocol.TypeDelivered, ConvID: conv, Seq: 2})
	r.call(svc, "a", &protocol.Frame{Type: protocol.TypeDelivered, ConvID: conv, Seq: 1})
	bs.fail = true
	if err := svc.FlushPositions(ctx); err == nil {
		t.Fatalf("a failed bulk raise: flush returned no error")
	}
	bs.fail = false
	if err := svc.FlushPositions(ctx); err != nil {
		t.Fatal(err)
	}
	for user, want := range map[string]uint64{"a": 1, "b": 2} {
		if got, err := bs.Delivered(ctx, user, conv); err != nil || got != want {
			t.Errorf("%s: stored delivered %d, %v; want %d", user, got, err, want)
		}
	}
	if bs.calls != 2 {
		t.Errorf("%d bulk calls for two flushes, want 2", bs.calls)
	}
	// Nothing raised since: no call.
	if err := svc.FlushPositions(ctx); err != nil || bs.calls != 2 {
		t.Errorf("an idle flush: err %v, %d calls", err, bs.calls)
	}
}
