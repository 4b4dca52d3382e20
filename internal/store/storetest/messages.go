package storetest

import (
	"context"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

func testMessagesBounds(t *testing.T, e *env) {
	e.group(t, 1, "alice")
	e.send(t, 1, "alice", 10)
	tests := []struct {
		name           string
		from, to       uint64
		limit          int
		wantLo, wantHi uint64 // wantLo > wantHi: none
	}{
		{"all", 1, 10, 100, 1, 10},
		{"inner range", 3, 5, 100, 3, 5},
		{"single", 7, 7, 100, 7, 7},
		{"limit keeps the lowest", 1, 10, 3, 1, 3},
		{"limit inside range", 4, 10, 2, 4, 5},
		{"from 0", 0, 2, 100, 1, 2},
		{"past last seq", 8, 20, 100, 8, 10},
		{"entirely past last seq", 11, 20, 100, 1, 0},
		{"from after to", 5, 4, 100, 1, 0},
		{"limit 0", 1, 10, 0, 1, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			msgs, err := e.s.Messages(context.Background(), 1, tc.from, tc.to, tc.limit)
			if err != nil {
				t.Fatalf("Messages(%d, %d, %d): %v", tc.from, tc.to, tc.limit, err)
			}
			if got, want := seqs(msgs), span(tc.wantLo, tc.wantHi); !equalSeqs(got, want) {
				t.Errorf("Messages(%d, %d, %d) seqs = %v, want %v", tc.from, tc.to, tc.limit, got, want)
			}
		})
	}
}

func testLatestBounds(t *testing.T, e *env) {
	e.group(t, 1, "alice")
	e.send(t, 1, "alice", 10)
	tests := []struct {
		name           string
		before, floor  uint64
		n              int
		wantLo, wantHi uint64 // wantLo > wantHi: none
	}{
		{"latest 3", 0, 0, 3, 8, 10},
		{"more than stored", 0, 0, 100, 1, 10},
		{"before is exclusive", 6, 0, 3, 3, 5},
		{"before past last seq", 100, 0, 2, 9, 10},
		{"floor cuts", 0, 9, 5, 9, 10},
		{"floor and before", 6, 4, 3, 4, 5},
		{"floor just below before", 7, 6, 3, 6, 6},
		{"floor equals before", 6, 6, 3, 1, 0},
		{"before 1", 1, 0, 3, 1, 0},
		{"floor past last seq", 0, 11, 5, 1, 0},
		{"floor above before", 3, 4, 5, 1, 0},
		{"n 0", 0, 0, 0, 1, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			msgs, err := e.s.Latest(context.Background(), 1, tc.before, tc.floor, tc.n)
			if err != nil {
				t.Fatalf("Latest(%d, %d, %d): %v", tc.before, tc.floor, tc.n, err)
			}
			if got, want := seqs(msgs), span(tc.wantLo, tc.wantHi); !equalSeqs(got, want) {
				t.Errorf("Latest(before %d, floor %d, n %d) seqs = %v, want %v", tc.before, tc.floor, tc.n, got, want)
			}
		})
	}
}

func testEmptyConversation(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice")
	msgs, err := e.s.Messages(ctx, 1, 1, 100, 100)
	if err != nil || len(msgs) != 0 {
		t.Errorf("Messages of an empty conversation = %v, %v; want none", seqs(msgs), err)
	}
	msgs, err = e.s.Latest(ctx, 1, 0, 0, 50)
	if err != nil || len(msgs) != 0 {
		t.Errorf("Latest of an empty conversation = %v, %v; want none", seqs(msgs), err)
	}
	if got := e.lastSeq(t, 1); got != 0 {
		t.Errorf("LastSeq of an empty conversation = %d, want 0", got)
	}
}

// testManyBuckets spreads messages over months so any time-bucketed layout
// spans many partitions; seq order must not depend on them.
func testManyBuckets(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice")
	const n = 30
	const day = int64(24 * 60 * 60 * 1000)
	var sent []store.Message
	for i := range n {
		m := e.msg(1, "alice", "", "spread")
		m.ServerTime = baseTime + int64(i)*3*day
		res, err := e.s.Append(ctx, store.Append{Msg: m})
		if err != nil {
			t.Fatalf("Append: %v", err)
		}
		sent = append(sent, res.Msg)
	}
	all, err := e.s.Messages(ctx, 1, 1, n, n)
	if got := seqs(all); err != nil || !equalSeqs(got, span(1, n)) {
		t.Fatalf("Messages = %v, %v; want 1..%d", got, err, n)
	}
	for i, m := range all {
		if !sameMsg(m, sent[i]) {
			t.Errorf("seq %d = %+v, want %+v", m.Seq, m, sent[i])
		}
	}
	latest, err := e.s.Latest(ctx, 1, 0, 0, 5)
	if got := seqs(latest); err != nil || !equalSeqs(got, span(n-4, n)) {
		t.Errorf("Latest 5 = %v, %v; want %d..%d", got, err, n-4, n)
	}
	mid, err := e.s.Messages(ctx, 1, 9, 14, 100)
	if got := seqs(mid); err != nil || !equalSeqs(got, span(9, 14)) {
		t.Errorf("Messages(9, 14) = %v, %v; want 9..14", got, err)
	}
}
