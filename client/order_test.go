package client

import (
	"slices"
	"testing"

	"github.com/parley-im/parley/protocol"
)

func msg(seq uint64) protocol.Message {
	return protocol.Message{ConvID: 1, Seq: seq, Kind: protocol.KindText}
}

func msgs(seqs ...uint64) []protocol.Message {
	out := make([]protocol.Message, len(seqs))
	for i, s := range seqs {
		out[i] = msg(s)
	}
	return out
}

func seqsOf(ms []protocol.Message) []uint64 {
	out := []uint64{}
	for _, m := range ms {
		out = append(out, m.Seq)
	}
	return out
}

func TestConvOrderOffer(t *testing.T) {
	tests := []struct {
		name      string
		last      uint64
		in        []uint64
		want      []uint64
		wantHole  bool
		wantLast  uint64
		wantFetch bool
	}{
		{name: "in order", last: 3, in: []uint64{4, 5, 6}, want: []uint64{4, 5, 6}, wantLast: 6},
		{name: "duplicates dropped", last: 3, in: []uint64{2, 3, 4, 4, 3, 5}, want: []uint64{4, 5}, wantLast: 5},
		{name: "hole held", last: 3, in: []uint64{5, 6}, want: []uint64{}, wantHole: true, wantLast: 3, wantFetch: true},
		{name: "out of order released", last: 3, in: []uint64{6, 5, 4}, want: []uint64{4, 5, 6}, wantLast: 6},
		{name: "held duplicate once", last: 0, in: []uint64{3, 3, 2, 1}, want: []uint64{1, 2, 3}, wantLast: 3},
		{name: "partial release keeps later hole", last: 0, in: []uint64{2, 5, 1}, want: []uint64{1, 2}, wantHole: true, wantLast: 2, wantFetch: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := newConvOrder(tc.last, true)
			got := []uint64{}
			for _, s := range tc.in {
				got = append(got, seqsOf(o.offer(msg(s)))...)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("delivered %v, want %v", got, tc.want)
			}
			if o.hole() != tc.wantHole || o.last != tc.wantLast || o.needFetch() != tc.wantFetch {
				t.Errorf("hole=%v last=%d needFetch=%v, want %v %d %v", o.hole(), o.last, o.needFetch(), tc.wantHole, tc.wantLast, tc.wantFetch)
			}
		})
	}
}

func TestConvOrderGapFill(t *testing.T) {
	o := newConvOrder(3, true)
	if got := o.offer(msg(7)); len(got) != 0 {
		t.Fatalf("push past hole delivered %v", seqsOf(got))
	}
	if after := o.startFetch(); after != 3 {
		t.Fatalf("fetch after %d, want 3", after)
	}
	if o.needFetch() {
		t.Fatal("second fetch wanted while one is in flight")
	}
	// A push of the fetched range arrives before the page: it is released,
	// and the page's copy of it is a duplicate.
	if got := seqsOf(o.offer(msg(4))); !slices.Equal(got, []uint64{4}) {
		t.Fatalf("next-in-line push delivered %v, want [4]", got)
	}
	ready, again, skipped := o.fill(msgs(4, 5), true)
	if got := seqsOf(ready); !slices.Equal(got, []uint64{5}) || !again || skipped != 0 {
		t.Fatalf("first page: ready %v again %v skipped %d, want [5] true 0", got, again, skipped)
	}
	o.startFetch()
	ready, again, _ = o.fill(msgs(6, 7, 8), false)
	if got := seqsOf(ready); !slices.Equal(got, []uint64{6, 7, 8}) || again {
		t.Fatalf("second page: ready %v again %v, want [6 7 8] false", got, again)
	}
	if o.hole() || o.last != 8 {
		t.Fatalf("after fill: hole %v last %d, want false 8", o.hole(), o.last)
	}
}

func TestConvOrderFillStoredLater(t *testing.T) {
	// The page was read before seq 9 existed; 9 was pushed (8 lost) after
	// the fetch had been sent. The hole must be fetched again, not jumped.
	o := newConvOrder(3, true)
	o.offer(msg(5))
	o.startFetch()
	o.offer(msg(9))
	ready, again, skipped := o.fill(msgs(4, 5, 6, 7), false)
	if got := seqsOf(ready); !slices.Equal(got, []uint64{4, 5, 6, 7}) || !again || skipped != 0 {
		t.Fatalf("ready %v again %v skipped %d, want [4 5 6 7] true 0", got, again, skipped)
	}
}

func TestConvOrderInvisibleSeqs(t *testing.T) {
	// A new member's first push is seq 10; 1..9 are before its join_seq and
	// history returns nothing for them: release instead of stalling.
	o := newConvOrder(0, true)
	o.offer(msg(10))
	o.startFetch()
	ready, again, skipped := o.fill(nil, false)
	if got := seqsOf(ready); !slices.Equal(got, []uint64{10}) || again || skipped != 9 {
		t.Fatalf("ready %v again %v skipped %d, want [10] false 9", got, again, skipped)
	}
}

func TestConvOrderJump(t *testing.T) {
	t.Run("snapshot more_unread", func(t *testing.T) {
		o := newConvOrder(10, true)
		o.offer(msg(300)) // held push from before the snapshot
		ready, skipped := o.jumpTo(250)
		if len(ready) != 0 || skipped != 240 || o.last != 250 {
			t.Fatalf("ready %v skipped %d last %d, want [] 240 250", seqsOf(ready), skipped, o.last)
		}
		var got []uint64
		for s := uint64(251); s <= 300; s++ {
			got = append(got, seqsOf(o.offer(msg(s)))...)
		}
		if len(got) != 50 || got[0] != 251 || got[49] != 300 || o.hole() {
			t.Fatalf("after jump delivered %d messages (%v..), hole %v", len(got), got[:1], o.hole())
		}
	})
	t.Run("never backwards", func(t *testing.T) {
		o := newConvOrder(10, true)
		if ready, skipped := o.jumpTo(5); len(ready) != 0 || skipped != 0 || o.last != 10 {
			t.Fatalf("jump back: ready %v skipped %d last %d", seqsOf(ready), skipped, o.last)
		}
	})
	t.Run("unknown start", func(t *testing.T) {
		o := newConvOrder(0, false)
		o.offer(msg(7))
		o.offer(msg(6))
		if o.needFetch() {
			t.Fatal("fetch wanted before the starting point is known")
		}
		ready, skipped := o.jumpTo(4)
		if got := seqsOf(ready); len(got) != 0 || skipped != 0 || !o.needFetch() {
			t.Fatalf("ready %v skipped %d needFetch %v, want [] 0 true", got, skipped, o.needFetch())
		}
		if got := seqsOf(o.offer(msg(5))); !slices.Equal(got, []uint64{5, 6, 7}) {
			t.Fatalf("delivered %v, want [5 6 7]", got)
		}
	})
	t.Run("release all", func(t *testing.T) {
		o := newConvOrder(1, true)
		o.offer(msg(4))
		o.offer(msg(7))
		o.offer(msg(8))
		if got := seqsOf(o.releaseAll()); !slices.Equal(got, []uint64{4, 7, 8}) || o.hole() {
			t.Fatalf("released %v, hole %v", got, o.hole())
		}
	})
}

func TestConvOrderPendingBound(t *testing.T) {
	o := newConvOrder(0, true)
	for s := uint64(2); s < 2+maxPending+10; s++ {
		o.offer(msg(s))
	}
	if len(o.pending) != maxPending {
		t.Fatalf("pending %d, want bounded at %d", len(o.pending), maxPending)
	}
	if got := o.offer(msg(1)); len(got) != maxPending+1 {
		t.Fatalf("released %d, want %d", len(got), maxPending+1)
	}
}

// FuzzConvOrder checks the delivery invariant against any arrival order,
// duplicates and losses, with gap fetches answered from the full log.
func FuzzConvOrder(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5})
	f.Add([]byte{5, 3, 3, 9, 1, 0, 2})
	f.Fuzz(func(t *testing.T, arrivals []byte) {
		const total = 40
		o := newConvOrder(0, true)
		var got []uint64
		for _, b := range arrivals {
			s := uint64(b)%total + 1
			got = append(got, seqsOf(o.offer(msg(s)))...)
			for o.needFetch() {
				after := o.startFetch()
				var page []protocol.Message
				for q := after + 1; q <= total && len(page) < 7; q++ {
					page = append(page, msg(q))
				}
				ready, again, _ := o.fill(page, after+uint64(len(page)) < total)
				got = append(got, seqsOf(ready)...)
				if !again {
					break
				}
			}
		}
		for i, s := range got {
			if s != uint64(i+1) {
				t.Fatalf("delivered %v: position %d is %d", got, i, s)
			}
		}
		if o.hole() {
			t.Fatalf("hole left with pending %v", o.pending)
		}
	})
}
