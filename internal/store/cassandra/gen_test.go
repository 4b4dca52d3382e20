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

// TestGenerationsExhausted: every batch write of unknown outcome moves the
// conversation's writer to the next write generation of its epoch, and an
// epoch has maxGen+1 of them. Here far more batches than that fail under
// one lease, some after their slots landed, the others before — and each of
// those arrives late, after the next batch's fence (as a write still in
// flight in the driver would). Fencing must hold throughout: the owner
// moves to a new epoch when the generations run out, no late arrival shows,
// the next acknowledged message gets the next dense seq, and no seq ever
// shows two different messages.
func TestGenerationsExhausted(t *testing.T) {
	cfg := fresh(t)
	ctx := context.Background()
	var leases leaseTable
	cfg.Lease = leases.grant()
	s := openT(t, cfg)
	if err := s.CreateConversation(ctx, store.Conversation{ID: 1, Kind: store.Group, CreatedAt: baseTime},
		[]store.Member{{UserID: "alice"}}); err != nil {
		t.Fatalf("CreateConversation: %v", err)
	}
	epoch0, _ := cfg.Lease.Epoch(1)

	// Acknowledged messages have small ids; failed ones large ids (ids
	// are unique but not ordered by arrival: Snowflakes of several
	// processes), so a late slot tied with a new one at the same write
	// time would win the tie.
	msg := func(id uint64, cmid string) store.Message {
		return store.Message{ConvID: 1, MsgID: id, Sender: "alice", ClientMsgID: cmid, Kind: "text",
			Body: "body " + cmid, ServerTime: baseTime + int64(id%1000)}
	}
	acked := map[uint64]string{} // seq → client msg id
	var nextID uint64
	send := func(cmid string) uint64 {
		t.Helper()
		nextID++
		res, err := s.Append(ctx, store.Append{Msg: msg(nextID, cmid)})
		if err != nil || res.Duplicate {
			t.Fatalf("append %s: %+v, %v", cmid, res, err)
		}
		if c, ok := acked[res.Msg.Seq]; ok {
			t.Fatalf("append %s acknowledged at seq %d, which %s got", cmid, res.Msg.Seq, c)
		}
		acked[res.Msg.Seq] = cmid
		return res.Msg.Seq
	}
	for i := range 3 {
		send(fmt.Sprint("a", i))
	}

	// The fault hook fails batches at their slot write. mode "lost": the
	// write is held back and delivered after the next batch's fence (at
	// that batch's "slots.lost" point, just before its own slot write);
	// "unknown": the write lands, then the batch fails.
	type late struct {
		seq, id   uint64
		bucket    int32
		timestamp int64
	}
	var (
		mu      sync.Mutex
		mode    string
		pending *late
		failed  = map[string]uint64{} // client msg id → msg id
		errHook = errors.New("injected failure")
		failID  uint64
	)
	hook := func(point string) error {
		mu.Lock()
		defer mu.Unlock()
		switch point {
		case "slots.lost":
			if p := pending; p != nil {
				pending = nil
				if err := s.sess.Query(`INSERT INTO message_seq (conv_id, seq_block, seq, message_id, bucket) VALUES (?, ?, ?, ?, ?) USING TIMESTAMP ?`,
					int64(1), s.blockOf(p.seq), int64(p.seq), int64(p.id), p.bucket, p.timestamp).Exec(); err != nil {
					t.Errorf("late slot write: %v", err)
				}
			}
			if mode == "lost" {
				o := &s.convs.Peek(1).own
				o.mu.Lock()
				pending = &late{seq: o.top + 1, id: failID, bucket: s.bucketOf(msg(failID, "").ServerTime),
					timestamp: writeTS(o.epoch, o.gen)}
				o.mu.Unlock()
				return errHook
			}
		case "slots.unknown":
			if mode == "unknown" {
				return errHook
			}
		}
		return nil
	}
	s.faultHook.Store(&hook)

	const failures = maxGen + 25
	for i := range failures {
		mu.Lock()
		failID = 1_000_000 + uint64(i)
		mode = "lost"
		if i%5 == 2 {
			mode = "unknown"
		}
		mu.Unlock()
		cmid := fmt.Sprint("f", i)
		failed[cmid] = failID
		res, err := s.Append(ctx, store.Append{Msg: msg(failID, cmid)})
		if err == nil {
			t.Fatalf("failed batch %d (%s) acknowledged at seq %d", i, cmid, res.Msg.Seq)
		}
		if errors.Is(err, store.ErrNotOwner) {
			t.Fatalf("failed batch %d: %v: the owner gave up its lease", i, err)
		}
	}
	mu.Lock()
	mode = ""
	mu.Unlock()

	// The history as it is now: the acknowledged messages and the failed
	// ones whose slots landed (their clients were told they may be
	// stored), seqs dense.
	history := func(when string) map[uint64]uint64 {
		t.Helper()
		msgs, err := s.Messages(ctx, 1, 1, 10_000, 10_000)
		if err != nil {
			t.Fatalf("%s: Messages: %v", when, err)
		}
		at := map[uint64]uint64{}
		for i, m := range msgs {
			if m.Seq != uint64(i+1) {
				t.Fatalf("%s: message %d (%s) at seq %d: not dense", when, i, m.ClientMsgID, m.Seq)
			}
			if c, ok := acked[m.Seq]; ok && c != m.ClientMsgID {
				t.Errorf("%s: seq %d, acknowledged for %s, shows %s", when, m.Seq, c, m.ClientMsgID)
			} else if !ok && failed[m.ClientMsgID] != m.MsgID {
				t.Errorf("%s: seq %d shows %s (id %d), neither acknowledged there nor a failed message", when, m.Seq, m.ClientMsgID, m.MsgID)
			}
			at[m.Seq] = m.MsgID
		}
		return at
	}
	before := history("after the failures")
	// Every landed slot shows (the next load saw it), every late one is
	// shadowed.
	landed := 0
	for i := range failures {
		if i%5 == 2 {
			landed++
		}
	}
	if len(before) != 3+landed {
		t.Errorf("%d messages after the failures, want the 3 acknowledged and the %d failed ones whose slots landed", len(before), landed)
	}
	seq := send("b0")
	if want := uint64(len(before)) + 1; seq != want {
		t.Errorf("first append after the failures got seq %d, want %d (the next dense one)", seq, want)
	}
	for i := 1; i < 5; i++ {
		send(fmt.Sprint("b", i))
	}
	after := history("after the new appends")
	for seq, id := range before {
		if after[seq] != id {
			t.Errorf("seq %d showed message %d, now %d", seq, id, after[seq])
		}
	}
	if len(after) != len(before)+5 {
		t.Errorf("%d messages after 5 appends to %d", len(after), len(before))
	}
	if epoch, ok := cfg.Lease.Epoch(1); !ok || epoch <= epoch0 {
		t.Errorf("lease epoch %d (%v) after %d failed batches, want a new one above %d", epoch, ok, failures, epoch0)
	}
	// A reader that owns nothing sees the same history.
	r := openT(t, fresh2(cfg))
	msgs, err := r.Messages(ctx, 1, 1, 10_000, 10_000)
	if err != nil || len(msgs) != len(after) {
		t.Fatalf("reader: %d messages, %v; want %d", len(msgs), err, len(after))
	}
	for _, m := range msgs {
		if after[m.Seq] != m.MsgID {
			t.Errorf("reader: seq %d shows %d, the owner read %d", m.Seq, m.MsgID, after[m.Seq])
		}
	}
}

// fresh2 is cfg without a lease: a process that reads only.
func fresh2(cfg Config) Config {
	cfg.Lease = nil
	return cfg
}

// unreachableLease is a leaseHolder whose Reepoch cannot reach the lease
// store while down is set.
type unreachableLease struct {
	*leaseHolder
	down atomic.Bool
}

func (l *unreachableLease) Reepoch(ctx context.Context, conv, epoch uint64) (uint64, bool, error) {
	if l.down.Load() {
		return 0, false, errors.New("lease store unreachable")
	}
	return l.leaseHolder.Reepoch(ctx, conv, epoch)
}

// TestGenerationsExhaustedNoNewEpoch: a conversation whose generations
// are used up is not written until its lease has a new epoch: while the
// lease store cannot be reached its writes fail with a retryable error
// (not ErrNotOwner) and nothing shows; once reached, the next write goes
// under a new epoch at the next seq. A re-claim refused (another process
// took the lease) is a lost lease: ErrNotOwner, and never again.
func TestGenerationsExhaustedNoNewEpoch(t *testing.T) {
	cfg := fresh(t)
	ctx := context.Background()
	var leases leaseTable
	lease := &unreachableLease{leaseHolder: leases.grant()}
	cfg.Lease = lease
	s := openT(t, cfg)
	if err := s.CreateConversation(ctx, store.Conversation{ID: 1, Kind: store.Group, CreatedAt: baseTime},
		[]store.Member{{UserID: "alice"}}); err != nil {
		t.Fatalf("CreateConversation: %v", err)
	}
	var id uint64
	send := func() (store.AppendResult, error) {
		id++
		return s.Append(ctx, store.Append{Msg: store.Message{ConvID: 1, MsgID: id, Sender: "alice",
			ClientMsgID: fmt.Sprint("m", id), Kind: "text", Body: "body", ServerTime: baseTime + int64(id)}})
	}
	if res, err := send(); err != nil || res.Msg.Seq != 1 {
		t.Fatalf("first append = %+v, %v", res, err)
	}
	// The generations of the epoch used up, as regenerate leaves them
	// after the maxGen-th failed batch.
	exhaust := func() uint64 {
		epoch, _ := lease.Epoch(1)
		st := s.state(1)
		defer s.release(st)
		st.mu.Lock()
		st.own.mu.Lock()
		st.own.epoch, st.own.gen, st.own.genEpoch = 0, maxGen+1, epoch
		st.own.mu.Unlock()
		st.mu.Unlock()
		return epoch
	}
	epoch0 := exhaust()
	lease.down.Store(true)
	for range 3 {
		if res, err := send(); err == nil || errors.Is(err, store.ErrNotOwner) {
			t.Fatalf("append with generations used up and no new epoch = %+v, %v; want a retryable error", res, err)
		}
	}
	if _, err := s.AddMembers(ctx, 1, []string{"bob"}, store.RoleMember); err == nil || errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("AddMembers with generations used up and no new epoch: %v; want a retryable error", err)
	}
	if msgs, err := s.Messages(ctx, 1, 1, 100, 100); err != nil || len(msgs) != 1 {
		t.Fatalf("Messages = %v, %v; want only the first", cmids(msgs), err)
	}
	lease.down.Store(false)
	if res, err := send(); err != nil || res.Msg.Seq != 2 {
		t.Fatalf("append once the lease store answers = %+v, %v; want seq 2", res, err)
	}
	epoch1, _ := lease.Epoch(1)
	if epoch1 <= epoch0 {
		t.Fatalf("epoch %d after the generations ran out, was %d", epoch1, epoch0)
	}

	// Used up again, and meanwhile another process took the lease: the
	// re-claim is refused, and the conversation is not written here again.
	exhaust()
	leases.grant()
	for range 2 {
		if res, err := send(); !errors.Is(err, store.ErrNotOwner) {
			t.Fatalf("append after a refused re-claim = %+v, %v; want ErrNotOwner", res, err)
		}
	}
	if e, _ := lease.Epoch(1); e != epoch1 {
		t.Errorf("refused re-claim moved the holder's epoch to %d", e)
	}
	if msgs, err := s.Messages(ctx, 1, 1, 100, 100); err != nil || len(msgs) != 2 {
		t.Fatalf("Messages = %v, %v; want the 2 acknowledged", cmids(msgs), err)
	}
}
