package storetest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

// pendingOf returns the outbox entries of conv, in seq order.
func (e *env) pendingOf(t *testing.T, conv uint64) []uint64 {
	t.Helper()
	ps, err := e.s.Pending(context.Background(), 10000)
	if err != nil {
		t.Fatalf("Pending: %v", err)
	}
	var out []uint64
	for _, p := range ps {
		if p.ConvID == conv {
			out = append(out, p.Seq)
		}
	}
	slices.Sort(out)
	return out
}

// testOutbox: every append has an outbox entry until FanoutDone clears it,
// also across a reopen; a duplicate leaves its original's entry in place.
func testOutbox(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice", "bob")
	e.group(t, 2, "alice", "bob")
	if p := e.pendingOf(t, 1); len(p) != 0 {
		t.Fatalf("new conversation has entries: %v", p)
	}
	e.send(t, 1, "alice", 3)
	e.send(t, 2, "bob", 1)
	if p := e.pendingOf(t, 1); !slices.Equal(p, []uint64{1, 2, 3}) {
		t.Fatalf("after 3 appends: entries %v, want 1 2 3", p)
	}
	if err := e.s.FanoutDone(ctx, 1, []uint64{2}); err != nil {
		t.Fatalf("FanoutDone(2): %v", err)
	}
	e.reopen(t)
	if p := e.pendingOf(t, 1); !slices.Equal(p, []uint64{1, 3}) && !slices.Equal(p, []uint64{1, 2, 3}) {
		t.Fatalf("after reopen: entries %v, want 1 3 (or 1 2 3: clearing need not be synced)", p)
	}
	if p := e.pendingOf(t, 2); !slices.Equal(p, []uint64{1}) {
		t.Fatalf("conversation 2 after reopen: entries %v, want 1", p)
	}
	if err := e.s.FanoutDone(ctx, 1, []uint64{1, 2, 3, 7}); err != nil {
		t.Fatalf("FanoutDone(all, and one never there): %v", err)
	}
	if p := e.pendingOf(t, 1); len(p) != 0 {
		t.Fatalf("after FanoutDone of all: entries %v", p)
	}
	if err := e.s.FanoutDone(ctx, 1, nil); err != nil {
		t.Fatalf("FanoutDone(none): %v", err)
	}
	e.send(t, 1, "bob", 1)
	if p := e.pendingOf(t, 1); !slices.Equal(p, []uint64{4}) {
		t.Fatalf("append after clearing: entries %v, want 4", p)
	}
	// A retry of a stored message returns once its entry is written.
	m := e.msg(2, "bob", "dup-1", "x")
	if _, err := e.s.Append(ctx, store.Append{Msg: m}); err != nil {
		t.Fatalf("Append: %v", err)
	}
	m.MsgID = e.msg(2, "bob", "dup-1", "x").MsgID
	res, err := e.s.Append(ctx, store.Append{Msg: m})
	if err != nil || !res.Duplicate {
		t.Fatalf("retry: %+v, %v; want the duplicate", res, err)
	}
	if p := e.pendingOf(t, 2); !slices.Contains(p, 2) {
		t.Fatalf("entries of conversation 2 = %v, want 2 among them", p)
	}
	if err := e.s.FanoutDone(ctx, 99, []uint64{1}); err == nil {
		t.Errorf("FanoutDone of a missing conversation succeeded")
	}
	if ps, err := e.s.Pending(ctx, 1); err != nil || len(ps) != 1 {
		t.Errorf("Pending(limit 1) = %v, %v; want one entry", ps, err)
	}
}

// testOutboxConcurrent: many appends at once each leave exactly their own
// entry.
func testOutboxConcurrent(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice", "bob")
	const n = 40
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			m := e.msg(1, "alice", fmt.Sprintf("c-%d", i), "x")
			res, err := e.s.Append(ctx, store.Append{Msg: m})
			if err != nil {
				t.Errorf("Append: %v", err)
				return
			}
			if i%2 == 0 {
				if err := e.s.FanoutDone(ctx, 1, []uint64{res.Msg.Seq}); err != nil {
					t.Errorf("FanoutDone: %v", err)
				}
			}
		})
	}
	wg.Wait()
	if p := e.pendingOf(t, 1); len(p) != n/2 {
		t.Fatalf("%d entries left, want %d: %v", len(p), n/2, p)
	}
}

// testAppendRows: Append.Rows raises every current member's row with the
// message, mentions too; @everyone is remembered on the conversation.
func testAppendRows(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice", "bob", "carol")
	if _, err := e.s.RemoveMembers(ctx, 1, []string{"carol"}); err == nil {
		t.Fatalf("remove before the first message succeeded")
	}
	e.send(t, 1, "alice", 1)
	if _, err := e.s.RemoveMembers(ctx, 1, []string{"carol"}); err != nil {
		t.Fatalf("RemoveMembers: %v", err)
	}
	m := e.msg(1, "alice", "r-1", "hi @bob")
	m.Mentions = []string{"bob", "carol"}
	res, err := e.s.Append(ctx, store.Append{Msg: m, Rows: true})
	if err != nil || !res.RowsWritten || res.Msg.Seq != 2 {
		t.Fatalf("Append(Rows) = %+v, %v; want seq 2 with rows written", res, err)
	}
	for user, want := range map[string][2]uint64{"alice": {2, 0}, "bob": {2, 2}, "carol": {1, 0}} {
		r := e.row(t, user, 1)
		if r.LastSeq != want[0] || r.MentionSeq != want[1] {
			t.Errorf("row of %s = last %d mention %d, want %d %d", user, r.LastSeq, r.MentionSeq, want[0], want[1])
		}
	}
	if c, err := e.s.Conversation(ctx, 1); err != nil || c.EveryoneSeq != 0 {
		t.Fatalf("EveryoneSeq before any @everyone = %d, %v", c.EveryoneSeq, err)
	}
	all := e.msg(1, "bob", "r-2", "@everyone")
	all.MentionAll = true
	if res, err = e.s.Append(ctx, store.Append{Msg: all}); err != nil || res.RowsWritten {
		t.Fatalf("Append(@everyone) = %+v, %v", res, err)
	}
	e.send(t, 1, "alice", 1)
	e.reopen(t)
	c, err := e.s.Conversation(ctx, 1)
	if err != nil || c.EveryoneSeq != 3 || c.LastSeq != 4 {
		t.Fatalf("after reopen: Conversation = %+v, %v; want EveryoneSeq 3, LastSeq 4", c, err)
	}
	if r := e.row(t, "alice", 1); r.LastSeq != 2 {
		t.Errorf("appends without Rows moved alice's row to %d", r.LastSeq)
	}
	all2 := e.msg(1, "alice", "r-3", "@everyone")
	all2.MentionAll = true
	if res, err = e.s.Append(ctx, store.Append{Msg: all2, Rows: true}); err != nil || !res.RowsWritten {
		t.Fatalf("Append(@everyone, Rows) = %+v, %v", res, err)
	}
	for _, user := range []string{"alice", "bob"} {
		if r := e.row(t, user, 1); r.LastSeq != 5 || r.MentionSeq != 5 {
			t.Errorf("row of %s after @everyone with rows = %+v, want last 5 mention 5", user, r)
		}
	}
	// A leaver's row keeps the last @everyone it was there for.
	all3 := e.msg(1, "alice", "r-4", "@everyone")
	all3.MentionAll = true
	if _, err = e.s.Append(ctx, store.Append{Msg: all3}); err != nil {
		t.Fatalf("Append(@everyone): %v", err)
	}
	if _, err := e.s.RemoveMembers(ctx, 1, []string{"bob"}); err != nil {
		t.Fatalf("RemoveMembers: %v", err)
	}
	if r := e.row(t, "bob", 1); r.LeaveSeq != 6 || r.MentionSeq != 6 {
		t.Errorf("leaver's row = %+v, want leave 6 mention 6", r)
	}
	// A member who joins after an @everyone is not mentioned by it, even
	// right after a removal that carried it into the leaver's row.
	if _, err := e.s.AddMembers(ctx, 1, []string{"dave"}, store.RoleMember); err != nil {
		t.Fatalf("AddMembers: %v", err)
	}
	if r := e.row(t, "dave", 1); r.JoinSeq != 7 || r.MentionSeq != 0 {
		t.Errorf("joiner's row = %+v, want join 7 mention 0", r)
	}
}

// testAppendReadBy: Append.ReadBy raises the reader's position to the
// reader's own message with the append (ReadRaised) and never lowers it;
// a duplicate reports it not raised.
func testAppendReadBy(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice", "bob")
	e.send(t, 1, "bob", 2)
	if _, err := e.s.SetRead(ctx, "alice", "d1", 1, 1); err != nil {
		t.Fatalf("SetRead: %v", err)
	}
	reader := &store.Reader{User: "alice", Device: "d1"}
	m := e.msg(1, "alice", "rb-1", "hi")
	res, err := e.s.Append(ctx, store.Append{Msg: m, ReadBy: reader})
	if err != nil || res.Msg.Seq != 3 || !res.ReadRaised {
		t.Fatalf("Append(ReadBy) = %+v, %v; want seq 3, read raised", res, err)
	}
	if got, err := e.s.Read(ctx, "alice", "d1", 1); err != nil || got != 3 {
		t.Fatalf("read position after Append(ReadBy) = %d, %v; want 3", got, err)
	}
	if got, err := e.s.Read(ctx, "alice", "", 1); err != nil || got != 0 {
		t.Fatalf("per-user position moved with a device's ReadBy: %d, %v", got, err)
	}
	dup, err := e.s.Append(ctx, store.Append{Msg: e.msg(1, "alice", "rb-1", "hi"), ReadBy: reader})
	if err != nil || !dup.Duplicate || dup.ReadRaised {
		t.Fatalf("duplicate Append(ReadBy) = %+v, %v; want a duplicate, not raised", dup, err)
	}
	// The per-user position (no device) too.
	res, err = e.s.Append(ctx, store.Append{Msg: e.msg(1, "alice", "rb-u", "user"), ReadBy: &store.Reader{User: "alice"}})
	if err != nil || !res.ReadRaised {
		t.Fatalf("Append(ReadBy user) = %+v, %v; want read raised", res, err)
	}
	if got, err := e.s.Read(ctx, "alice", "", 1); err != nil || got != res.Msg.Seq {
		t.Fatalf("per-user read position after Append(ReadBy) = %d, %v; want %d", got, err, res.Msg.Seq)
	}
	// A position already beyond the message is kept.
	if _, err := e.s.SetRead(ctx, "alice", "d1", 1, 10); err != nil {
		t.Fatalf("SetRead: %v", err)
	}
	res, err = e.s.Append(ctx, store.Append{Msg: e.msg(1, "alice", "rb-2", "again"), ReadBy: reader})
	if err != nil {
		t.Fatalf("Append(ReadBy): %v", err)
	}
	if got, err := e.s.Read(ctx, "alice", "d1", 1); err != nil || got != 10 {
		t.Fatalf("read position after Append(ReadBy) below it = %d, %v; want 10 (ReadRaised %v)", got, err, res.ReadRaised)
	}
}
