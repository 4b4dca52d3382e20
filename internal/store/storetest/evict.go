package storetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

// Eviction: an engine keeps in-memory state per conversation in use (seq
// high-water mark, membership caches, an owner's epoch and top) and
// evicts idle state to bound its memory. Harness.Evict forces that
// between two operations; every operation after it must behave as if the
// state had never gone.

func (e *env) evict(t *testing.T) {
	t.Helper()
	if e.h.Evict == nil {
		t.Skip("the engine keeps no evictable state (Harness.Evict is nil)")
	}
	e.h.Evict(e.s)
}

func testEvictBetweenOperations(t *testing.T, e *env) {
	ctx := context.Background()
	e.evict(t) // skips without Evict
	e.group(t, 1, "alice", "bob")
	e.evict(t)
	first := e.send(t, 1, "alice", 3)
	e.evict(t)

	// The seq high-water mark comes back: the next seq is 4, never a reuse.
	if got := e.lastSeq(t, 1); got != 3 {
		t.Fatalf("LastSeq after eviction = %d, want 3", got)
	}
	e.evict(t)
	next := e.send(t, 1, "bob", 1)
	if next[0].Seq != 4 {
		t.Fatalf("append after eviction got seq %d, want 4", next[0].Seq)
	}
	e.evict(t)

	// Idempotency survives: a retry of an evicted conversation's message
	// is its duplicate.
	dup := first[1]
	retry := dup
	retry.MsgID = e.msg(1, "x", "", "").MsgID
	retry.Seq = 0
	res, err := e.s.Append(ctx, store.Append{Msg: retry})
	if err != nil || !res.Duplicate || res.Msg.Seq != dup.Seq || res.Msg.MsgID != dup.MsgID {
		t.Fatalf("retry after eviction = %+v, %v; want the duplicate of seq %d", res, err, dup.Seq)
	}
	e.evict(t)

	// Coalescing: a state message after eviction supersedes the one before.
	s1 := e.appendMsg(t, e.state(1, "poll", "v1"))
	e.evict(t)
	s2 := e.appendMsg(t, e.state(1, "poll", "v2"))
	e.evict(t)
	msgs, err := e.s.Messages(ctx, 1, s1.Seq, s2.Seq, 10)
	if err != nil || len(msgs) != 2 || !msgs[0].Superseded || msgs[0].Body != "" || msgs[1].Body != "v2" {
		t.Fatalf("coalesced across eviction = %+v, %v; want %d superseded, %d with its body", msgs, err, s1.Seq, s2.Seq)
	}

	// Edits: the target is rewritten and the event gets the next seq.
	ev := e.appendOK(t, e.editTo(1, first[0].Seq, "edited"))
	if ev.Seq != s2.Seq+1 {
		t.Fatalf("edit after eviction got seq %d, want %d", ev.Seq, s2.Seq+1)
	}
	e.evict(t)
	msgs, err = e.s.Messages(ctx, 1, first[0].Seq, first[0].Seq, 1)
	if err != nil || len(msgs) != 1 || msgs[0].Body != "edited" || !msgs[0].Edited {
		t.Fatalf("edited target after eviction = %+v, %v", msgs, err)
	}

	// Memberships: caches filled by Append.Rows are refilled after
	// eviction, so a join or leave made after it is seen.
	if _, err := e.s.Append(ctx, store.Append{Msg: e.msg(1, "alice", "rows-1", "rows"), Rows: true}); err != nil {
		t.Fatalf("Append(Rows): %v", err)
	}
	e.evict(t)
	if _, err := e.s.AddMembers(ctx, 1, []string{"carol"}, store.RoleMember); err != nil {
		t.Fatalf("AddMembers: %v", err)
	}
	e.evict(t)
	if _, err := e.s.RemoveMembers(ctx, 1, []string{"bob"}); err != nil {
		t.Fatalf("RemoveMembers: %v", err)
	}
	e.evict(t)
	members, err := e.s.Members(ctx, 1)
	if err != nil || fmt.Sprint(userIDs(members)) != "[alice carol]" {
		t.Fatalf("Members after eviction = %v, %v; want alice and carol", userIDs(members), err)
	}
	res, err = e.s.Append(ctx, store.Append{Msg: e.msg(1, "alice", "rows-2", "rows"), Rows: true})
	if err != nil {
		t.Fatalf("Append(Rows) after membership changes: %v", err)
	}
	last := res.Msg.Seq
	if r := e.row(t, "carol", 1); res.RowsWritten && r.LastSeq != last {
		t.Errorf("carol's row = %d after an Append.Rows at %d (she joined across an eviction)", r.LastSeq, last)
	}
	if r := e.row(t, "bob", 1); r.LastSeq >= last {
		t.Errorf("bob's row = %d: raised by an Append.Rows after he left across an eviction", r.LastSeq)
	}
	e.evict(t)

	// Tier and @everyone live on the conversation row.
	if err := e.s.SetTier(ctx, 1, 2); err != nil {
		t.Fatalf("SetTier: %v", err)
	}
	e.evict(t)
	all := e.msg(1, "alice", "all-1", "@everyone")
	all.MentionAll = true
	res, err = e.s.Append(ctx, store.Append{Msg: all})
	if err != nil {
		t.Fatalf("Append(@everyone): %v", err)
	}
	e.evict(t)
	c, err := e.s.Conversation(ctx, 1)
	if err != nil || c.Tier != 2 || c.EveryoneSeq != res.Msg.Seq || c.LastSeq != res.Msg.Seq || c.Members != 2 {
		t.Fatalf("Conversation after eviction = %+v, %v; want tier 2, everyone and last %d, 2 members", c, err, res.Msg.Seq)
	}
	all, err = func() (store.Message, error) {
		ms, err := e.s.Messages(ctx, 1, 1, c.LastSeq, int(c.LastSeq))
		if err != nil {
			return store.Message{}, err
		}
		for i, m := range ms {
			if m.Seq != uint64(i+1) {
				return store.Message{}, fmt.Errorf("seq %d at position %d: not dense", m.Seq, i)
			}
		}
		return ms[len(ms)-1], nil
	}()
	if err != nil || all.Seq != c.LastSeq {
		t.Fatalf("Messages after eviction: %v (last %d, want %d)", err, all.Seq, c.LastSeq)
	}
}

// testEvictConcurrent appends to a few conversations from many goroutines
// while another evicts whatever it can, and checks that seqs stay dense
// and unique: a state may only go when nothing is in flight.
func testEvictConcurrent(t *testing.T, e *env) {
	e.evict(t)
	const convs = 3
	for c := uint64(1); c <= convs; c++ {
		e.group(t, c, "user0")
	}
	var (
		stop    atomic.Bool
		evicter sync.WaitGroup
	)
	evicter.Go(func() {
		for !stop.Load() {
			e.h.Evict(e.s)
		}
	})
	msgs := e.appendAll(t, func(w, i int) uint64 { return uint64((w+i)%convs) + 1 })
	stop.Store(true)
	evicter.Wait()
	byConv := make(map[uint64][]store.Message)
	for _, m := range msgs {
		byConv[m.ConvID] = append(byConv[m.ConvID], m)
	}
	for c := uint64(1); c <= convs; c++ {
		e.h.Evict(e.s)
		e.checkDense(t, c, byConv[c])
	}
}
