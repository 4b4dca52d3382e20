package fanout

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/pebble"
)

// rig is a real (in-memory) Pebble store with groups and a recording
// handler.
type rig struct {
	st    store.Store
	mu    sync.Mutex
	got   map[uint64][]uint64 // conv → seqs handled, in order
	fail  func(j Job) error   // nil: succeed
	msgID uint64
}

func newRig(t *testing.T, convs ...uint64) *rig {
	t.Helper()
	st, err := pebble.Open(context.Background(), pebble.Config{Dir: "db", FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, c := range convs {
		err := st.CreateConversation(context.Background(), store.Conversation{ID: c, Kind: store.Group, Name: "g"},
			[]store.Member{{UserID: "a"}, {UserID: "b"}})
		if err != nil {
			t.Fatal(err)
		}
	}
	return &rig{st: st, got: map[uint64][]uint64{}}
}

func (r *rig) append(t *testing.T, conv uint64) store.Message {
	t.Helper()
	r.msgID++
	res, err := r.st.Append(context.Background(), store.Append{Msg: store.Message{
		ConvID: conv, MsgID: r.msgID, Sender: "a", ClientMsgID: fmt.Sprint("c", r.msgID), Kind: "text", Body: "x", ServerTime: 1,
	}})
	if err != nil {
		t.Fatal(err)
	}
	return res.Msg
}

func (r *rig) handle(_ context.Context, j Job) error {
	if r.fail != nil {
		if err := r.fail(j); err != nil {
			return err
		}
	}
	if j.Msg.Body != "x" {
		return fmt.Errorf("job of seq %d has no message body", j.Msg.Seq)
	}
	r.mu.Lock()
	r.got[j.Msg.ConvID] = append(r.got[j.Msg.ConvID], j.Msg.Seq)
	r.mu.Unlock()
	return nil
}

func (r *rig) handled(conv uint64) []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got[conv])
}

func run(t *testing.T, o *outbox) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { o.run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// waitEmpty waits until the store's outbox is empty and nothing is held.
func waitEmpty(t *testing.T, r *rig, o *outbox) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ps, err := r.st.Pending(context.Background(), 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) == 0 && o.backlog() == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("outbox not drained: %d entries in the store, %d held", len(ps), o.backlog())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func span(lo, hi uint64) []uint64 {
	var out []uint64
	for s := lo; s <= hi; s++ {
		out = append(out, s)
	}
	return out
}

// TestOrderPerConversation: messages queued out of order are fanned out in
// seq order, each once, and their entries cleared.
func TestOrderPerConversation(t *testing.T) {
	r := newRig(t, 1, 2)
	o := newOutbox(Config{}, r.st, r.handle, nil)
	var msgs []store.Message
	for range 20 {
		msgs = append(msgs, r.append(t, 1), r.append(t, 2))
	}
	slices.Reverse(msgs)
	for _, m := range msgs {
		o.enqueue(Job{Msg: m})
		o.enqueue(Job{Msg: m}) // held already: once only
	}
	run(t, o)
	waitEmpty(t, r, o)
	for _, c := range []uint64{1, 2} {
		if got := r.handled(c); !slices.Equal(got, span(1, 20)) {
			t.Errorf("conversation %d fanned out %v, want 1..20 in order", c, got)
		}
	}
}

// TestRecoveryFromTheStore: entries left by a process that died after the
// ACK (never enqueued here) are fanned out at start, in order.
func TestRecoveryFromTheStore(t *testing.T) {
	r := newRig(t, 1, 2)
	for range 10 {
		r.append(t, 1)
	}
	r.append(t, 2)
	if err := r.st.FanoutDone(context.Background(), 1, []uint64{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	o := newOutbox(Config{}, r.st, r.handle, nil)
	run(t, o)
	waitEmpty(t, r, o)
	if got := r.handled(1); !slices.Equal(got, span(4, 10)) {
		t.Errorf("recovered %v of conversation 1, want 4..10", got)
	}
	if got := r.handled(2); !slices.Equal(got, []uint64{1}) {
		t.Errorf("recovered %v of conversation 2, want 1", got)
	}
}

// TestFailureKeepsOrderAndRetries: a failing message is retried with
// backoff and nothing after it in its conversation overtakes it, while
// other conversations go on.
func TestFailureKeepsOrderAndRetries(t *testing.T) {
	r := newRig(t, 1, 2)
	var mu sync.Mutex
	fails := 3
	r.fail = func(j Job) error {
		mu.Lock()
		defer mu.Unlock()
		if j.Msg.ConvID == 1 && j.Msg.Seq == 2 && fails > 0 {
			fails--
			return errors.New("injected")
		}
		return nil
	}
	o := newOutbox(Config{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}, r.st, r.handle, nil)
	run(t, o)
	for range 5 {
		o.enqueue(Job{Msg: r.append(t, 1)})
		o.enqueue(Job{Msg: r.append(t, 2)})
	}
	waitEmpty(t, r, o)
	if got := r.handled(1); !slices.Equal(got, span(1, 5)) {
		t.Errorf("conversation 1 fanned out %v, want 1..5 in order", got)
	}
	if got := r.handled(2); !slices.Equal(got, span(1, 5)) {
		t.Errorf("conversation 2 fanned out %v, want 1..5", got)
	}
	if s := o.stats(); s.Failed != 3 || s.Done != 10 {
		t.Errorf("stats %+v, want 3 failures and 10 done", s)
	}
}

// TestBoundedQueueDefersToTheStore: beyond MaxQueued, messages wait in
// the store's outbox and a later scan fans them out.
func TestBoundedQueueDefersToTheStore(t *testing.T) {
	r := newRig(t, 1)
	block := make(chan struct{})
	r.fail = func(j Job) error {
		<-block
		return nil
	}
	o := newOutbox(Config{MaxQueued: 2, Scan: 10 * time.Millisecond}, r.st, r.handle, nil)
	for range 10 {
		o.enqueue(Job{Msg: r.append(t, 1)})
	}
	if d := o.stats().Deferred; d != 8 {
		t.Fatalf("deferred %d, want 8", d)
	}
	run(t, o)
	close(block)
	waitEmpty(t, r, o)
	got := r.handled(1)
	slices.Sort(got)
	if !slices.Equal(slices.Compact(got), span(1, 10)) {
		t.Errorf("fanned out %v, want every seq of 1..10", got)
	}
}

// TestConversationsRunInParallel: a conversation whose fan-out hangs does
// not hold up the others.
func TestConversationsRunInParallel(t *testing.T) {
	r := newRig(t, 1, 2)
	hang := make(chan struct{})
	defer close(hang)
	r.fail = func(j Job) error {
		if j.Msg.ConvID == 1 {
			<-hang
		}
		return nil
	}
	o := newOutbox(Config{Workers: 2}, r.st, r.handle, nil)
	run(t, o)
	o.enqueue(Job{Msg: r.append(t, 1)})
	for range 5 {
		o.enqueue(Job{Msg: r.append(t, 2)})
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(r.handled(2)) < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("conversation 2 stuck behind 1: %v", r.handled(2))
		}
		time.Sleep(5 * time.Millisecond)
	}
}
