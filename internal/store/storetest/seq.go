package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

const (
	workers   = 16
	perWorker = 25
)

// appendAll runs workers goroutines, each appending perWorker messages to
// the conversation convOf(worker, i), and returns every result.
func (e *env) appendAll(t *testing.T, convOf func(w, i int) uint64) []store.Message {
	t.Helper()
	var (
		mu   sync.Mutex
		out  []store.Message
		errs []error
		wg   sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				conv := convOf(w, i)
				m := e.msg(conv, fmt.Sprintf("user%d", w), fmt.Sprintf("w%d-%d", w, i), fmt.Sprintf("w%d i%d", w, i))
				res, err := e.s.Append(context.Background(), store.Append{Msg: m})
				if err == nil {
					// Fan-out of concurrent appends lands in any order.
					err = e.s.UpdateRows(context.Background(), conv, res.Msg.Seq, []string{"user0"}, false)
				}
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					if res.Duplicate {
						errs = append(errs, fmt.Errorf("w%d i%d: Duplicate on a new client_msg_id", w, i))
					}
					if want := m; res.Msg.Body != want.Body || res.Msg.MsgID != want.MsgID || res.Msg.ConvID != conv {
						errs = append(errs, fmt.Errorf("w%d i%d: got %+v, want the appended message", w, i, res.Msg))
					}
					out = append(out, res.Msg)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent appends: %v", err)
	}
	return out
}

// checkDense verifies that conv holds exactly the appended messages with
// seqs 1..n, each stored as returned by Append.
func (e *env) checkDense(t *testing.T, conv uint64, appended []store.Message) {
	t.Helper()
	n := uint64(len(appended))
	bySeq := make(map[uint64]store.Message, n)
	for _, m := range appended {
		if prev, dup := bySeq[m.Seq]; dup {
			t.Fatalf("conv %d: seq %d given to %q and %q", conv, m.Seq, prev.Body, m.Body)
		}
		bySeq[m.Seq] = m
	}
	for s := uint64(1); s <= n; s++ {
		if _, ok := bySeq[s]; !ok {
			t.Fatalf("conv %d: seq %d missing among %d appends (hole)", conv, s, n)
		}
	}
	if got := e.lastSeq(t, conv); got != n {
		t.Errorf("conv %d: LastSeq = %d, want %d", conv, got, n)
	}
	stored, err := e.s.Messages(context.Background(), conv, 1, n+10, int(n)+10)
	if err != nil {
		t.Fatalf("Messages: %v", err)
	}
	if got, want := seqs(stored), span(1, n); !equalSeqs(got, want) {
		t.Fatalf("conv %d: Messages seqs = %v, want 1..%d", conv, got, n)
	}
	for _, m := range stored {
		if !sameMsg(m, bySeq[m.Seq]) {
			t.Errorf("conv %d seq %d: stored %+v, Append returned %+v", conv, m.Seq, m, bySeq[m.Seq])
		}
	}
}

func testSeqDenseOneConversation(t *testing.T, e *env) {
	e.group(t, 1, "user0")
	msgs := e.appendAll(t, func(int, int) uint64 { return 1 })
	e.checkDense(t, 1, msgs)
	rows, err := e.s.UserConversations(context.Background(), "user0")
	if err != nil || len(rows) != 1 || rows[0].LastSeq != workers*perWorker {
		t.Errorf("UserConversations(user0) = %+v, %v; want one row with LastSeq %d", rows, err, workers*perWorker)
	}
}

func testSeqDenseManyConversations(t *testing.T, e *env) {
	const convs = 4
	for c := uint64(1); c <= convs; c++ {
		e.group(t, c, "user0")
	}
	msgs := e.appendAll(t, func(w, i int) uint64 { return uint64((w+i)%convs) + 1 })
	byConv := make(map[uint64][]store.Message)
	for _, m := range msgs {
		byConv[m.ConvID] = append(byConv[m.ConvID], m)
	}
	for c := uint64(1); c <= convs; c++ {
		e.checkDense(t, c, byConv[c])
	}
	rows, err := e.s.UserConversations(context.Background(), "user0")
	if err != nil || len(rows) != convs {
		t.Fatalf("UserConversations(user0) = %+v, %v; want %d rows", rows, err, convs)
	}
	for _, r := range rows {
		if want := uint64(len(byConv[r.ConvID])); r.LastSeq != want {
			t.Errorf("row of conv %d: LastSeq = %d, want %d", r.ConvID, r.LastSeq, want)
		}
	}
}

func testReopen(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice", "bob")
	var sent []store.Message
	for i := range 5 {
		m := e.msg(1, "alice", fmt.Sprintf("c%d", i), fmt.Sprintf("body %d", i))
		res, err := e.s.Append(ctx, store.Append{Msg: m})
		if err != nil {
			t.Fatalf("Append: %v", err)
		}
		if err := e.s.UpdateRows(ctx, 1, res.Msg.Seq, []string{"alice", "bob"}, i == 3); err != nil {
			t.Fatalf("UpdateRows: %v", err)
		}
		sent = append(sent, res.Msg)
	}
	if _, err := e.s.SetRead(ctx, "bob", "", 1, 4); err != nil {
		t.Fatalf("SetRead: %v", err)
	}
	if _, err := e.s.SetDelivered(ctx, "bob", 1, 5); err != nil {
		t.Fatalf("SetDelivered: %v", err)
	}
	if _, err := e.s.Direct(ctx, "alice", "carol", 2, baseTime); err != nil {
		t.Fatalf("Direct: %v", err)
	}

	e.reopen(t)

	if got := e.lastSeq(t, 1); got != 5 {
		t.Fatalf("after reopen: LastSeq = %d, want 5", got)
	}
	stored, err := e.s.Messages(ctx, 1, 1, 5, 10)
	if err != nil || len(stored) != 5 {
		t.Fatalf("after reopen: Messages = %d messages, %v; want 5", len(stored), err)
	}
	for i, m := range stored {
		if !sameMsg(m, sent[i]) {
			t.Errorf("after reopen: seq %d = %+v, want %+v", m.Seq, m, sent[i])
		}
	}
	// A retry after the restart still finds the original.
	retry := e.msg(1, "alice", "c2", "body 2 (retry)")
	res, err := e.s.Append(ctx, store.Append{Msg: retry})
	if err != nil || !res.Duplicate || !sameMsg(res.Msg, sent[2]) {
		t.Errorf("retry after reopen = %+v, %v; want Duplicate with %+v", res, err, sent[2])
	}
	res, err = e.s.Append(ctx, store.Append{Msg: e.msg(1, "bob", "new", "after restart")})
	if err != nil || res.Msg.Seq != 6 || res.Duplicate {
		t.Errorf("append after reopen = seq %d dup %v, %v; want seq 6", res.Msg.Seq, res.Duplicate, err)
	}
	if got, err := e.s.Read(ctx, "bob", "", 1); got != 4 || err != nil {
		t.Errorf("Read after reopen = %d, %v; want 4", got, err)
	}
	if got, err := e.s.Delivered(ctx, "bob", 1); got != 5 || err != nil {
		t.Errorf("Delivered after reopen = %d, %v; want 5", got, err)
	}
	rows, err := e.s.UserConversations(ctx, "bob")
	if err != nil || len(rows) != 1 || rows[0].LastSeq != 5 || rows[0].MentionSeq != 4 {
		t.Errorf("UserConversations(bob) after reopen = %+v, %v; want one row with LastSeq 5, MentionSeq 4", rows, err)
	}
	c, err := e.s.Direct(ctx, "carol", "alice", 99, baseTime)
	if err != nil || c.ID != 2 {
		t.Errorf("Direct after reopen = %+v, %v; want conversation 2", c, err)
	}
	ms, err := e.s.Members(ctx, 1)
	if err != nil || len(ms) != 2 {
		t.Errorf("Members after reopen = %+v, %v; want alice and bob", ms, err)
	}
}
