package storetest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/store"
)

// testAppendTurns: the appends of a pipeline (store.Turn), called at once
// and in the reverse of their turns' order, take their seqs in the turns'
// order, dense; an append that fails before reaching the engine (an
// invalid sender) and a repeated client_msg_id neither block the ones
// after them nor let them overtake the ones before.
func testAppendTurns(t *testing.T, e *env) {
	e.group(t, 1, "user0")
	const n = 24
	const bad, dup = 7, 15 // turn bad fails at the seam; turn dup repeats turn 3's client_msg_id
	turns := make([]*store.Turn, n)
	for i := range turns {
		var prev *store.Turn
		if i > 0 {
			prev = turns[i-1]
		}
		turns[i] = store.NewTurn(prev)
	}
	res := make([]store.AppendResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := n - 1; i >= 0; i-- {
		wg.Go(func() {
			defer turns[i].Take() // as the pipeline's runner does
			m := e.msg(1, "user0", fmt.Sprintf("t%d", i), fmt.Sprintf("turn %d", i))
			switch i {
			case bad:
				m.Sender = "bad sender"
			case dup:
				m.ClientMsgID = "t3"
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res[i], errs[i] = e.s.Append(store.WithTurn(ctx, turns[i]), store.Append{Msg: m})
		})
		time.Sleep(time.Millisecond) // the later turns call first
	}
	wg.Wait()
	want := uint64(1)
	for i := range n {
		switch {
		case i == bad:
			if errs[i] == nil {
				t.Errorf("turn %d (invalid sender): stored at %d, want an error", i, res[i].Msg.Seq)
			}
		case errs[i] != nil:
			t.Fatalf("turn %d: %v", i, errs[i])
		case i == dup:
			if !res[i].Duplicate || res[i].Msg.Seq != res[3].Msg.Seq {
				t.Errorf("turn %d (turn 3's client_msg_id): seq %d duplicate %v, want turn 3's seq %d, duplicate", i, res[i].Msg.Seq, res[i].Duplicate, res[3].Msg.Seq)
			}
		default:
			if res[i].Duplicate || res[i].Msg.Seq != want {
				t.Errorf("turn %d: seq %d duplicate %v, want seq %d (the turns' order)", i, res[i].Msg.Seq, res[i].Duplicate, want)
			}
			want++
		}
	}
	if got := e.lastSeq(t, 1); got != want-1 {
		t.Errorf("LastSeq = %d, want %d", got, want-1)
	}
}
