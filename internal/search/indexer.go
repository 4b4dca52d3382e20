package search

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// Store is what the indexer reads: messages and conversations, and every
// conversation's id (the catch-up and a reindex of everything), which a
// Store lists as a store.ConvLister or a ConvScanner.
type Store interface {
	Conversation(ctx context.Context, id uint64) (store.Conversation, error)
	Messages(ctx context.Context, convID, from, to uint64, limit int) ([]store.Message, error)
}

// ConvScanner is a store that lists every conversation id once, in no
// particular order (a cluster store's table scan).
type ConvScanner interface {
	ScanConvIDs(ctx context.Context, fn func(ids []uint64) error) error
}

// ErrNoConvList: the store lists no conversations.
var ErrNoConvList = errors.New("search: the store lists no conversations")

// TextOf is the searchable text of a stored message and whether it has
// one: a text message's body, a file message's name and caption (its
// composed body, protocol.FileBody). Edits, recalls, events and state
// updates have none; a recalled message has none.
func TextOf(m store.Message) (string, bool) {
	if m.Recalled {
		return "", false
	}
	switch m.Kind {
	case protocol.KindText:
		return m.Body, m.Body != ""
	case protocol.KindFile:
		var fb protocol.FileBody
		if json.Unmarshal([]byte(m.Body), &fb) != nil {
			return "", false
		}
		t := fb.Name
		if fb.Caption != "" {
			t += "\n" + fb.Caption
		}
		return t, t != ""
	}
	return "", false
}

// IndexerObserver receives the indexer's events (metrics); nil fields are
// skipped.
type IndexerObserver struct {
	// Indexed is called per message taken into the index with its lag:
	// from the message's server time to the batch's Apply returning (the
	// message searchable).
	Indexed func(lag time.Duration)
	// Failed is called per failed round (the engine or the store failed).
	Failed func()
}

// IndexerOptions of NewIndexer.
type IndexerOptions struct {
	Index    Index
	Store    Store
	Logger   *slog.Logger
	Observer IndexerObserver
	// Batch is the most messages one Apply writes (default 2,000).
	Batch int
	// Owns, if set, says whether this process indexes conv: in cluster
	// mode, the owner of its partition, so that two processes never
	// index one conversation at once (one's older image of a message
	// could land after the other's newer one). The catch-up notes only
	// what it owns and a round skips what it no longer does (the next
	// owner's catch-up takes it); Reindex covers everything.
	Owns func(conv uint64) bool
	// Linger is the least time from one round's start to the next
	// (default 100 ms; negative: none): under a steady stream of sends a
	// round takes every conversation noted meanwhile in one pass, instead
	// of a pass per message or two. It bounds the index lag's share of the
	// wait, not the lag: a quiet index starts its round at once.
	Linger time.Duration
}

// Indexer keeps an Index up to date with the store: a fanout.Consumer that
// only notes, in memory, which conversation has a new seq (it never fails
// and never waits for the engine), and a loop (Run) that reads each noted
// conversation's messages above its watermark and applies them with the
// new watermark in one batch. At start the loop compares every
// conversation's last seq with its watermark, so what a crash left noted
// only in memory is indexed all the same; an engine that fails keeps its
// conversations noted and is retried with backoff.
type Indexer struct {
	x      Index
	st     Store
	log    *slog.Logger
	obs    IndexerObserver
	batch  int
	owns   func(uint64) bool
	linger time.Duration

	mu    sync.Mutex
	dirty map[uint64]uint64 // conversation → highest seq noted
	wake  chan struct{}
	// round serialises rounds with Reindex, so a reindex never writes a
	// state older than what a round wrote.
	round sync.Mutex

	caughtUp atomic.Bool
	rescan   atomic.Bool // another catch-up is asked for (Rescan)
	indexed  atomic.Int64
}

var _ fanout.Consumer = (*Indexer)(nil)

// NewIndexer prepares an indexer; Run runs it.
func NewIndexer(o IndexerOptions) *Indexer {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Batch <= 0 {
		o.Batch = 2000
	}
	if o.Owns == nil {
		o.Owns = func(uint64) bool { return true }
	}
	if o.Linger == 0 {
		o.Linger = 100 * time.Millisecond
	}
	return &Indexer{x: o.Index, st: o.Store, log: o.Logger, obs: o.Observer, batch: o.Batch, owns: o.Owns, linger: o.Linger,
		dirty: map[uint64]uint64{}, wake: make(chan struct{}, 1)}
}

// WantsReached: the indexer needs no recipients.
func (ix *Indexer) WantsReached() bool { return false }

// Fanned notes the message's conversation (fanout.Consumer). End-to-end
// encrypted conversations are never noted.
func (ix *Indexer) Fanned(_ context.Context, f fanout.Fanned) error {
	if f.Conv.E2E {
		return nil
	}
	ix.note(f.Msg.ConvID, f.Msg.Seq)
	return nil
}

func (ix *Indexer) note(conv, seq uint64) {
	ix.mu.Lock()
	if seq > ix.dirty[conv] {
		ix.dirty[conv] = seq
	}
	ix.mu.Unlock()
	select {
	case ix.wake <- struct{}{}:
	default:
	}
}

// Pending is the number of conversations noted and not yet indexed.
func (ix *Indexer) Pending() int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return len(ix.dirty)
}

// CaughtUp reports whether the catch-up at start is done.
func (ix *Indexer) CaughtUp() bool { return ix.caughtUp.Load() }

// Indexed is the number of messages taken into the index so far.
func (ix *Indexer) Indexed() int64 { return ix.indexed.Load() }

// Rescan asks Run for another catch-up, coalesced with any asked for
// before it ran: a cluster process that takes over partitions indexes what
// their last owner noted and had not indexed when it stopped.
func (ix *Indexer) Rescan() {
	ix.rescan.Store(true)
	select {
	case ix.wake <- struct{}{}:
	default:
	}
}

// Run indexes until ctx ends: first the catch-up, then each noted
// conversation (and a catch-up again after Rescan).
func (ix *Indexer) Run(ctx context.Context) {
	ix.rescan.Store(false) // the first catch-up covers what was asked before
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		if err := ix.catchUp(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			ix.failed("catch-up", err)
			sleep(ctx, backoff)
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		break
	}
	ix.caughtUp.Store(true)
	backoff = 100 * time.Millisecond
	var last time.Time // the last round's start
	for ctx.Err() == nil {
		if ix.rescan.Swap(false) {
			if err := ix.catchUp(ctx); err != nil {
				if ctx.Err() != nil {
					return
				}
				ix.rescan.Store(true)
				ix.failed("catch-up", err)
				sleep(ctx, backoff)
				backoff = min(2*backoff, 5*time.Second)
				continue
			}
		}
		if ix.Pending() == 0 {
			select {
			case <-ctx.Done():
				return
			case <-ix.wake:
			}
			continue
		}
		if wait := ix.linger - time.Since(last); wait > 0 {
			sleep(ctx, wait)
		}
		last = time.Now()
		ix.mu.Lock()
		todo := ix.dirty
		ix.dirty = map[uint64]uint64{}
		ix.mu.Unlock()
		if len(todo) == 0 {
			continue
		}
		if err := ix.indexRound(ctx, todo); err != nil {
			if ctx.Err() != nil {
				return
			}
			for c, s := range todo {
				ix.note(c, s)
			}
			ix.failed("index", err)
			sleep(ctx, backoff)
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
	}
}

func (ix *Indexer) failed(what string, err error) {
	ix.log.Warn("search index "+what+" failed; retrying", "err", err)
	if ix.obs.Failed != nil {
		ix.obs.Failed()
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// catchUp notes every plain conversation it owns whose last seq is above
// its watermark.
func (ix *Indexer) catchUp(ctx context.Context) error {
	return ix.eachConv(ctx, ix.owns, func(c store.Conversation) error {
		w, err := ix.x.Watermark(ctx, c.ID)
		if err != nil {
			return err
		}
		if c.LastSeq > w {
			ix.note(c.ID, c.LastSeq)
		}
		return nil
	})
}

// eachConv calls fn for every plain conversation whose id passes keep
// (nil: all).
func (ix *Indexer) eachConv(ctx context.Context, keep func(uint64) bool, fn func(store.Conversation) error) error {
	page := func(ids []uint64) error {
		for _, id := range ids {
			if keep != nil && !keep(id) {
				continue
			}
			c, err := ix.st.Conversation(ctx, id)
			if errors.Is(err, store.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			if !c.E2E {
				if err := fn(c); err != nil {
					return err
				}
			}
		}
		return nil
	}
	// A store behind the seam's checks is a ConvLister whatever its
	// engine: one that cannot list in id order says ErrUnsupported.
	if l, ok := ix.st.(store.ConvLister); ok {
		err := func() error {
			for after := uint64(0); ; {
				ids, err := l.ConvIDs(ctx, after, 1000)
				if err != nil {
					return err
				}
				if len(ids) == 0 {
					return nil
				}
				if err := page(ids); err != nil {
					return err
				}
				after = ids[len(ids)-1]
			}
		}()
		if !errors.Is(err, errors.ErrUnsupported) {
			return err
		}
	}
	if sc, ok := ix.st.(ConvScanner); ok {
		return sc.ScanConvIDs(ctx, page)
	}
	return ErrNoConvList
}

// indexRound indexes the conversations of todo up to their noted seqs
// (and whatever else the store holds by then).
func (ix *Indexer) indexRound(ctx context.Context, todo map[uint64]uint64) error {
	ix.round.Lock()
	defer ix.round.Unlock()
	w := ix.newWriter(ctx)
	for _, conv := range slices.Sorted(maps.Keys(todo)) {
		if !ix.owns(conv) {
			continue
		}
		from, err := ix.x.Watermark(ctx, conv)
		if err != nil {
			return err
		}
		if from >= todo[conv] {
			continue
		}
		if err := w.conversation(conv, from+1, todo[conv]); err != nil {
			return err
		}
	}
	return w.flush()
}

// writer accumulates one or more batches. A key's last image wins: a
// message read as text early in a round and deleted by a recall read
// later in it is one delete, as a batch must never name a key in both
// Put and Delete.
type writer struct {
	ix    *Indexer
	ctx   context.Context
	b     Batch
	state map[Key]*Doc // the batch's documents; nil: delete
	n     int
	lags  []int64 // server times of the messages in b
}

func (ix *Indexer) newWriter(ctx context.Context) *writer {
	return &writer{ix: ix, ctx: ctx, b: Batch{Marks: map[uint64]uint64{}}, state: map[Key]*Doc{}}
}

// conversation adds conv's messages from..to (or beyond, to its last
// seq when the conversation has more) to the batches.
func (w *writer) conversation(conv, from, to uint64) error {
	c, err := w.ix.st.Conversation(w.ctx, conv)
	if err != nil {
		return err
	}
	if c.E2E {
		return nil
	}
	to = max(to, c.LastSeq)
	for from <= to {
		ms, err := w.ix.st.Messages(w.ctx, conv, from, to, 500)
		if err != nil {
			return err
		}
		if len(ms) == 0 {
			break
		}
		for _, m := range ms {
			if err := w.message(m); err != nil {
				return err
			}
		}
		from = ms[len(ms)-1].Seq + 1
		w.b.Marks[conv] = ms[len(ms)-1].Seq
		if w.n >= w.ix.batch {
			if err := w.flush(); err != nil {
				return err
			}
		}
	}
	return nil
}

// message adds what m changes: its own document, or, for an edit or a
// recall, its target's as the store now holds it.
func (w *writer) message(m store.Message) error {
	switch m.Kind {
	case protocol.KindEdit, protocol.KindRecall:
		if m.TargetSeq == 0 {
			return nil
		}
		ts, err := w.ix.st.Messages(w.ctx, m.ConvID, m.TargetSeq, m.TargetSeq, 1)
		if err != nil {
			return err
		}
		if len(ts) == 0 {
			w.state[Key{m.ConvID, m.TargetSeq}] = nil
			return nil
		}
		w.doc(ts[0])
	case protocol.KindText, protocol.KindFile:
		w.doc(m)
		w.lags = append(w.lags, m.ServerTime)
	}
	return nil
}

func (w *writer) doc(m store.Message) {
	w.n++
	k := Key{m.ConvID, m.Seq}
	text, ok := TextOf(m)
	if !ok {
		w.state[k] = nil
		return
	}
	w.state[k] = &Doc{ConvID: m.ConvID, Seq: m.Seq, MsgID: m.MsgID, Sender: m.Sender, Time: m.ServerTime, Kind: m.Kind, Text: text}
}

func (w *writer) flush() error {
	for _, k := range slices.SortedFunc(maps.Keys(w.state), func(a, b Key) int {
		return cmp.Or(cmp.Compare(a.ConvID, b.ConvID), cmp.Compare(a.Seq, b.Seq))
	}) {
		if d := w.state[k]; d != nil {
			w.b.Put = append(w.b.Put, *d)
		} else {
			w.b.Delete = append(w.b.Delete, k)
		}
	}
	clear(w.state)
	if w.b.Empty() {
		return nil
	}
	if err := w.ix.x.Apply(w.ctx, w.b); err != nil {
		return fmt.Errorf("search: apply: %w", err)
	}
	now := time.Now().UnixMilli()
	if w.ix.obs.Indexed != nil {
		for _, t := range w.lags {
			w.ix.obs.Indexed(time.Duration(max(now-t, 0)) * time.Millisecond)
		}
	}
	w.ix.indexed.Add(int64(len(w.lags)))
	w.b = Batch{Marks: map[uint64]uint64{}}
	w.n, w.lags = 0, w.lags[:0]
	return nil
}

// ReindexProgress is reported once the work is counted and after each
// conversation of a reindex.
type ReindexProgress struct {
	Conversations int   // done so far
	Messages      int64 // read so far
	// The work counted before it started: plain conversations and their
	// messages (last seqs), of which Conversations and Messages are done.
	TotalConversations int
	TotalMessages      int64
}

// Reindex rebuilds the index of one conversation (conv ≠ 0) or of every
// plain conversation from seq 1, whatever the watermarks say: the index
// of data stored before search existed, or after the index was lost. It
// runs beside the indexer (one conversation at a time between its
// rounds), so the node keeps serving. progress, if set, is called after
// each conversation.
func (ix *Indexer) Reindex(ctx context.Context, conv uint64, progress func(ReindexProgress)) (ReindexProgress, error) {
	var p ReindexProgress
	one := func(c store.Conversation) error {
		ix.round.Lock()
		defer ix.round.Unlock()
		w := ix.newWriter(ctx)
		// Delete what an earlier index may hold above the store's
		// messages is not needed: seqs are never reused.
		for from := uint64(1); from <= c.LastSeq; {
			ms, err := ix.st.Messages(ctx, c.ID, from, c.LastSeq, 500)
			if err != nil {
				return err
			}
			if len(ms) == 0 {
				break
			}
			for _, m := range ms {
				if m.Kind == protocol.KindText || m.Kind == protocol.KindFile {
					w.doc(m)
				}
			}
			p.Messages += int64(len(ms))
			from = ms[len(ms)-1].Seq + 1
			w.b.Marks[c.ID] = ms[len(ms)-1].Seq
			if w.n >= ix.batch {
				if err := w.flush(); err != nil {
					return err
				}
			}
		}
		if err := w.flush(); err != nil {
			return err
		}
		p.Conversations++
		if progress != nil {
			progress(p)
		}
		return nil
	}
	if conv != 0 {
		c, err := ix.st.Conversation(ctx, conv)
		if err != nil {
			return p, err
		}
		if c.E2E {
			return p, fmt.Errorf("search: conversation %d is end-to-end encrypted: %w", conv, ErrE2E)
		}
		p.TotalConversations, p.TotalMessages = 1, int64(c.LastSeq)
		if progress != nil {
			progress(p)
		}
		return p, one(c)
	}
	// Count first, so that progress has a total.
	err := ix.eachConv(ctx, nil, func(c store.Conversation) error {
		p.TotalConversations++
		p.TotalMessages += int64(c.LastSeq)
		return nil
	})
	if err != nil {
		return p, err
	}
	if progress != nil {
		progress(p)
	}
	return p, ix.eachConv(ctx, nil, one)
}

// ErrE2E: end-to-end encrypted conversations are never indexed.
var ErrE2E = errors.New("end-to-end encrypted conversations are never indexed")
