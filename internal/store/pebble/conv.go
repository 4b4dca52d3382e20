package pebble

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"

	cpebble "github.com/cockroachdb/pebble/v2"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/statecache"
)

// convState is the in-memory side of one conversation.
type convState struct {
	statecache.Node
	id uint64

	// loaded and exists are set (under mu) before any write to the
	// conversation, and never cleared; readers check them without mu.
	loaded atomic.Bool
	exists atomic.Bool
	// durable is the highest seq known to be on stable storage. Since the
	// WAL holds seqs in order, every lower seq is durable too.
	durable atomic.Uint64

	// mu serialises the conversation's writers: creation, seq allocation,
	// membership changes, tier.
	mu sync.Mutex
	// row is the C row as last applied (LastSeq may be ahead of durable);
	// guarded by mu. snap is a copy of it for readers without mu (set
	// with it by setRow).
	row  store.Conversation
	snap atomic.Pointer[store.Conversation]
	// inflight maps sender 0x00 client_msg_id to an append that is applied
	// but not yet durable; a duplicate waits for it (nil when none).
	// Guarded by mu.
	inflight map[string]*pendingAppend

	// rowsMu serialises the read-modify-write of the conversation's U rows:
	// UpdateRows takes it alone, so write fan-out never waits for seq
	// allocation; AddMembers and RemoveMembers take it under mu.
	rowsMu sync.Mutex
	// inline caches the current members' U rows as Append.Rows last wrote
	// them (nil: unknown), so an append to a direct conversation reads
	// neither the B nor the U rows. Guarded by rowsMu and filled under mu
	// too; every other writer of the conversation's B or U rows drops it.
	inline []store.ConvRow
	// members caches the current memberships (nil: unknown): filled under
	// mu by Append.Rows, dropped under mu by every membership change, read
	// by Members without a lock.
	members atomic.Pointer[[]store.Member]

	// ov holds what readers must see instead of what is applied but not
	// yet durable: pre-edit images of targets rewritten by edits and
	// recalls, and the previous latest seq of coalesce keys.
	ov struct {
		mu sync.Mutex
		n  atomic.Int32 // len(m)+len(keys), read without mu on the fast path
		m  map[uint64][]rewrite
		// keys maps a coalesce key to the appends of it that are not yet
		// durable, in seq order.
		keys map[string][]keyImage
	}
}

// rewrite is the image of a target before event seq rewrote it.
type rewrite struct {
	event  uint64
	before store.Message
}

// keyImage is the latest seq of a coalesce key (0: none) before the append
// of event.
type keyImage struct {
	event  uint64
	before uint64
}

type pendingAppend struct {
	done chan struct{}
	msg  store.Message // valid after done if err == nil
	err  error
}

// raiseDurable moves the durable watermark up to seq and drops the images
// that became durable.
func (st *convState) raiseDurable(seq uint64) {
	for {
		cur := st.durable.Load()
		if seq <= cur || st.durable.CompareAndSwap(cur, seq) {
			break
		}
	}
	if st.ov.n.Load() == 0 {
		return
	}
	d := st.durable.Load()
	st.ov.mu.Lock()
	defer st.ov.mu.Unlock()
	keepAbove(st.ov.m, d, func(r rewrite) uint64 { return r.event })
	keepAbove(st.ov.keys, d, func(im keyImage) uint64 { return im.event })
	st.countImages()
}

// keepAbove keeps in m the images of events above seq d (not yet durable)
// and drops the keys left with none.
func keepAbove[K comparable, T any](m map[K][]T, d uint64, event func(T) uint64) {
	for k, ims := range m {
		keep := ims[:0]
		for _, im := range ims {
			if event(im) > d {
				keep = append(keep, im)
			}
		}
		if len(keep) == 0 {
			delete(m, k)
		} else {
			m[k] = keep
		}
	}
}

// countImages publishes the number of pending images; ov.mu held.
func (st *convState) countImages() {
	st.ov.n.Store(int32(len(st.ov.m) + len(st.ov.keys)))
}

func (st *convState) addRewrite(target, event uint64, before store.Message) {
	st.ov.mu.Lock()
	defer st.ov.mu.Unlock()
	if st.ov.m == nil {
		st.ov.m = make(map[uint64][]rewrite)
	}
	st.ov.m[target] = append(st.ov.m[target], rewrite{event: event, before: before})
	st.countImages()
}

func (st *convState) dropRewrite(target, event uint64) {
	st.ov.mu.Lock()
	defer st.ov.mu.Unlock()
	rs := st.ov.m[target]
	for i, r := range rs {
		if r.event == event {
			rs = append(rs[:i], rs[i+1:]...)
			break
		}
	}
	if len(rs) == 0 {
		delete(st.ov.m, target)
	} else {
		st.ov.m[target] = rs
	}
	st.countImages()
}

// addKeyImage records that event, not yet durable, replaces before as the
// latest message with coalesce key k. Appends hold mu, so events arrive in
// seq order.
func (st *convState) addKeyImage(k string, event, before uint64) {
	st.ov.mu.Lock()
	defer st.ov.mu.Unlock()
	if st.ov.keys == nil {
		st.ov.keys = make(map[string][]keyImage)
	}
	st.ov.keys[k] = append(st.ov.keys[k], keyImage{event: event, before: before})
	st.countImages()
}

func (st *convState) dropKeyImage(k string, event uint64) {
	st.ov.mu.Lock()
	defer st.ov.mu.Unlock()
	ims := st.ov.keys[k]
	if n := len(ims); n > 0 && ims[n-1].event == event {
		ims = ims[:n-1]
	}
	if len(ims) == 0 {
		delete(st.ov.keys, k)
	} else {
		st.ov.keys[k] = ims
	}
	st.countImages()
}

// visible replaces messages whose stored version comes from an edit or
// recall above durable d with the version before it.
func (st *convState) visible(msgs []store.Message, d uint64) {
	if st.ov.n.Load() == 0 {
		return
	}
	st.ov.mu.Lock()
	defer st.ov.mu.Unlock()
	for i := range msgs {
		// Images are in event order: the first one above d is what the
		// target looked like at d.
		for _, r := range st.ov.m[msgs[i].Seq] {
			if r.event > d {
				msgs[i] = r.before
				// Readers share the image; none may alias its slice.
				msgs[i].Mentions = cloneMentions(r.before.Mentions)
				break
			}
		}
	}
}

// latestAt returns the latest seq with coalesce key k that a reader of
// durable watermark d may rely on, given stored, the K row read after d
// was loaded. If stored is above d its append recorded an image before it
// was applied, and the image is only dropped once stored is durable; so the
// result is ≤ d or durable, and a crash cannot take it back.
func (st *convState) latestAt(k string, stored, d uint64) uint64 {
	if stored <= d || st.ov.n.Load() == 0 {
		return stored
	}
	st.ov.mu.Lock()
	defer st.ov.mu.Unlock()
	for _, im := range st.ov.keys[k] {
		if im.event > d {
			return im.before
		}
	}
	return stored
}

// peek returns the state of conv if it has one and it is loaded, without
// pinning it: callers read only its atomics (snap, durable), which an
// evicted state keeps as they were when it went quiescent.
func (s *Store) peek(conv uint64) *convState {
	st := s.convs.Peek(conv)
	if st == nil || !st.loaded.Load() {
		return nil
	}
	return st
}

// lockState returns conv's state, pinned, loaded and locked; the caller
// unlocks it and then calls s.release. Unless create is set it fails with
// store.ErrNotFound for a conversation that does not exist, and then keeps
// no state, so lookups of unknown ids cost no memory.
func (s *Store) lockState(conv uint64, create bool) (*convState, error) {
	st := s.convs.Get(conv)
	if st == nil {
		if !create {
			found, err := s.exists(convKey(conv))
			if err != nil {
				return nil, err
			}
			if !found {
				return nil, store.ErrNotFound
			}
		}
		st = s.convs.GetOrCreate(conv, func(st *convState) {
			st.id = conv
		})
	}
	st.mu.Lock()
	if !st.loaded.Load() {
		if err := s.load(st); err != nil {
			st.mu.Unlock()
			s.release(st)
			return nil, err
		}
	}
	if !create && !st.exists.Load() {
		st.mu.Unlock()
		s.release(st)
		return nil, store.ErrNotFound
	}
	return st, nil
}

// readState returns conv's loaded state, pinned, for a reader; the caller
// calls s.release.
func (s *Store) readState(conv uint64) (*convState, error) {
	if st := s.convs.Get(conv); st != nil {
		if st.loaded.Load() && st.exists.Load() {
			return st, nil
		}
		s.release(st)
	}
	st, err := s.lockState(conv, false)
	if err != nil {
		return nil, err
	}
	st.mu.Unlock()
	return st, nil
}

// release unpins a state of lockState or readState.
func (s *Store) release(st *convState) { s.convs.Release(st) }

// quiescent reports whether st may be evicted (statecache): a state
// loaded again from disk must equal it, so nothing may be applied but not
// yet durable (the C row on disk would then be ahead of a fresh state's
// durable watermark), in flight, or overlaid. It runs unpinned under the
// cache's lock, so nobody else holds st.
func (st *convState) quiescent() bool {
	if !st.mu.TryLock() {
		return false
	}
	defer st.mu.Unlock()
	if !st.loaded.Load() || !st.exists.Load() {
		return true
	}
	return len(st.inflight) == 0 && st.ov.n.Load() == 0 && st.durable.Load() == st.row.LastSeq
}

// load reads the C row. It runs before the first write through st, so the
// row it reads is durable.
func (s *Store) load(st *convState) error {
	v, found, err := s.get(convKey(st.id))
	if err != nil {
		return err
	}
	if found {
		row, err := decodeConv(st.id, v)
		if err != nil {
			return err
		}
		st.setRow(row)
		st.durable.Store(row.LastSeq)
		st.exists.Store(true)
	}
	st.loaded.Store(true)
	return nil
}

// setRow records row as the applied C row; mu held.
func (st *convState) setRow(row store.Conversation) {
	st.row = row
	st.snap.Store(&row)
}

// capLastSeq hides a last_seq that is applied but not yet durable.
func (s *Store) capLastSeq(conv, last uint64) uint64 {
	if st := s.peek(conv); st != nil {
		return min(last, st.durable.Load())
	}
	return last
}

// CreateConversation stores c (Tier included) with its members, all with
// JoinSeq 1 and LeaveSeq 0; their Role and Muted are kept.
func (s *Store) CreateConversation(ctx context.Context, c store.Conversation, members []store.Member) error {
	const op = "create conversation"
	if err := s.create(c, members, nil); err != nil {
		return fmt.Errorf("pebble: %s %d: %w", op, c.ID, err)
	}
	return nil
}

// create writes a new conversation and extra (a D row) in one synced batch.
func (s *Store) create(c store.Conversation, members []store.Member, extra func(*cpebble.Batch) error) error {
	seen := make(map[string]bool, len(members))
	uniq := members[:0:0]
	for _, m := range members {
		if !seen[m.UserID] {
			seen[m.UserID] = true
			uniq = append(uniq, m)
		}
	}
	st, err := s.lockState(c.ID, true)
	if err != nil {
		return err
	}
	defer s.release(st)
	defer st.mu.Unlock()
	if st.exists.Load() {
		return store.ErrExists
	}
	row := c
	row.LastSeq = 0
	row.Members = len(uniq)
	b := s.db.NewBatch()
	defer b.Close()
	if err := b.Set(convKey(c.ID), encodeConv(row), nil); err != nil {
		return err
	}
	for _, m := range uniq {
		m.ConvID, m.JoinSeq, m.LeaveSeq = c.ID, 1, 0
		if err := b.Set(memberKey(c.ID, m.UserID), encodeMember(m), nil); err != nil {
			return err
		}
		cr := store.ConvRow{ConvID: c.ID, UserID: m.UserID, Kind: c.Kind, JoinSeq: 1}
		if err := b.Set(userConvKey(m.UserID, c.ID), encodeConvRow(cr), nil); err != nil {
			return err
		}
	}
	if extra != nil {
		if err := extra(b); err != nil {
			return err
		}
	}
	if err := s.db.Apply(b, syncWrite); err != nil {
		return err
	}
	st.setRow(row)
	st.exists.Store(true)
	return nil
}

// Direct returns the 1:1 conversation of a and b, creating it as newID.
func (s *Store) Direct(ctx context.Context, a, b string, newID uint64, now int64) (store.Conversation, error) {
	return s.direct(ctx, a, b, newID, now, false)
}

// DirectE2E is Direct for the pair's end-to-end encrypted conversation.
func (s *Store) DirectE2E(ctx context.Context, a, b string, newID uint64, now int64) (store.Conversation, error) {
	return s.direct(ctx, a, b, newID, now, true)
}

func (s *Store) direct(ctx context.Context, a, b string, newID uint64, now int64, e2e bool) (store.Conversation, error) {
	const op = "direct"
	key := directKey(a, b)
	if e2e {
		key = append(key, 0, 'e') // ids hold no 0 byte: a distinct pair key
	}
	mu := &s.directLocks[maphash.Bytes(s.seed, key)%directStripes]
	mu.Lock()
	defer mu.Unlock()
	v, found, err := s.get(key)
	if err != nil {
		return store.Conversation{}, fmt.Errorf("pebble: %s: %w", op, err)
	}
	if found {
		id, err := decodeUint(v)
		if err != nil {
			return store.Conversation{}, fmt.Errorf("pebble: %s: %w", op, err)
		}
		c, err := s.conversation(id)
		if err != nil {
			return store.Conversation{}, fmt.Errorf("pebble: %s: %w", op, err)
		}
		return c, nil
	}
	c := store.Conversation{ID: newID, Kind: store.Direct, CreatedAt: now, E2E: e2e}
	members := []store.Member{{UserID: a}, {UserID: b}}
	err = s.create(c, members, func(batch *cpebble.Batch) error {
		return batch.Set(key, encodeUint(newID), nil)
	})
	if err != nil {
		return store.Conversation{}, fmt.Errorf("pebble: %s %d: %w", op, newID, err)
	}
	c, err = s.conversation(newID)
	if err != nil {
		return store.Conversation{}, fmt.Errorf("pebble: %s: %w", op, err)
	}
	return c, nil
}

// Conversation returns the conversation's row.
func (s *Store) Conversation(ctx context.Context, id uint64) (store.Conversation, error) {
	const op = "conversation"
	c, err := s.conversation(id)
	if err != nil {
		return store.Conversation{}, fmt.Errorf("pebble: %s %d: %w", op, id, err)
	}
	return c, nil
}

func (s *Store) conversation(id uint64) (store.Conversation, error) {
	// The C row as applied, from memory once loaded; like a read of the
	// key, it is capped at the durable watermark below.
	if st := s.peek(id); st != nil && st.exists.Load() {
		if p := st.snap.Load(); p != nil {
			c := *p
			c.LastSeq = min(c.LastSeq, st.durable.Load())
			return c, nil
		}
	}
	v, found, err := s.get(convKey(id))
	if err != nil {
		return store.Conversation{}, err
	}
	if !found {
		return store.Conversation{}, store.ErrNotFound
	}
	c, err := decodeConv(id, v)
	if err != nil {
		return store.Conversation{}, err
	}
	c.LastSeq = s.capLastSeq(id, c.LastSeq)
	return c, nil
}

// SetTier records the conversation's fan-out tier.
func (s *Store) SetTier(ctx context.Context, convID uint64, tier uint8) error {
	const op = "set tier"
	if err := s.setTier(convID, tier); err != nil {
		return fmt.Errorf("pebble: %s %d: %w", op, convID, err)
	}
	return nil
}

func (s *Store) setTier(conv uint64, tier uint8) error {
	st, err := s.lockState(conv, false)
	if err != nil {
		return err
	}
	defer s.release(st)
	defer st.mu.Unlock()
	if st.row.Tier == tier {
		return nil
	}
	row := st.row
	row.Tier = tier
	if err := s.db.Set(convKey(conv), encodeConv(row), syncWrite); err != nil {
		return err
	}
	st.setRow(row)
	// The synced write follows every applied append in the WAL.
	st.raiseDurable(row.LastSeq)
	return nil
}

// ConvStates returns the number of conversation states in memory and how
// many have been evicted since Open (for tests, benchmarks and metrics).
func (s *Store) ConvStates() (held int, evicted uint64) {
	return s.convs.Len(), s.convs.Evicted()
}

// EvictIdle evicts every conversation state that may go now and returns
// how many went: tests use it to force a reload between two operations.
func (s *Store) EvictIdle() int { return s.convs.EvictIdle() }

// ConvIDs returns up to limit conversation ids above after, ascending
// (store.ConvLister).
func (s *Store) ConvIDs(ctx context.Context, after uint64, limit int) ([]uint64, error) {
	if after == math.MaxUint64 {
		return nil, nil
	}
	ids, err := s.keyIDs(convKey(after+1), []byte{tagConv + 1}, limit)
	if err != nil {
		return nil, fmt.Errorf("pebble: conversation ids: %w", err)
	}
	return ids, nil
}
