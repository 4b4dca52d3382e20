package pebble

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/parley-im/parley/internal/store"
)

// walGate blocks WAL fsyncs while closed, so a test can hold batches in the
// applied-but-not-durable window that pebble makes readable.
type walGate struct {
	mu      sync.Mutex
	blocked chan struct{} // nil: open
}

func (g *walGate) close() {
	g.mu.Lock()
	g.blocked = make(chan struct{})
	g.mu.Unlock()
}

func (g *walGate) open() {
	g.mu.Lock()
	close(g.blocked)
	g.blocked = nil
	g.mu.Unlock()
}

func (g *walGate) inject(op errorfs.Op) error {
	switch op.Kind {
	case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
	default:
		return nil
	}
	if !strings.HasSuffix(op.Path, ".log") {
		return nil
	}
	g.mu.Lock()
	ch := g.blocked
	g.mu.Unlock()
	if ch != nil {
		<-ch
	}
	return nil
}

// waitApplied polls pebble directly until key is readable.
func waitApplied(t *testing.T, s *Store, key []byte) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if ok, err := s.exists(key); err != nil {
			t.Fatalf("exists: %v", err)
		} else if ok {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("key %x never applied", key)
}

// TestUnsyncedIsInvisible holds the WAL fsync and checks that nothing the
// store has applied but not synced is visible through the interface: not
// the message, not the last_seq, not an edit of an older message, and a
// duplicate waits for the original's fsync.
func TestUnsyncedIsInvisible(t *testing.T) {
	ctx := context.Background()
	gate := &walGate{}
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(gate.inject))
	s := openT(t, Config{Dir: "db", FS: fs})
	defer s.Close()

	err := s.CreateConversation(ctx, store.Conversation{ID: 1, Kind: store.Group}, []store.Member{{UserID: "alice"}})
	if err != nil {
		t.Fatalf("CreateConversation: %v", err)
	}
	msg := func(id uint64, cmid, body string) store.Message {
		return store.Message{ConvID: 1, MsgID: id, Sender: "alice", ClientMsgID: cmid, Kind: "text", Body: body, ServerTime: 1}
	}
	first, err := s.Append(ctx, store.Append{Msg: msg(1, "a", "first"), Rows: []string{"alice"}})
	if err != nil {
		t.Fatalf("Append: %v", err)
	}

	gate.close()
	type result struct {
		res store.AppendResult
		err error
	}
	second, dup, edit := make(chan result, 1), make(chan result, 1), make(chan result, 1)
	go func() {
		r, err := s.Append(ctx, store.Append{Msg: msg(2, "b", "second"), Rows: []string{"alice"}})
		second <- result{r, err}
	}()
	waitApplied(t, s, seqKey(1, 2))
	go func() {
		r, err := s.Append(ctx, store.Append{Msg: msg(3, "b", "second, retried")})
		dup <- result{r, err}
	}()
	go func() {
		ev := msg(4, "", "")
		ev.Kind, ev.TargetSeq = "edit", 1
		r, err := s.Append(ctx, store.Append{Msg: ev, Check: func(m store.Message) (store.Message, error) {
			m.Body, m.Edited = "edited", true
			return m, nil
		}})
		edit <- result{r, err}
	}()
	waitApplied(t, s, seqKey(1, 3))

	msgs, err := s.Messages(ctx, 1, 1, 10, 10)
	if err != nil || len(msgs) != 1 || msgs[0] != first.Msg {
		t.Errorf("Messages before fsync = %+v, %v; want only the durable %+v", msgs, err, first.Msg)
	}
	if latest, err := s.Latest(ctx, 1, 0, 0, 10); err != nil || len(latest) != 1 {
		t.Errorf("Latest before fsync = %v, %v; want seq 1 only", seqsOf(latest), err)
	}
	if c, err := s.Conversation(ctx, 1); err != nil || c.LastSeq != 1 {
		t.Errorf("Conversation.LastSeq before fsync = %d, %v; want 1", c.LastSeq, err)
	}
	if rows, err := s.UserConversations(ctx, "alice"); err != nil || len(rows) != 1 || rows[0].LastSeq != 1 {
		t.Errorf("UserConversations before fsync = %+v, %v; want LastSeq 1", rows, err)
	}
	select {
	case r := <-second:
		t.Fatalf("Append returned before its fsync: %+v, %v", r.res, r.err)
	case r := <-dup:
		t.Fatalf("duplicate returned before the original's fsync: %+v, %v", r.res, r.err)
	case <-time.After(50 * time.Millisecond):
	}

	gate.open()
	r2, rd, re := <-second, <-dup, <-edit
	if r2.err != nil || r2.res.Msg.Seq != 2 || r2.res.Duplicate {
		t.Fatalf("second = %+v, %v; want seq 2", r2.res, r2.err)
	}
	if rd.err != nil || !rd.res.Duplicate || rd.res.Msg != r2.res.Msg {
		t.Errorf("duplicate = %+v, %v; want Duplicate of %+v", rd.res, rd.err, r2.res.Msg)
	}
	if re.err != nil || re.res.Msg.Seq != 3 {
		t.Fatalf("edit = %+v, %v; want seq 3", re.res, re.err)
	}
	msgs, err = s.Messages(ctx, 1, 1, 10, 10)
	if err != nil || len(msgs) != 3 || msgs[0].Body != "edited" || !msgs[0].Edited {
		t.Errorf("Messages after fsync = %+v, %v; want 1..3 with seq 1 edited", msgs, err)
	}
	if len(s.convs.m[1].ov.m) != 0 {
		t.Errorf("pre-edit images left after the edit became durable: %v", s.convs.m[1].ov.m)
	}
}

func seqsOf(msgs []store.Message) []uint64 {
	out := make([]uint64, len(msgs))
	for i, m := range msgs {
		out[i] = m.Seq
	}
	return out
}
