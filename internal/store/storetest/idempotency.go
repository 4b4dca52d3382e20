package storetest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

func testIdempotentSequential(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice", "bob")
	e.group(t, 2, "alice")
	first, err := e.s.Append(ctx, store.Append{Msg: e.msg(1, "alice", "c1", "hello")})
	if err != nil || first.Duplicate || first.Msg.Seq != 1 {
		t.Fatalf("first Append = %+v, %v; want seq 1, not duplicate", first, err)
	}
	// A retry through another node gets a new msg id; the original wins.
	for i := range 3 {
		retry, err := e.s.Append(ctx, store.Append{Msg: e.msg(1, "alice", "c1", "hello")})
		if err != nil || !retry.Duplicate || !sameMsg(retry.Msg, first.Msg) {
			t.Errorf("retry %d = %+v, %v; want Duplicate with %+v", i, retry, err, first.Msg)
		}
	}
	if got := e.lastSeq(t, 1); got != 1 {
		t.Errorf("LastSeq after retries = %d, want 1", got)
	}
	tests := []struct {
		name   string
		conv   uint64
		sender string
		want   uint64
	}{
		{"same id, other sender", 1, "bob", 2},
		{"same id, other conversation", 2, "alice", 1},
	}
	for _, tc := range tests {
		res, err := e.s.Append(ctx, store.Append{Msg: e.msg(tc.conv, tc.sender, "c1", "x")})
		if err != nil || res.Duplicate || res.Msg.Seq != tc.want {
			t.Errorf("%s: got seq %d dup %v err %v, want seq %d new", tc.name, res.Msg.Seq, res.Duplicate, err, tc.want)
		}
	}
	// Without a client_msg_id nothing is deduplicated.
	for i := range 2 {
		m := e.msg(1, "alice", "", "no id")
		res, err := e.s.Append(ctx, store.Append{Msg: m})
		if err != nil || res.Duplicate || res.Msg.Seq != uint64(3+i) {
			t.Errorf("no client_msg_id #%d: got seq %d dup %v err %v, want seq %d", i, res.Msg.Seq, res.Duplicate, err, 3+i)
		}
	}
	msgs, err := e.s.Messages(ctx, 1, 1, 100, 100)
	if got := seqs(msgs); err != nil || !equalSeqs(got, span(1, 4)) {
		t.Errorf("Messages = %v, %v; want 1..4", got, err)
	}
}

func testIdempotentConcurrent(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice")
	const rounds = 10
	type result struct {
		round int
		res   store.AppendResult
		err   error
	}
	results := make(chan result, workers*rounds)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for r := range rounds {
				m := e.msg(1, "alice", fmt.Sprintf("round-%d", r), fmt.Sprintf("round %d", r))
				res, err := e.s.Append(ctx, store.Append{Msg: m})
				results <- result{r, res, err}
			}
		})
	}
	wg.Wait()
	close(results)
	originals := make(map[int]store.Message)
	var dups []result
	for r := range results {
		switch {
		case r.err != nil:
			t.Fatalf("round %d: %v", r.round, r.err)
		case !r.res.Duplicate:
			if prev, ok := originals[r.round]; ok {
				t.Fatalf("round %d stored twice: seq %d and %d", r.round, prev.Seq, r.res.Msg.Seq)
			}
			originals[r.round] = r.res.Msg
		default:
			dups = append(dups, r)
		}
	}
	if len(originals) != rounds {
		t.Fatalf("got %d non-duplicate results, want %d (one per round)", len(originals), rounds)
	}
	if want := workers*rounds - rounds; len(dups) != want {
		t.Errorf("got %d duplicates, want %d", len(dups), want)
	}
	for _, d := range dups {
		if !sameMsg(d.res.Msg, originals[d.round]) {
			t.Errorf("round %d: duplicate returned %+v, want original %+v", d.round, d.res.Msg, originals[d.round])
		}
	}
	if got := e.lastSeq(t, 1); got != rounds {
		t.Errorf("LastSeq = %d, want %d", got, rounds)
	}
	msgs, err := e.s.Messages(ctx, 1, 1, 1000, 1000)
	if got := seqs(msgs); err != nil || !equalSeqs(got, span(1, rounds)) {
		t.Errorf("Messages seqs = %v, %v; want 1..%d", got, err, rounds)
	}
}

func testNotFound(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice")
	_, err := e.s.Conversation(ctx, 404)
	wantErr(t, "Conversation(unknown)", err, store.ErrNotFound)
	_, err = e.s.Member(ctx, 1, "bob")
	wantErr(t, "Member(non-member)", err, store.ErrNotMember)
	_, err = e.s.Member(ctx, 404, "alice")
	wantErr(t, "Member(unknown conversation)", err, store.ErrNotMember)
	_, err = e.s.Append(ctx, store.Append{Msg: e.msg(404, "alice", "c", "x")})
	wantErr(t, "Append(unknown conversation)", err, store.ErrNotFound)
	_, err = e.s.AddMembers(ctx, 404, []string{"bob"}, store.RoleMember)
	wantErr(t, "AddMembers(unknown conversation)", err, store.ErrNotFound)
	_, err = e.s.RemoveMembers(ctx, 404, []string{"alice"})
	wantErr(t, "RemoveMembers(unknown conversation)", err, store.ErrNotFound)
	wantErr(t, "SetTier(unknown conversation)", e.s.SetTier(ctx, 404, 1), store.ErrNotFound)
	_, err = e.s.Messages(ctx, 404, 1, 10, 10)
	wantErr(t, "Messages(unknown conversation)", err, store.ErrNotFound)
	_, err = e.s.Latest(ctx, 404, 0, 0, 10)
	wantErr(t, "Latest(unknown conversation)", err, store.ErrNotFound)
	rows, err := e.s.UserConversations(ctx, "nobody")
	if err != nil || len(rows) != 0 {
		t.Errorf("UserConversations(nobody) = %+v, %v; want none", rows, err)
	}
	for _, tc := range []struct {
		name string
		get  func() (uint64, error)
	}{
		{"Read", func() (uint64, error) { return e.s.Read(ctx, "nobody", "", 1) }},
		{"Read device", func() (uint64, error) { return e.s.Read(ctx, "nobody", "phone", 1) }},
		{"Delivered", func() (uint64, error) { return e.s.Delivered(ctx, "nobody", 1) }},
	} {
		if got, err := tc.get(); got != 0 || err != nil {
			t.Errorf("%s of a fresh position = %d, %v; want 0, nil", tc.name, got, err)
		}
	}
}
