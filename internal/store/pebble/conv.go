package pebble

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"

	cpebble "github.com/cockroachdb/pebble/v2"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// convState is the in-memory side of one conversation.
type convState struct {
	id uint64

	// loaded and exists are set (under mu) before any write to the
	// conversation, and never cleared; readers check them without mu.
	loaded atomic.Bool
	exists atomic.Bool
	// durable is the highest seq known to be on stable storage. Since the
	// WAL holds seqs in order, every lower seq is durable too.
	durable atomic.Uint64

	// mu serialises the conversation's writers: creation, seq allocation,
	// membership changes.
	mu sync.Mutex
	// row is the C row as last applied (LastSeq may be ahead of durable);
	// guarded by mu.
	row store.Conversation
	// inflight maps sender 0x00 client_msg_id to an append that is applied
	// but not yet durable; a duplicate waits for it. Guarded by mu.
	inflight map[string]*pendingAppend

	// ov holds pre-edit images of targets rewritten by edits and recalls
	// that are not yet durable, so readers keep showing the durable version.
	ov struct {
		mu sync.Mutex
		n  atomic.Int32 // len(m), read without mu on the fast path
		m  map[uint64][]rewrite
	}
}

// rewrite is the image of a target before event seq rewrote it.
type rewrite struct {
	event  uint64
	before store.Message
}

type pendingAppend struct {
	done chan struct{}
	msg  store.Message // valid after done if err == nil
	err  error
}

// raiseDurable moves the durable watermark up to seq and drops the rewrite
// images that became durable.
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
	for target, rs := range st.ov.m {
		keep := rs[:0]
		for _, r := range rs {
			if r.event > d {
				keep = append(keep, r)
			}
		}
		if len(keep) == 0 {
			delete(st.ov.m, target)
		} else {
			st.ov.m[target] = keep
		}
	}
	st.ov.n.Store(int32(len(st.ov.m)))
}

func (st *convState) addRewrite(target, event uint64, before store.Message) {
	st.ov.mu.Lock()
	defer st.ov.mu.Unlock()
	if st.ov.m == nil {
		st.ov.m = make(map[uint64][]rewrite)
	}
	st.ov.m[target] = append(st.ov.m[target], rewrite{event: event, before: before})
	st.ov.n.Store(int32(len(st.ov.m)))
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
	st.ov.n.Store(int32(len(st.ov.m)))
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
				break
			}
		}
	}
}

// peek returns the state of conv if it has one and it is loaded.
func (s *Store) peek(conv uint64) *convState {
	s.convs.mu.Lock()
	st := s.convs.m[conv]
	s.convs.mu.Unlock()
	if st == nil || !st.loaded.Load() {
		return nil
	}
	return st
}

// lockState returns conv's state, loaded and locked. Unless create is set it
// fails with store.ErrNotFound for a conversation that does not exist, and
// then creates no state, so lookups of unknown ids cost no memory.
func (s *Store) lockState(conv uint64, create bool) (*convState, error) {
	s.convs.mu.Lock()
	st := s.convs.m[conv]
	s.convs.mu.Unlock()
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
		s.convs.mu.Lock()
		if st = s.convs.m[conv]; st == nil {
			st = &convState{id: conv, inflight: make(map[string]*pendingAppend)}
			s.convs.m[conv] = st
		}
		s.convs.mu.Unlock()
	}
	st.mu.Lock()
	if !st.loaded.Load() {
		if err := s.load(st); err != nil {
			st.mu.Unlock()
			return nil, err
		}
	}
	if !create && !st.exists.Load() {
		st.mu.Unlock()
		return nil, store.ErrNotFound
	}
	return st, nil
}

// readState returns conv's loaded state for a reader.
func (s *Store) readState(conv uint64) (*convState, error) {
	if st := s.peek(conv); st != nil && st.exists.Load() {
		return st, nil
	}
	st, err := s.lockState(conv, false)
	if err != nil {
		return nil, err
	}
	st.mu.Unlock()
	return st, nil
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
		st.row = row
		st.durable.Store(row.LastSeq)
		st.exists.Store(true)
	}
	st.loaded.Store(true)
	return nil
}

// capLastSeq hides a last_seq that is applied but not yet durable.
func (s *Store) capLastSeq(conv, last uint64) uint64 {
	if st := s.peek(conv); st != nil {
		return min(last, st.durable.Load())
	}
	return last
}

// CreateConversation stores c with its members, all with JoinSeq 1.
func (s *Store) CreateConversation(ctx context.Context, c store.Conversation, members []store.Member) error {
	const op = "create conversation"
	if err := s.enterWrite(ctx, op); err != nil {
		return err
	}
	defer s.gate.RUnlock()
	if err := s.create(c, members, nil); err != nil {
		return fmt.Errorf("pebble: %s %d: %w", op, c.ID, err)
	}
	return nil
}

// create writes a new conversation and extra (a D row) in one synced batch.
func (s *Store) create(c store.Conversation, members []store.Member, extra func(*cpebble.Batch) error) error {
	if !validKind(c.Kind) {
		return fmt.Errorf("invalid kind %d", c.Kind)
	}
	seen := make(map[string]bool, len(members))
	uniq := members[:0:0]
	for _, m := range members {
		if !protocol.ValidID(m.UserID) {
			return fmt.Errorf("invalid user id %q", m.UserID)
		}
		if m.Role > store.RoleOwner {
			return fmt.Errorf("invalid role %d", m.Role)
		}
		if !seen[m.UserID] {
			seen[m.UserID] = true
			uniq = append(uniq, m)
		}
	}
	st, err := s.lockState(c.ID, true)
	if err != nil {
		return err
	}
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
		m.ConvID, m.JoinSeq = c.ID, 1
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
	st.row = row
	st.exists.Store(true)
	return nil
}

// Direct returns the 1:1 conversation of a and b, creating it as newID.
func (s *Store) Direct(ctx context.Context, a, b string, newID uint64, now int64) (store.Conversation, error) {
	const op = "direct"
	if err := s.enterWrite(ctx, op); err != nil {
		return store.Conversation{}, err
	}
	defer s.gate.RUnlock()
	if !protocol.ValidID(a) || !protocol.ValidID(b) {
		return store.Conversation{}, fmt.Errorf("pebble: %s: invalid user id %q or %q", op, a, b)
	}
	key := directKey(a, b)
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
	c := store.Conversation{ID: newID, Kind: store.Direct, CreatedAt: now}
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
	if err := s.enter(ctx, op); err != nil {
		return store.Conversation{}, err
	}
	defer s.gate.RUnlock()
	c, err := s.conversation(id)
	if err != nil {
		return store.Conversation{}, fmt.Errorf("pebble: %s %d: %w", op, id, err)
	}
	return c, nil
}

func (s *Store) conversation(id uint64) (store.Conversation, error) {
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

// Member returns the membership of user in conv.
func (s *Store) Member(ctx context.Context, convID uint64, user string) (store.Member, error) {
	const op = "member"
	if err := s.enter(ctx, op); err != nil {
		return store.Member{}, err
	}
	defer s.gate.RUnlock()
	m, err := s.member(convID, user)
	if err != nil {
		return store.Member{}, fmt.Errorf("pebble: %s %d: %w", op, convID, err)
	}
	return m, nil
}

func (s *Store) member(conv uint64, user string) (store.Member, error) {
	if !protocol.ValidID(user) {
		return store.Member{}, store.ErrNotMember
	}
	v, found, err := s.get(memberKey(conv, user))
	if err != nil {
		return store.Member{}, err
	}
	if !found {
		return store.Member{}, store.ErrNotMember
	}
	return decodeMember(conv, user, v)
}

// Members lists the members of conv in user id order.
func (s *Store) Members(ctx context.Context, convID uint64) ([]store.Member, error) {
	const op = "members"
	if err := s.enter(ctx, op); err != nil {
		return nil, err
	}
	defer s.gate.RUnlock()
	found, err := s.exists(convKey(convID))
	if err == nil && !found {
		err = store.ErrNotFound
	}
	var out []store.Member
	if err == nil {
		err = s.scan(memberPrefix(convID), func(k, v []byte) error {
			user, ok := userOfMemberKey(k)
			if !ok {
				return fmt.Errorf("member key %x: %w", k, errCorrupt)
			}
			m, err := decodeMember(convID, user, v)
			out = append(out, m)
			return err
		})
	}
	if err != nil {
		return nil, fmt.Errorf("pebble: %s %d: %w", op, convID, err)
	}
	return out, nil
}

// AddMembers adds users with JoinSeq = last seq + 1, decided under the lock
// that allocates seqs, so no message is both before and after a join.
func (s *Store) AddMembers(ctx context.Context, convID uint64, users []string, role store.Role) ([]store.Member, error) {
	const op = "add members"
	if err := s.enterWrite(ctx, op); err != nil {
		return nil, err
	}
	defer s.gate.RUnlock()
	out, err := s.addMembers(convID, users, role)
	if err != nil {
		return nil, fmt.Errorf("pebble: %s %d: %w", op, convID, err)
	}
	return out, nil
}

func (s *Store) addMembers(conv uint64, users []string, role store.Role) ([]store.Member, error) {
	if role > store.RoleOwner {
		return nil, fmt.Errorf("invalid role %d", role)
	}
	for _, u := range users {
		if !protocol.ValidID(u) {
			return nil, fmt.Errorf("invalid user id %q", u)
		}
	}
	st, err := s.lockState(conv, false)
	if err != nil {
		return nil, err
	}
	defer st.mu.Unlock()
	last := st.row.LastSeq
	out := make([]store.Member, 0, len(users))
	added := make(map[string]bool)
	b := s.db.NewBatch()
	defer b.Close()
	for _, u := range users {
		if added[u] {
			out = append(out, store.Member{ConvID: conv, UserID: u, Role: role, JoinSeq: last + 1})
			continue
		}
		m, err := s.member(conv, u)
		if err == nil {
			out = append(out, m)
			continue
		}
		if !errors.Is(err, store.ErrNotMember) {
			return nil, err
		}
		m = store.Member{ConvID: conv, UserID: u, Role: role, JoinSeq: last + 1}
		if err := b.Set(memberKey(conv, u), encodeMember(m), nil); err != nil {
			return nil, err
		}
		// LastSeq = last so the new member's unread count starts at 0.
		cr := store.ConvRow{ConvID: conv, UserID: u, Kind: st.row.Kind, JoinSeq: m.JoinSeq, LastSeq: last}
		if err := b.Set(userConvKey(u, conv), encodeConvRow(cr), nil); err != nil {
			return nil, err
		}
		added[u] = true
		out = append(out, m)
	}
	if len(added) == 0 {
		return out, nil
	}
	row := st.row
	row.Members += len(added)
	if err := b.Set(convKey(conv), encodeConv(row), nil); err != nil {
		return nil, err
	}
	if err := s.db.Apply(b, syncWrite); err != nil {
		return nil, err
	}
	st.row = row
	// The synced batch follows every applied append in the WAL.
	st.raiseDurable(last)
	return out, nil
}

// UserConversations lists user's conversation rows in conversation id
// order (the U keys' order).
func (s *Store) UserConversations(ctx context.Context, user string) ([]store.ConvRow, error) {
	const op = "user conversations"
	if err := s.enter(ctx, op); err != nil {
		return nil, err
	}
	defer s.gate.RUnlock()
	if !protocol.ValidID(user) {
		return nil, nil
	}
	var out []store.ConvRow
	err := s.scan(userConvPrefix(user), func(k, v []byte) error {
		conv, ok := convOfUserConvKey(k)
		if !ok {
			return fmt.Errorf("conversation row key %x: %w", k, errCorrupt)
		}
		r, err := decodeConvRow(user, conv, v)
		out = append(out, r)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("pebble: %s: %w", op, err)
	}
	// Capped after the scan: a state that is loaded now was loaded before
	// any row the scan saw was written through it.
	for i := range out {
		out[i].LastSeq = s.capLastSeq(out[i].ConvID, out[i].LastSeq)
	}
	return out, nil
}
