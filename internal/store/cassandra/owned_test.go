package cassandra

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/storetest"
)

// leaseTable is a lease store for the tests of owned appends: one epoch
// per keyspace (one partition), given out in increasing order. Each
// holder is a view of it, as each chat process is of the Redis leases
// (internal/cluster/lease.Owner, tested on real Redis in internal/clustertest).
type leaseTable struct {
	mu      sync.Mutex
	current uint64
}

// grant starts a new lease and returns its holder.
func (t *leaseTable) grant() *leaseHolder {
	t.mu.Lock()
	defer t.mu.Unlock()
	// Epochs as the Redis script makes them: milliseconds, strictly
	// increasing.
	t.current = max(t.current+1, uint64(time.Now().UnixMilli()))
	h := &leaseHolder{t: t}
	h.epoch.Store(t.current)
	return h
}

// leaseHolder believes it holds its epoch until told otherwise (a stalled
// owner does); Confirm asks the table.
type leaseHolder struct {
	t       *leaseTable
	epoch   atomic.Uint64
	stopped atomic.Bool
}

func (h *leaseHolder) Epoch(uint64) (uint64, bool) { return h.epoch.Load(), !h.stopped.Load() }

// Reepoch re-claims the holder's lease at a new epoch if the table is
// still at its epoch, as the Redis script does.
func (h *leaseHolder) Reepoch(_ context.Context, _, epoch uint64) (uint64, bool, error) {
	h.t.mu.Lock()
	defer h.t.mu.Unlock()
	if cur := h.epoch.Load(); cur > epoch {
		return cur, true, nil
	}
	if h.stopped.Load() || h.t.current != epoch || h.epoch.Load() != epoch {
		return 0, false, nil
	}
	h.t.current = max(h.t.current+1, uint64(time.Now().UnixMilli()))
	h.epoch.Store(h.t.current)
	return h.t.current, true, nil
}

func (h *leaseHolder) Confirm(_ context.Context, _, epoch uint64) error {
	h.t.mu.Lock()
	defer h.t.mu.Unlock()
	if h.t.current != epoch {
		return fmt.Errorf("lease at epoch %d, not %d", h.t.current, epoch)
	}
	return nil
}

// TestConformanceOwned runs the store suite with owned appends: one
// process holds the lease, a reopen takes a new one.
func TestConformanceOwned(t *testing.T) {
	var (
		cfg    Config
		leases leaseTable
	)
	storetest.Run(t, storetest.Harness{
		Open: func(t *testing.T) store.Store {
			cfg = fresh(t)
			cfg.Lease = leases.grant()
			return openSeam(t, cfg)
		},
		Reopen: func(t *testing.T, old store.Store) store.Store {
			if err := old.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			cfg.Lease = leases.grant()
			return openSeam(t, cfg)
		},
		Evict: func(s store.Store) { store.Engine(s).(*Store).EvictIdle() },
	})
}

// TestStaleOwnerFenced: an owner loses its lease without noticing (a
// stalled process) while a new owner takes over and writes. The stale
// owner's later writes are never acknowledged, never show, and leave no
// hole: the history holds exactly the new owner's and the acknowledged
// messages, seqs dense.
func TestStaleOwnerFenced(t *testing.T) {
	cfg := fresh(t)
	ctx := context.Background()
	var leases leaseTable
	stale := leases.grant()
	cfgA := cfg
	cfgA.Lease = stale
	a := openT(t, cfgA)
	if err := a.CreateConversation(ctx, store.Conversation{ID: 1, Kind: store.Group, CreatedAt: baseTime},
		[]store.Member{{UserID: "alice"}}); err != nil {
		t.Fatalf("CreateConversation: %v", err)
	}
	var ids atomic.Uint64
	send := func(s *Store, cmid string) (store.AppendResult, error) {
		id := ids.Add(1)
		return s.Append(ctx, store.Append{Msg: store.Message{ConvID: 1, MsgID: id, Sender: "alice", ClientMsgID: cmid,
			Kind: "text", Body: "body " + cmid, ServerTime: baseTime + int64(id)}})
	}
	acked := map[string]uint64{}
	for i := range 5 {
		cmid := fmt.Sprintf("a%d", i)
		res, err := send(a, cmid)
		if err != nil {
			t.Fatalf("owner append %s: %v", cmid, err)
		}
		acked[cmid] = res.Msg.Seq
	}

	// Takeover: B gets a newer epoch and writes 3 messages.
	cfgB := cfg
	cfgB.Lease = leases.grant()
	b := openT(t, cfgB)
	for i := range 3 {
		cmid := fmt.Sprintf("b%d", i)
		res, err := send(b, cmid)
		if err != nil {
			t.Fatalf("new owner append %s: %v", cmid, err)
		}
		acked[cmid] = res.Msg.Seq
	}

	// The stale owner still believes it owns the conversation: its
	// writes (at seqs B holds, and above B's top) must all be refused.
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			cmid := fmt.Sprintf("z%d", i)
			if res, err := send(a, cmid); err == nil {
				t.Errorf("stale owner's %s acknowledged at seq %d", cmid, res.Msg.Seq)
			} else if !errors.Is(err, store.ErrNotOwner) {
				t.Errorf("stale owner's %s: %v, want ErrNotOwner", cmid, err)
			}
		})
	}
	wg.Wait()
	// A retry of an acknowledged message through the stale owner is
	// refused too; through the new owner it is the original.
	if _, err := send(a, "b1"); !errors.Is(err, store.ErrNotOwner) {
		t.Errorf("stale owner's retry of b1: %v, want ErrNotOwner", err)
	}
	// The new owner writes on; its seqs continue densely over the fenced
	// ones, and a retry of a refused message is stored once.
	for _, cmid := range []string{"b3", "z0", "b4"} {
		res, err := send(b, cmid)
		if err != nil || res.Duplicate {
			t.Fatalf("new owner append %s: %+v, %v", cmid, res, err)
		}
		acked[cmid] = res.Msg.Seq
	}
	res, err := send(b, "b1")
	if err != nil || !res.Duplicate || res.Msg.Seq != acked["b1"] {
		t.Fatalf("retry of b1 = %+v, %v; want the original at seq %d", res, err, acked["b1"])
	}

	for name, s := range map[string]*Store{"stale": a, "new": b, "reader": openT(t, cfg)} {
		msgs, err := s.Messages(ctx, 1, 1, 100, 100)
		if err != nil {
			t.Fatalf("%s: Messages: %v", name, err)
		}
		if len(msgs) != len(acked) {
			t.Errorf("%s reads %d messages, want the %d acknowledged: %v", name, len(msgs), len(acked), cmids(msgs))
		}
		for i, m := range msgs {
			if m.Seq != uint64(i+1) {
				t.Fatalf("%s: message %d has seq %d: not dense", name, i, m.Seq)
			}
			if want, ok := acked[m.ClientMsgID]; !ok || want != m.Seq {
				t.Errorf("%s: seq %d holds %s (acknowledged at %d, %v)", name, m.Seq, m.ClientMsgID, want, ok)
			}
		}
		if c, err := s.Conversation(ctx, 1); err != nil || c.LastSeq != uint64(len(acked)) {
			t.Errorf("%s: LastSeq = %d, %v; want %d", name, c.LastSeq, err, len(acked))
		}
	}
}

func cmids(ms []store.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = fmt.Sprintf("%d:%s", m.Seq, m.ClientMsgID)
	}
	return out
}

// movingLease is a lease whose epoch the test moves on, as a process
// that loses a partition and takes it again sees.
type movingLease struct{ epoch atomic.Uint64 }

func (l *movingLease) Epoch(uint64) (uint64, bool) { return l.epoch.Load(), true }

func (l *movingLease) Reepoch(_ context.Context, _, epoch uint64) (uint64, bool, error) {
	next := max(epoch+1, uint64(time.Now().UnixMilli()))
	if l.epoch.CompareAndSwap(epoch, next) {
		return next, true, nil
	}
	if cur := l.epoch.Load(); cur > epoch {
		return cur, true, nil
	}
	return 0, false, nil
}

func (l *movingLease) Confirm(_ context.Context, _, epoch uint64) error {
	if cur := l.epoch.Load(); cur != epoch {
		return fmt.Errorf("lease at epoch %d, not %d", cur, epoch)
	}
	return nil
}

// TestEvictionKeepsFencingState: an owner's conversation state is evicted
// when idle and loads its top again before the next write; but a state
// that fenced at a later generation (after a write of unknown outcome)
// stays while its epoch lasts, since a reload at generation 0 would write
// below its own fence and its acknowledged messages would never show.
func TestEvictionKeepsFencingState(t *testing.T) {
	cfg := fresh(t)
	ctx := context.Background()
	lease := &movingLease{}
	lease.epoch.Store(uint64(time.Now().UnixMilli()))
	cfg.Lease = lease
	s := openT(t, cfg)
	if err := s.CreateConversation(ctx, store.Conversation{ID: 1, Kind: store.Group, CreatedAt: baseTime},
		[]store.Member{{UserID: "alice"}}); err != nil {
		t.Fatalf("CreateConversation: %v", err)
	}
	var ids atomic.Uint64
	send := func(wantSeq uint64) {
		t.Helper()
		id := ids.Add(1)
		res, err := s.Append(ctx, store.Append{Msg: store.Message{ConvID: 1, MsgID: id, Sender: "alice",
			ClientMsgID: fmt.Sprint("m", id), Kind: "text", Body: "body", ServerTime: baseTime + int64(id)}})
		if err != nil || res.Msg.Seq != wantSeq {
			t.Fatalf("Append = seq %d, %v; want seq %d", res.Msg.Seq, err, wantSeq)
		}
		msgs, err := s.Messages(ctx, 1, wantSeq, wantSeq, 1)
		if err != nil || len(msgs) != 1 || msgs[0].MsgID != id {
			t.Fatalf("acknowledged seq %d reads back as %+v, %v", wantSeq, msgs, err)
		}
	}
	send(1)
	send(2)
	if n := s.EvictIdle(); n != 1 {
		t.Fatalf("EvictIdle evicted %d states of an idle owner, want 1", n)
	}
	send(3) // reloads the top under the same epoch

	// A write of unknown outcome: the next batch fences above the top at
	// generation 1 (done here by hand, as writeOwned does after a failed
	// batch write).
	st := s.state(1)
	epoch := lease.epoch.Load()
	st.mu.Lock()
	top, err := s.takeConv(ctx, st, epoch, 1)
	st.mu.Unlock()
	if err != nil || top != 3 {
		t.Fatalf("takeConv at generation 1 = %d, %v", top, err)
	}
	st.own.mu.Lock()
	st.own.epoch, st.own.gen, st.own.genEpoch, st.own.top = epoch, 1, epoch, top
	st.own.mu.Unlock()
	s.release(st)
	if n := s.EvictIdle(); n != 0 {
		t.Fatalf("EvictIdle evicted a state fenced at generation 1 under its epoch")
	}
	send(4) // at generation 1: above the fence, so it shows

	// A new epoch starts over: the state may go, and the next write loads
	// the top under the new epoch.
	lease.epoch.Store(epoch + 1)
	if n := s.EvictIdle(); n != 1 {
		t.Fatalf("EvictIdle evicted %d states after the epoch moved on, want 1", n)
	}
	send(5)
	if held, evicted := s.ConvStates(); held != 1 || evicted != 2 {
		t.Errorf("ConvStates = %d held, %d evicted; want 1, 2", held, evicted)
	}
}

// TestOwnedRepairsIdempotency: an owner writes a batch's idempotency
// records after its slots, so one that dies in between leaves slots
// without records. The next owner writes them again when it takes the
// conversation, before it reads any: a client's retry of such a message
// is a duplicate, not a second copy.
func TestOwnedRepairsIdempotency(t *testing.T) {
	cfg := fresh(t)
	ctx := context.Background()
	var leases leaseTable
	cfgA := cfg
	cfgA.Lease = leases.grant()
	a := openT(t, cfgA)
	if err := a.CreateConversation(ctx, store.Conversation{ID: 1, Kind: store.Direct, CreatedAt: baseTime},
		[]store.Member{{UserID: "alice"}, {UserID: "bob"}}); err != nil {
		t.Fatalf("CreateConversation: %v", err)
	}
	msg := func(id uint64, cmid string) store.Message {
		return store.Message{ConvID: 1, MsgID: id, Sender: "alice", SenderDevice: "d1", ClientMsgID: cmid,
			Kind: "text", Body: "body " + cmid, ServerTime: baseTime + int64(id)}
	}
	reader := &store.Reader{User: "alice", Device: "d1"}
	for i := range uint64(3) {
		res, err := a.Append(ctx, store.Append{Msg: msg(i+1, fmt.Sprintf("r%d", i)), Rows: true, ReadBy: reader})
		if err != nil || res.Msg.Seq != i+1 || !res.ReadRaised || !res.RowsWritten {
			t.Fatalf("owner append r%d = %+v, %v; want seq %d, read position and rows written", i, res, err, i+1)
		}
		if got, err := a.Read(ctx, "alice", "d1", 1); err != nil || got != i+1 {
			t.Fatalf("alice's read position after r%d = %d, %v", i, got, err)
		}
	}
	// The owner died after the last batch's slot, before its record.
	if err := a.sess.Query(`DELETE FROM idempotency WHERE conv_id = 1 AND sender = 'alice' AND client_msg_id = 'r2'`).Exec(); err != nil {
		t.Fatalf("delete record: %v", err)
	}

	cfgB := cfg
	cfgB.Lease = leases.grant()
	b := openT(t, cfgB)
	for i, cmid := range []string{"r2", "r1"} {
		res, err := b.Append(ctx, store.Append{Msg: msg(uint64(10+i), cmid), ReadBy: reader})
		if want := uint64(3 - i); err != nil || !res.Duplicate || res.Msg.Seq != want || res.Msg.MsgID != want {
			t.Fatalf("new owner's retry of %s = %+v, %v; want the original at seq %d", cmid, res, err, want)
		}
	}
	res, err := b.Append(ctx, store.Append{Msg: msg(20, "r3"), Rows: true})
	if err != nil || res.Duplicate || res.Msg.Seq != 4 {
		t.Fatalf("new owner's append r3 = %+v, %v; want seq 4", res, err)
	}
	msgs, err := b.Messages(ctx, 1, 1, 100, 100)
	if err != nil || len(msgs) != 4 {
		t.Fatalf("Messages = %v, %v; want 4", cmids(msgs), err)
	}
	for _, user := range []string{"alice", "bob"} {
		rows, err := b.UserConversations(ctx, user)
		if err != nil || len(rows) != 1 || rows[0].LastSeq != 4 {
			t.Errorf("%s's rows = %+v, %v; want last seq 4", user, rows, err)
		}
	}
}
