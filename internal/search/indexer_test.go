package search_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/search"
	"github.com/parley-im/parley/internal/search/bleve"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/pebble"
	"github.com/parley-im/parley/protocol"
)

// rig is a real Pebble store and a real Bleve index on disk.
type rig struct {
	t     *testing.T
	ctx   context.Context
	st    store.Store
	dir   string
	x     search.Index
	ix    *search.Indexer
	stop  context.CancelFunc
	done  chan struct{}
	msgID uint64
	// wrap and owns shape the next start's indexer (nil: the store as
	// is, every conversation).
	wrap func(search.Store) search.Store
	owns func(uint64) bool
}

func newRig(t *testing.T) *rig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	st, err := pebble.Open(ctx, pebble.Config{Dir: filepath.Join(t.TempDir(), "store")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	r := &rig{t: t, ctx: ctx, st: st, dir: filepath.Join(t.TempDir(), "search")}
	r.start()
	t.Cleanup(r.kill)
	return r
}

// start opens the index and runs an indexer on it.
func (r *rig) start() {
	x, err := bleve.Open(r.dir)
	if err != nil {
		r.t.Fatal(err)
	}
	r.x = x
	var st search.Store = r.st.(search.Store)
	if r.wrap != nil {
		st = r.wrap(st)
	}
	r.ix = search.NewIndexer(search.IndexerOptions{Index: x, Store: st, Batch: 7, Owns: r.owns})
	ctx, cancel := context.WithCancel(r.ctx)
	r.stop, r.done = cancel, make(chan struct{})
	go func() { defer close(r.done); r.ix.Run(ctx) }()
}

// kill stops the indexer and closes the index (what is only noted in
// memory is lost, as in a crash).
func (r *rig) kill() {
	if r.stop == nil {
		return
	}
	r.stop()
	<-r.done
	r.x.Close()
	r.stop = nil
}

func (r *rig) conv(id uint64, e2e bool) store.Conversation {
	c := store.Conversation{ID: id, Kind: store.Group, Name: "g", CreatedAt: 1, E2E: e2e}
	if err := r.st.CreateConversation(r.ctx, c, []store.Member{{ConvID: id, UserID: "alice", Role: store.RoleOwner, JoinSeq: 1}}); err != nil {
		r.t.Fatal(err)
	}
	return c
}

// send appends a message and, when fanned, hands it to the indexer as the
// fan-out would.
func (r *rig) send(c store.Conversation, kind, body string, target uint64, fanned bool) uint64 {
	r.t.Helper()
	r.msgID++
	a := store.Append{Msg: store.Message{ConvID: c.ID, MsgID: r.msgID, Sender: "alice", ClientMsgID: fmt.Sprint("c", r.msgID),
		Kind: kind, Body: body, TargetSeq: target, ServerTime: time.Now().UnixMilli()}}
	if target != 0 {
		a.Check = func(t store.Message) (store.Message, error) {
			if kind == protocol.KindRecall {
				t.Recalled, t.Body = true, ""
			} else {
				t.Body, t.Edited = body, true
			}
			return t, nil
		}
	}
	res, err := r.st.Append(r.ctx, a)
	if err != nil {
		r.t.Fatal(err)
	}
	if fanned {
		if err := r.ix.Fanned(r.ctx, fanout.Fanned{Msg: res.Msg, Conv: c}); err != nil {
			r.t.Fatal(err)
		}
	}
	return res.Msg.Seq
}

func (r *rig) find(text string, convs ...uint64) []uint64 {
	r.t.Helper()
	var ws []search.Window
	for _, c := range convs {
		ws = append(ws, search.Window{ConvID: c, From: 1})
	}
	res, err := r.x.Search(r.ctx, search.Query{Text: text, Windows: ws, Limit: 100})
	if err != nil {
		r.t.Fatal(err)
	}
	var seqs []uint64
	for _, h := range res.Hits {
		seqs = append(seqs, h.Seq)
	}
	slices.Sort(seqs)
	return seqs
}

// settle waits until conv's watermark reaches seq.
func (r *rig) settle(conv, seq uint64) {
	r.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		w, err := r.x.Watermark(r.ctx, conv)
		if err != nil {
			r.t.Fatal(err)
		}
		if w >= seq {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("conversation %d: watermark %d, want %d", conv, w, seq)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestIndexerEditsRecallsE2E(t *testing.T) {
	r := newRig(t)
	plain, secret := r.conv(1, false), r.conv(2, true)
	s1 := r.send(plain, protocol.KindText, "明天的会议在北京", 0, true)
	s2 := r.send(plain, protocol.KindText, "lunch at noon", 0, true)
	s3 := r.send(plain, protocol.KindText, "to be recalled 撤回", 0, true)
	fileBody := `{"attachment_id":"9","name":"季度报告.pdf","size":10,"media_type":"application/pdf","sha256":"00","caption":"the quarterly numbers"}`
	s4 := r.send(plain, protocol.KindFile, fileBody, 0, true)
	r.send(secret, protocol.KindText, "CANARY-7f3a9c in an e2e conversation", 0, true)
	r.settle(1, s4)
	if got := r.find("北京", 1); !slices.Equal(got, []uint64{s1}) {
		t.Fatalf("北京: %v", got)
	}
	if got := r.find("季度报告", 1); !slices.Equal(got, []uint64{s4}) {
		t.Fatalf("file name: %v", got)
	}
	if got := r.find("quarterly numbers", 1); !slices.Equal(got, []uint64{s4}) {
		t.Fatalf("file caption: %v", got)
	}
	// An edit replaces the text, a recall removes it.
	e := r.send(plain, protocol.KindEdit, "dinner at eight", s2, true)
	rc := r.send(plain, protocol.KindRecall, "", s3, true)
	r.settle(1, max(e, rc))
	if got := r.find("lunch", 1); len(got) != 0 {
		t.Fatalf("edited text still found: %v", got)
	}
	if got := r.find("dinner at eight", 1); !slices.Equal(got, []uint64{s2}) {
		t.Fatalf("edit: %v", got)
	}
	if got := r.find("撤回", 1); len(got) != 0 {
		t.Fatalf("recalled text found: %v", got)
	}
	// The E2E conversation: nothing indexed, no watermark.
	if n, err := r.x.Count(r.ctx, 2); err != nil || n != 0 {
		t.Fatalf("e2e conversation: %d documents %v", n, err)
	}
	if got := r.find("CANARY", 1, 2); len(got) != 0 {
		t.Fatalf("e2e text found: %v", got)
	}
	if n, err := r.x.Count(r.ctx, 1); err != nil || n != 3 {
		t.Fatalf("plain conversation: %d documents %v, want 3", n, err)
	}
	// A reindex of everything changes nothing and skips the E2E one.
	var last search.ReindexProgress
	p, err := r.ix.Reindex(r.ctx, 0, func(p search.ReindexProgress) { last = p })
	if err != nil || p.Conversations != 1 || last != p || p.Messages != 6 {
		t.Fatalf("reindex: %+v %+v %v", p, last, err)
	}
	if got := r.find("dinner", 1); !slices.Equal(got, []uint64{s2}) {
		t.Fatalf("after reindex: %v", got)
	}
	if n, _ := r.x.Count(r.ctx, 2); n != 0 {
		t.Fatal("reindex indexed the e2e conversation")
	}
	if _, err := r.ix.Reindex(r.ctx, 2, nil); err == nil {
		t.Fatal("reindex of an e2e conversation: no error")
	}
}

// TestIndexerCatchUp: messages stored while no indexer ran, and messages
// whose note was lost with the process, are indexed after a restart from
// the watermarks.
func TestIndexerCatchUp(t *testing.T) {
	r := newRig(t)
	a, b := r.conv(1, false), r.conv(2, false)
	s := r.send(a, protocol.KindText, "before the crash", 0, true)
	r.settle(1, s)
	r.kill()
	// Stored, fanned out, never indexed: the process died first.
	var last uint64
	for i := range 20 {
		last = r.send(a, protocol.KindText, fmt.Sprintf("during the outage %d 停机", i), 0, false)
	}
	bs := r.send(b, protocol.KindText, "a new conversation 新会话", 0, false)
	r.start()
	r.settle(1, last)
	r.settle(2, bs)
	if got := r.find("停机", 1); len(got) != 20 {
		t.Fatalf("caught up %d of 20", len(got))
	}
	if got := r.find("新会话", 2); !slices.Equal(got, []uint64{bs}) {
		t.Fatalf("new conversation: %v", got)
	}
	if got := r.find("before the crash", 1); !slices.Equal(got, []uint64{s}) {
		t.Fatalf("before: %v", got)
	}
	if !r.ix.CaughtUp() || r.ix.Pending() != 0 {
		t.Fatalf("caught up %v, pending %d", r.ix.CaughtUp(), r.ix.Pending())
	}
}

// TestIndexerRescan: messages stored and never noted (their fan-out ran
// on a process that died before indexing) are indexed after Rescan, as a
// cluster process does when it takes a partition over.
func TestIndexerRescan(t *testing.T) {
	r := newRig(t)
	a := r.conv(1, false)
	first := r.send(a, protocol.KindText, "noted 记录", 0, true)
	r.settle(1, first)
	var last uint64
	for i := range 5 {
		last = r.send(a, protocol.KindText, fmt.Sprintf("never noted %d 遗漏", i), 0, false)
	}
	// Nothing noted: nothing indexed, however long the loop runs.
	time.Sleep(200 * time.Millisecond)
	if w, err := r.x.Watermark(r.ctx, 1); err != nil || w != first {
		t.Fatalf("watermark before Rescan: %d %v, want %d", w, err, first)
	}
	r.ix.Rescan()
	r.settle(1, last)
	if got := r.find("遗漏", 1); len(got) != 5 {
		t.Fatalf("after Rescan: %v", got)
	}
}

// recallOnRead is a store that, when the indexer first reads seq target
// alone (an edit's target), recalls it first: the recall lands between
// the round's page read, which saw the message as text, and the target's
// read.
type recallOnRead struct {
	search.Store
	r      *rig
	c      store.Conversation
	target uint64
	done   bool
}

// ConvIDs keeps the wrapped store's listing (the catch-up's).
func (s *recallOnRead) ConvIDs(ctx context.Context, after uint64, limit int) ([]uint64, error) {
	return s.Store.(store.ConvLister).ConvIDs(ctx, after, limit)
}

func (s *recallOnRead) Messages(ctx context.Context, conv, from, to uint64, limit int) ([]store.Message, error) {
	if from == s.target && to == s.target && !s.done {
		s.done = true
		s.r.send(s.c, protocol.KindRecall, "", s.target, false)
	}
	return s.Store.Messages(ctx, conv, from, to, limit)
}

// TestIndexerRecallWithinRound: one round reads a message as text and
// then, through an edit of it, finds it recalled: the batch deletes it
// (the recall is never noted here, so nothing later would).
func TestIndexerRecallWithinRound(t *testing.T) {
	r := newRig(t)
	r.kill()
	c := r.conv(1, false)
	s := r.send(c, protocol.KindText, "soon recalled 撤回", 0, false)
	e := r.send(c, protocol.KindEdit, "edited then recalled 撤回", s, false)
	r.wrap = func(st search.Store) search.Store { return &recallOnRead{Store: st, r: r, c: c, target: s} }
	r.start()
	r.settle(1, e)
	if got := r.find("撤回", 1); len(got) != 0 {
		t.Fatalf("a recalled message found: %v", got)
	}
	if n, err := r.x.Count(r.ctx, 1); err != nil || n != 0 {
		t.Fatalf("%d documents (%v), want 0", n, err)
	}
}

// TestIndexerOwns: the catch-up and the rounds skip conversations the
// process does not own (another cluster process indexes them); Reindex
// covers them all.
func TestIndexerOwns(t *testing.T) {
	r := newRig(t)
	r.kill()
	mine, theirs := r.conv(1, false), r.conv(2, false)
	m := r.send(mine, protocol.KindText, "mine 我的", 0, false)
	o := r.send(theirs, protocol.KindText, "theirs 他们的", 0, false)
	r.owns = func(conv uint64) bool { return conv == mine.ID }
	r.start()
	r.settle(1, m)
	// Noted too (a fan-out's note racing a partition's loss): skipped.
	r.send(theirs, protocol.KindText, "theirs again", 0, true)
	r.send(mine, protocol.KindText, "mine again", 0, true)
	r.settle(1, m+1)
	if w, err := r.x.Watermark(r.ctx, 2); err != nil || w != 0 {
		t.Fatalf("a conversation not owned: watermark %d (%v)", w, err)
	}
	if _, err := r.ix.Reindex(r.ctx, 0, nil); err != nil {
		t.Fatal(err)
	}
	if got := r.find("他们的", 2); !slices.Equal(got, []uint64{o}) {
		t.Fatalf("after Reindex: %v", got)
	}
}
