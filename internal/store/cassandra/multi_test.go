package cassandra

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

const baseTime = int64(1_704_067_200_000) // 2024-01-01, as in storetest

// TestTwoProcesses runs two Stores on one keyspace, as two chat processes
// would, appending to one conversation at once. Half of the client message
// ids are sent through both, as a client retrying through another node:
// each must be stored once, and seqs must stay dense.
func TestTwoProcesses(t *testing.T) {
	cfg := fresh(t)
	ctx := context.Background()
	procs := []*Store{openT(t, cfg), openT(t, cfg)}
	if err := procs[0].CreateConversation(ctx, store.Conversation{ID: 1, Kind: store.Group, CreatedAt: baseTime},
		[]store.Member{{UserID: "alice"}}); err != nil {
		t.Fatalf("CreateConversation: %v", err)
	}
	const senders, perSender = 8, 25
	type result struct {
		cmid string
		res  store.AppendResult
	}
	var (
		ids     atomic.Uint64
		mu      sync.Mutex
		results []result
		errs    []error
		wg      sync.WaitGroup
	)
	for p, s := range procs {
		for w := range senders {
			wg.Go(func() {
				for i := range perSender {
					cmid := fmt.Sprintf("p%d-w%d-%d", p, w, i)
					if i%2 == 0 {
						cmid = fmt.Sprintf("shared-w%d-%d", w, i)
					}
					id := ids.Add(1)
					m := store.Message{ConvID: 1, MsgID: id, Sender: "alice", ClientMsgID: cmid, Kind: "text",
						Body: "body of " + cmid, ServerTime: baseTime + int64(id)}
					res, err := s.Append(ctx, store.Append{Msg: m})
					mu.Lock()
					if err != nil {
						errs = append(errs, fmt.Errorf("process %d %s: %w", p, cmid, err))
					} else {
						results = append(results, result{cmid, res})
					}
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("appends: %v", err)
	}
	originals := map[string]store.Message{}
	dups := map[string][]store.Message{}
	for _, r := range results {
		if !r.res.Duplicate {
			if prev, ok := originals[r.cmid]; ok {
				t.Fatalf("%s stored twice: seq %d and %d", r.cmid, prev.Seq, r.res.Msg.Seq)
			}
			originals[r.cmid] = r.res.Msg
		} else {
			dups[r.cmid] = append(dups[r.cmid], r.res.Msg)
		}
	}
	for cmid, ds := range dups {
		for _, d := range ds {
			if o := originals[cmid]; d.Seq != o.Seq || d.MsgID != o.MsgID || d.Body != o.Body {
				t.Errorf("%s: duplicate returned %+v, original %+v", cmid, d, o)
			}
		}
	}
	want := senders * (perSender/2 + 1 + 2*(perSender/2)) // shared once, the rest per process
	if len(originals) != want {
		t.Fatalf("%d messages stored, want %d", len(originals), want)
	}
	for p, s := range procs {
		c, err := s.Conversation(ctx, 1)
		if err != nil || c.LastSeq != uint64(want) {
			t.Errorf("process %d: LastSeq = %d, %v; want %d", p, c.LastSeq, err, want)
		}
	}
	stored, err := procs[1].Messages(ctx, 1, 1, uint64(want)+10, want+10)
	if err != nil || len(stored) != want {
		t.Fatalf("Messages = %d messages, %v; want %d", len(stored), err, want)
	}
	seen := map[string]bool{}
	for i, m := range stored {
		if m.Seq != uint64(i+1) {
			t.Fatalf("Messages[%d].Seq = %d: not dense", i, m.Seq)
		}
		if seen[m.ClientMsgID] {
			t.Fatalf("%s stored at two seqs", m.ClientMsgID)
		}
		seen[m.ClientMsgID] = true
		if o := originals[m.ClientMsgID]; o.Seq != m.Seq || o.MsgID != m.MsgID {
			t.Errorf("seq %d holds %+v, Append returned %+v", m.Seq, m, o)
		}
	}
}

// TestRecoverAfterCrash plays the two crashes an appender can leave
// behind, by writing their rows directly: a claimed slot whose last_seq
// hint was never raised, and an idempotency record whose message never got
// a slot. A new process must neither reuse nor skip a seq, a retry must
// finish the stranded message, and a process with a stale hint must be
// fenced off the taken seqs.
func TestRecoverAfterCrash(t *testing.T) {
	cfg := fresh(t)
	ctx := context.Background()
	stale := openT(t, cfg)
	if err := stale.CreateConversation(ctx, store.Conversation{ID: 1, Kind: store.Group, CreatedAt: baseTime},
		[]store.Member{{UserID: "alice"}}); err != nil {
		t.Fatalf("CreateConversation: %v", err)
	}
	msg := func(id uint64, cmid string) store.Message {
		return store.Message{ConvID: 1, MsgID: id, Sender: "alice", ClientMsgID: cmid, Kind: "text",
			Body: fmt.Sprintf("message %d", id), ServerTime: baseTime + int64(id)}
	}
	for id := uint64(1); id <= 3; id++ {
		if _, err := stale.Append(ctx, store.Append{Msg: msg(id, fmt.Sprintf("c%d", id))}); err != nil {
			t.Fatalf("Append: %v", err)
		}
	}
	// Crash 1: message 4 claimed seq 4; the hint still says 3.
	crashed := msg(4, "c4")
	if err := stale.writeBody(ctx, crashed, stale.bucketOf(crashed.ServerTime)); err != nil {
		t.Fatalf("writeBody: %v", err)
	}
	if err := suite.admin.Query(`INSERT INTO message_seq (conv_id, seq_block, seq, message_id, bucket) VALUES (1, ?, 4, 4, ?)`,
		stale.blockOf(4), stale.bucketOf(crashed.ServerTime)).Exec(); err != nil {
		t.Fatalf("insert slot: %v", err)
	}
	// Crash 2: message 5 owns "lost" and has its body, but no slot.
	lost := msg(5, "lost")
	if err := stale.writeBody(ctx, lost, stale.bucketOf(lost.ServerTime)); err != nil {
		t.Fatalf("writeBody: %v", err)
	}
	if err := suite.admin.Query(`INSERT INTO idempotency (conv_id, sender, client_msg_id, message_id, bucket, start_seq) VALUES (1, 'alice', 'lost', 5, ?, 4)`,
		stale.bucketOf(lost.ServerTime)).Exec(); err != nil {
		t.Fatalf("insert idempotency: %v", err)
	}

	fresh := openT(t, cfg)
	if c, err := fresh.Conversation(ctx, 1); err != nil || c.LastSeq != 4 {
		t.Fatalf("after the crash: LastSeq = %d, %v; want 4 (from the seq index)", c.LastSeq, err)
	}
	res, err := fresh.Append(ctx, store.Append{Msg: msg(6, "c6")})
	if err != nil || res.Msg.Seq != 5 {
		t.Fatalf("append after the crash: seq %d, %v; want 5", res.Msg.Seq, err)
	}
	retry, err := fresh.Append(ctx, store.Append{Msg: msg(7, "lost")})
	if err != nil || !retry.Duplicate || retry.Msg.MsgID != 5 || retry.Msg.Seq != 6 {
		t.Fatalf("retry of the stranded message = %+v, %v; want message 5 as a duplicate at seq 6", retry, err)
	}
	// The stale process believes the last seq is 3.
	res, err = stale.Append(ctx, store.Append{Msg: msg(8, "c8")})
	if err != nil || res.Msg.Seq != 7 {
		t.Fatalf("append through a stale process: seq %d, %v; want 7", res.Msg.Seq, err)
	}
	again, err := stale.Append(ctx, store.Append{Msg: msg(9, "lost")})
	if err != nil || !again.Duplicate || again.Msg.Seq != 6 {
		t.Errorf("second retry through the stale process = %+v, %v; want the duplicate at seq 6", again, err)
	}
	all, err := fresh.Messages(ctx, 1, 1, 100, 100)
	if err != nil || len(all) != 7 {
		t.Fatalf("Messages = %d, %v; want 7", len(all), err)
	}
	for i, m := range all {
		if m.Seq != uint64(i+1) {
			t.Fatalf("Messages[%d].Seq = %d: not dense", i, m.Seq)
		}
	}
	if all[5].MsgID != 5 || all[3].MsgID != 4 {
		t.Errorf("seq 4 holds %d and seq 6 holds %d; want 4 and 5", all[3].MsgID, all[5].MsgID)
	}
}
