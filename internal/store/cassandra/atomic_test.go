package cassandra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/parley-im/parley/internal/store"
)

// crashAt makes s die (its append returns an error, nothing more is
// written) at the named point of its next append.
func crashAt(s *Store, point string) {
	f := func(p string) error {
		if p == point {
			return fmt.Errorf("injected crash at %s", p)
		}
		return nil
	}
	s.faultHook.Store(&f)
}

// atomicEnv is a conversation with one text message (seq 1) and one
// state message of key "k" (seq 2), on owned or transactional appends.
type atomicEnv struct {
	cfg    Config
	leases *leaseTable
	ids    atomic.Uint64
}

func (e *atomicEnv) open(t *testing.T) *Store {
	cfg := e.cfg
	if e.leases != nil {
		cfg.Lease = e.leases.grant() // a new process takes over
	}
	return openT(t, cfg)
}

func (e *atomicEnv) msg(kind, body string) store.Message {
	id := e.ids.Add(1)
	return store.Message{ConvID: 1, MsgID: id, Sender: "alice", ClientMsgID: fmt.Sprint("c", id),
		Kind: kind, Body: body, ServerTime: baseTime + int64(id)}
}

func (e *atomicEnv) edit(s *Store, body string) (store.AppendResult, error) {
	m := e.msg("edit", body)
	m.TargetSeq = 1
	return s.Append(context.Background(), store.Append{Msg: m, Check: func(t store.Message) (store.Message, error) {
		t.Body, t.Edited = body, true
		return t, nil
	}})
}

func (e *atomicEnv) state(s *Store, body string) (store.AppendResult, error) {
	m := e.msg("state", body)
	m.CoalesceKey = "k"
	return s.Append(context.Background(), store.Append{Msg: m})
}

func newAtomicEnv(t *testing.T, owned bool) (*atomicEnv, *Store) {
	e := &atomicEnv{cfg: fresh(t)}
	if owned {
		e.leases = &leaseTable{}
	}
	s := e.open(t)
	ctx := context.Background()
	if err := s.CreateConversation(ctx, store.Conversation{ID: 1, Kind: store.Group, CreatedAt: baseTime},
		[]store.Member{{UserID: "alice"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, store.Append{Msg: e.msg("text", "v1")}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.state(s, "s1"); err != nil {
		t.Fatal(err)
	}
	return e, s
}

// history reads the conversation as a reader process would.
func history(t *testing.T, s *Store) []store.Message {
	t.Helper()
	msgs, err := s.Messages(context.Background(), 1, 1, 100, 100)
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

// checkEdit fails unless the history shows the edit to v2 all or
// nothing: the event at seq 3 and the target edited, or neither. It
// returns whether the edit shows.
func checkEdit(t *testing.T, msgs []store.Message) bool {
	t.Helper()
	var event bool
	for _, m := range msgs {
		if m.TargetSeq == 1 && m.Kind == "edit" && m.Body == "v2" {
			event = true
		}
	}
	target := msgs[0]
	edited := target.Body == "v2" && target.Edited
	if !edited && (target.Body != "v1" || target.Edited) {
		t.Fatalf("target is %q (edited %v), want v1 or v2", target.Body, target.Edited)
	}
	if event != edited {
		t.Fatalf("half an edit: event stored %v, target edited %v (history %+v)", event, edited, msgs)
	}
	return event
}

// pendingOf returns the pending edit on seq 1's row (nil: none).
func pendingOf(t *testing.T, s *Store) *pendingEdit {
	t.Helper()
	ctx := context.Background()
	ss, err := s.slots(ctx, 1, 1, 1, 1)
	if err != nil || len(ss) != 1 {
		t.Fatalf("slot 1: %v %v", ss, err)
	}
	r, err := s.readRow(ctx, 1, ss[0].bucket, ss[0].msgID)
	if err != nil {
		t.Fatal(err)
	}
	if r.rev == nil || len(r.edit) == 0 {
		return nil
	}
	var rec editRecord
	if err := json.Unmarshal(r.edit, &rec); err != nil {
		t.Fatal(err)
	}
	return rec.Pending
}

// TestEditAllOrNothing: an edit's process dies at each point between
// its writes. Another process reads the conversation at once: it sees
// the edit's event and its effect on the target together or neither.
// Then a write of the new owner sweeps: nothing is left pending, and a
// later edit works from what readers saw.
func TestEditAllOrNothing(t *testing.T) {
	for _, owned := range []bool{true, false} {
		for _, point := range []string{"pending", "slots", "promote"} {
			name := fmt.Sprintf("owned=%v/%s", owned, point)
			t.Run(name, func(t *testing.T) {
				e, a := newAtomicEnv(t, owned)
				crashAt(a, point)
				if _, err := e.edit(a, "v2"); err == nil {
					t.Fatal("the edit succeeded through an injected crash")
				}
				b := e.open(t) // another process, the next owner
				shown := checkEdit(t, history(t, b))
				if want := point != "pending"; shown != want {
					t.Fatalf("edit shown %v after a crash at %s, want %v", shown, point, want)
				}
				if !owned && point == "pending" {
					// The transactional writer might still claim: a
					// concurrent edit is refused until pendingAge.
					if _, err := e.edit(b, "v3"); !errors.Is(err, store.ErrConflict) {
						t.Fatalf("edit over a young pending one = %v, want ErrConflict", err)
					}
					return
				}
				// The new owner's first write loads the top and sweeps.
				if _, err := e.state(b, "s2"); err != nil {
					t.Fatal(err)
				}
				if owned && point != "pending" {
					if p := pendingOf(t, b); p != nil {
						t.Fatalf("edit still pending after the sweep: %+v", p)
					}
				}
				checkEdit(t, history(t, b))
				want := "v1"
				if shown {
					want = "v2"
				}
				var seen string
				m := e.msg("edit", "v3")
				m.TargetSeq = 1
				if _, err := b.Append(context.Background(), store.Append{Msg: m, Check: func(t store.Message) (store.Message, error) {
					seen = t.Body
					t.Body, t.Edited = "v3", true
					return t, nil
				}}); err != nil {
					t.Fatal(err)
				}
				if seen != want {
					t.Fatalf("the next edit saw %q, want %q", seen, want)
				}
				if p := pendingOf(t, b); p != nil {
					t.Fatalf("edit pending after a completed edit: %+v", p)
				}
				if got := history(t, b)[0]; got.Body != "v3" || !got.Edited {
					t.Fatalf("target %+v after the next edit, want v3", got)
				}
			})
		}
	}
}

// TestCoalesceSwept: a state message's process dies after its slot,
// before its coalesce record. Readers of a page holding both states see
// the older one superseded at once; a reader of the older one alone sees
// it superseded once the new owner's first write has swept.
func TestCoalesceSwept(t *testing.T) {
	e, a := newAtomicEnv(t, true)
	crashAt(a, "promote") // after the slots (and the lease check)
	if _, err := e.state(a, "s2"); err == nil {
		t.Fatal("the append succeeded through an injected crash")
	}
	b := e.open(t)
	msgs := history(t, b)
	if len(msgs) != 3 || !msgs[1].Superseded || msgs[2].Superseded || msgs[2].Body != "s2" {
		t.Fatalf("history %+v, want s1 superseded by s2 on one page", msgs)
	}
	if _, err := b.Append(context.Background(), store.Append{Msg: e.msg("text", "after")}); err != nil {
		t.Fatal(err)
	}
	only, err := b.Messages(context.Background(), 1, 2, 2, 1)
	if err != nil || len(only) != 1 || !only[0].Superseded {
		t.Fatalf("seq 2 alone = %+v, %v; want superseded after the sweep", only, err)
	}
}

// failOnce makes the next pass of s through point fail (not a crash: the
// process goes on).
func failOnce(s *Store, point string) {
	var done atomic.Bool
	f := func(p string) error {
		if p == point && done.CompareAndSwap(false, true) {
			return fmt.Errorf("injected failure at %s", p)
		}
		return nil
	}
	s.faultHook.Store(&f)
}

// TestOrphanBodiesDropped: the bodies an owner wrote for nothing — a
// duplicate's, a batch whose slot write failed — are deleted (the latter
// at the next load, after the fence), while the body of a batch whose
// write landed but whose answer was lost stays readable.
func TestOrphanBodiesDropped(t *testing.T) {
	e, s := newAtomicEnv(t, true)
	ctx := context.Background()
	hasBody := func(m store.Message) bool {
		t.Helper()
		_, err := s.readRow(ctx, 1, s.bucketOf(m.ServerTime), m.MsgID)
		if err != nil && !errors.Is(err, gocql.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	orig := e.msg("text", "once")
	if _, err := s.Append(ctx, store.Append{Msg: orig}); err != nil {
		t.Fatal(err)
	}
	retry := e.msg("text", "once")
	retry.ClientMsgID = orig.ClientMsgID
	res, err := s.Append(ctx, store.Append{Msg: retry})
	if err != nil || !res.Duplicate || res.Msg.MsgID != orig.MsgID {
		t.Fatalf("retry = %+v, %v; want the original as a duplicate", res, err)
	}
	if hasBody(retry) || !hasBody(orig) {
		t.Fatalf("bodies: retry's %v (want deleted), original's %v (want kept)", hasBody(retry), hasBody(orig))
	}

	lost := e.msg("text", "lost")
	failOnce(s, "slots.lost")
	if _, err := s.Append(ctx, store.Append{Msg: lost}); err == nil {
		t.Fatal("append through a failed slot write succeeded")
	}
	if !hasBody(lost) {
		t.Fatal("the body should be written before the slot")
	}
	landed := e.msg("text", "landed")
	failOnce(s, "slots.unknown")
	if _, err := s.Append(ctx, store.Append{Msg: landed}); err == nil {
		t.Fatal("append through a lost answer succeeded")
	}
	after, err := s.Append(ctx, store.Append{Msg: e.msg("text", "after")})
	if err != nil {
		t.Fatal(err)
	}
	if hasBody(lost) {
		t.Fatal("the body of a failed slot write is still there after the next load")
	}
	if !hasBody(landed) {
		t.Fatal("the body of a stored message was deleted")
	}
	msgs := history(t, s)
	if n := len(msgs); uint64(n) != after.Msg.Seq {
		t.Fatalf("history has %d messages up to seq %d", n, after.Msg.Seq)
	}
	var bodies []string
	for _, m := range msgs {
		bodies = append(bodies, m.Body)
	}
	if msgs[len(msgs)-2].Body != "landed" || msgs[len(msgs)-1].Body != "after" {
		t.Fatalf("history ends %q, want ... landed, after", bodies)
	}
}
