package pebble

import (
	"context"
	"errors"
	"reflect"
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

// open releases held fsyncs; it is a no-op on an open gate.
func (g *walGate) open() {
	g.mu.Lock()
	if g.blocked != nil {
		close(g.blocked)
		g.blocked = nil
	}
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
	t.Cleanup(func() {
		gate.open()
		_ = s.Close()
	})

	err := s.CreateConversation(ctx, store.Conversation{ID: 1, Kind: store.Group}, []store.Member{{UserID: "alice"}})
	if err != nil {
		t.Fatalf("CreateConversation: %v", err)
	}
	msg := func(id uint64, cmid, body string) store.Message {
		return store.Message{ConvID: 1, MsgID: id, Sender: "alice", ClientMsgID: cmid, Kind: "text", Body: body, ServerTime: 1}
	}
	first, err := s.Append(ctx, store.Append{Msg: msg(1, "a", "first")})
	if err != nil {
		t.Fatalf("Append: %v", err)
	}
	if err := s.UpdateRows(ctx, 1, 1, []string{"alice"}, false); err != nil {
		t.Fatalf("UpdateRows: %v", err)
	}

	gate.close()
	type result struct {
		res store.AppendResult
		err error
	}
	second, dup, edit := make(chan result, 1), make(chan result, 1), make(chan result, 1)
	go func() {
		r, err := s.Append(ctx, store.Append{Msg: msg(2, "b", "second")})
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
	if err != nil || len(msgs) != 1 || !reflect.DeepEqual(msgs[0], first.Msg) {
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
	err = s.UpdateRows(ctx, 1, 2, []string{"alice"}, false)
	wantErrIs(t, "UpdateRows of a seq not yet durable", err, store.ErrNotFound)
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
	if rd.err != nil || !rd.res.Duplicate || !reflect.DeepEqual(rd.res.Msg, r2.res.Msg) {
		t.Errorf("duplicate = %+v, %v; want Duplicate of %+v", rd.res, rd.err, r2.res.Msg)
	}
	if re.err != nil || re.res.Msg.Seq != 3 {
		t.Fatalf("edit = %+v, %v; want seq 3", re.res, re.err)
	}
	msgs, err = s.Messages(ctx, 1, 1, 10, 10)
	if err != nil || len(msgs) != 3 || msgs[0].Body != "edited" || !msgs[0].Edited {
		t.Errorf("Messages after fsync = %+v, %v; want 1..3 with seq 1 edited", msgs, err)
	}
	if len(s.convs.Peek(1).ov.m) != 0 {
		t.Errorf("pre-edit images left after the edit became durable: %v", s.convs.Peek(1).ov.m)
	}
}

func seqsOf(msgs []store.Message) []uint64 {
	out := make([]uint64, len(msgs))
	for i, m := range msgs {
		out[i] = m.Seq
	}
	return out
}

func wantErrIs(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: got error %v, want %v", what, err, want)
	}
}

// gatedStore opens a store on a crashable in-memory FS whose WAL fsyncs
// the returned gate can hold, with conversation 1 (alice and bob).
func gatedStore(t *testing.T) (*Store, *walGate, *vfs.MemFS) {
	t.Helper()
	mem := vfs.NewCrashableMem()
	gate := &walGate{}
	s := openT(t, Config{Dir: "db", FS: errorfs.Wrap(mem, errorfs.InjectorFunc(gate.inject))})
	// A failing test must not leave Close waiting for a held fsync.
	t.Cleanup(func() {
		gate.open()
		_ = s.Close()
	})
	err := s.CreateConversation(context.Background(), store.Conversation{ID: 1, Kind: store.Group},
		[]store.Member{{UserID: "alice"}, {UserID: "bob"}})
	if err != nil {
		t.Fatalf("CreateConversation: %v", err)
	}
	return s, gate, mem
}

// crashOpen opens what a crash would leave of mem right now: only the data
// that was synced.
func crashOpen(t *testing.T, mem *vfs.MemFS) *Store {
	t.Helper()
	return openT(t, Config{Dir: "db", FS: mem.CrashClone(vfs.CrashCloneCfg{})})
}

func stateMsg(id uint64, body string) store.Message {
	return store.Message{ConvID: 1, MsgID: id, Sender: "alice", Kind: "state", CoalesceKey: "k", Body: body, ServerTime: 1}
}

// TestCoalesceUnsyncedDoesNotSupersede holds the fsync of a newer state and
// checks that the older, durable state keeps its body until the newer one
// is durable: a crash in between leaves the older one as the state.
func TestCoalesceUnsyncedDoesNotSupersede(t *testing.T) {
	ctx := context.Background()
	s, gate, mem := gatedStore(t)
	first, err := s.Append(ctx, store.Append{Msg: stateMsg(1, "100 left")})
	if err != nil {
		t.Fatalf("Append: %v", err)
	}

	gate.close()
	second := make(chan error, 1)
	go func() {
		_, err := s.Append(ctx, store.Append{Msg: stateMsg(2, "50 left")})
		second <- err
	}()
	waitApplied(t, s, seqKey(1, 2))
	if l, err := s.coalesceLatest(1, "k"); err != nil || l != 2 {
		t.Fatalf("K row while the fsync is held = %d, %v; want 2 (applied)", l, err)
	}
	only := func(what string, got []store.Message, err error) {
		t.Helper()
		if err != nil || len(got) != 1 || !reflect.DeepEqual(got[0], first.Msg) {
			t.Errorf("%s = %+v, %v; want only the durable state %+v with its body", what, got, err, first.Msg)
		}
	}
	msgs, err := s.Messages(ctx, 1, 1, 10, 10)
	only("Messages before fsync", msgs, err)
	msgs, err = s.Latest(ctx, 1, 0, 0, 10)
	only("Latest before fsync", msgs, err)

	crashed := crashOpen(t, mem)
	msgs, err = crashed.Messages(ctx, 1, 1, 10, 10)
	only("Messages after a crash", msgs, err)
	if _, err := crashed.Append(ctx, store.Append{Msg: stateMsg(3, "75 left")}); err != nil {
		t.Fatalf("Append after crash: %v", err)
	}
	msgs, err = crashed.Messages(ctx, 1, 1, 10, 10)
	if err != nil || len(msgs) != 2 || !msgs[0].Superseded || msgs[0].Body != "" || msgs[1].Body != "75 left" {
		t.Errorf("after a crash and a new state: Messages = %+v, %v; want seq 1 superseded by seq 2 (75 left)", msgs, err)
	}
	if err := crashed.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	gate.open()
	if err := <-second; err != nil {
		t.Fatalf("second Append: %v", err)
	}
	msgs, err = s.Messages(ctx, 1, 1, 10, 10)
	if err != nil || len(msgs) != 2 || !msgs[0].Superseded || msgs[0].Body != "" || msgs[0].MsgID != 1 ||
		msgs[1].Superseded || msgs[1].Body != "50 left" {
		t.Errorf("Messages after fsync = %+v, %v; want seq 1 superseded (no body), seq 2 with its body", msgs, err)
	}
	if n := len(s.convs.Peek(1).ov.keys); n != 0 {
		t.Errorf("%d coalesce images left after the append became durable", n)
	}
}

// TestUpdateRowsWaitsForSync holds the WAL fsync and checks that UpdateRows
// returns only once its rows are durable, also when a concurrent call
// already applied the same rows and this one has nothing to write.
func TestUpdateRowsWaitsForSync(t *testing.T) {
	ctx := context.Background()
	s, gate, mem := gatedStore(t)
	if _, err := s.Append(ctx, store.Append{Msg: stateMsg(1, "x")}); err != nil {
		t.Fatalf("Append: %v", err)
	}
	gate.close()
	done := make(chan error, 2)
	update := func() { done <- s.UpdateRows(ctx, 1, 1, []string{"alice", "bob"}, true) }
	go update()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, _, err := s.convRow("bob", 1)
		if err != nil {
			t.Fatalf("convRow: %v", err)
		}
		if r.LastSeq == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("rows never applied")
		}
		time.Sleep(time.Millisecond)
	}
	go update() // finds the rows raised already
	select {
	case err := <-done:
		t.Fatalf("UpdateRows returned before the fsync: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	crashed := crashOpen(t, mem)
	rows, err := crashed.UserConversations(ctx, "bob")
	if err != nil || len(rows) != 1 || rows[0].LastSeq != 0 || rows[0].MentionSeq != 0 {
		t.Errorf("rows after a crash before the fsync = %+v, %v; want LastSeq 0, MentionSeq 0", rows, err)
	}
	if err := crashed.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	gate.open()
	for range 2 {
		if err := <-done; err != nil {
			t.Errorf("UpdateRows: %v", err)
		}
	}
	crashed = crashOpen(t, mem)
	defer crashed.Close()
	rows, err = crashed.UserConversations(ctx, "bob")
	if err != nil || len(rows) != 1 || rows[0].LastSeq != 1 || rows[0].MentionSeq != 1 {
		t.Errorf("rows after a crash once UpdateRows returned = %+v, %v; want LastSeq 1, MentionSeq 1", rows, err)
	}
}

// TestAttachmentsSurviveCrash: every attachment write has returned only
// once synced, so what a crash leaves right after it has the records,
// their listings and the owners' usage as the calls left them.
func TestAttachmentsSurviveCrash(t *testing.T) {
	ctx := context.Background()
	s, _, mem := gatedStore(t)
	a := store.Attachment{ID: 9, Owner: "alice", ConvID: 1, Size: 40, State: store.AttachUploading,
		CreatedAt: 5, ExpiresAt: 100, MediaType: "image/png", Name: "a.png"}
	b := a
	b.ID, b.Size = 10, 2
	for _, r := range []store.Attachment{a, b} {
		if err := s.CreateAttachment(ctx, r, 1000, 5); err != nil {
			t.Fatal(err)
		}
	}
	next := a
	next.State, next.Received, next.Thumb = store.AttachComplete, 1, store.ThumbPending
	if err := s.UpdateAttachment(ctx, next, a); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteAttachment(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	c := crashOpen(t, mem)
	defer c.Close()
	if got, err := c.Attachment(ctx, a.ID); err != nil || !reflect.DeepEqual(got, next) {
		t.Fatalf("after a crash: %+v, %v; want %+v", got, err, next)
	}
	if _, err := c.Attachment(ctx, b.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a deleted record after a crash: %v", err)
	}
	if u, err := c.AttachmentUsage(ctx, "alice"); err != nil || u != (store.Usage{Bytes: 40}) {
		t.Fatalf("usage after a crash = %+v, %v; want 40 bytes, none in flight", u, err)
	}
	if due, err := c.DueAttachments(ctx, 6, 10); err != nil || len(due) != 1 || due[0].ID != a.ID {
		t.Fatalf("due after a crash = %+v, %v; want record 9 (thumbnail pending)", due, err)
	}
	if list, err := c.ConvAttachments(ctx, 1, 0, 10); err != nil || len(list) != 1 || list[0].ID != a.ID {
		t.Fatalf("listing after a crash = %+v, %v; want record 9", list, err)
	}
}
