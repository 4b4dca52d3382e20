package pebble

import (
	"context"
	"errors"
	"fmt"
	"slices"

	cpebble "github.com/cockroachdb/pebble/v2"

	"github.com/parley-im/parley/internal/store"
)

// Memberships change under the conversation's mutex, the lock that
// allocates seqs, so a join or leave falls between two seqs: no message is
// both before and after it. Each change is one synced batch of the B row,
// the U row and (for joins and leaves) the member count in the C row.

// Member returns the membership of user in conv, a former one included.
func (s *Store) Member(ctx context.Context, convID uint64, user string) (store.Member, error) {
	const op = "member"
	// A current member is in the cached memberships when they are known.
	if st := s.peek(convID); st != nil {
		if p := st.members.Load(); p != nil {
			for _, m := range *p {
				if m.UserID == user {
					return m, nil
				}
			}
		}
	}
	m, err := s.member(convID, user)
	if err != nil {
		return store.Member{}, fmt.Errorf("pebble: %s %d: %w", op, convID, err)
	}
	return m, nil
}

func (s *Store) member(conv uint64, user string) (store.Member, error) {
	v, found, err := s.get(memberKey(conv, user))
	if err != nil {
		return store.Member{}, err
	}
	if !found {
		return store.Member{}, store.ErrNotMember
	}
	return decodeMember(conv, user, v)
}

// Members lists the current members of conv in user id order.
func (s *Store) Members(ctx context.Context, convID uint64) ([]store.Member, error) {
	const op = "members"
	// A loaded conversation exists (conversations are never deleted): its
	// cached members need no lookup of the C key.
	if st := s.peek(convID); st != nil && st.exists.Load() {
		if p := st.members.Load(); p != nil {
			return slices.Clone(*p), nil
		}
	}
	found, err := s.exists(convKey(convID))
	if err == nil && !found {
		err = store.ErrNotFound
	}
	var out []store.Member
	if err == nil {
		out, err = s.currentMembers(convID)
	}
	if err != nil {
		return nil, fmt.Errorf("pebble: %s %d: %w", op, convID, err)
	}
	return out, nil
}

// AddMembers adds users with JoinSeq = last seq + 1; a former member
// rejoins with a fresh membership (the given role, not muted).
func (s *Store) AddMembers(ctx context.Context, convID uint64, users []string, role store.Role) ([]store.Member, error) {
	const op = "add members"
	out, err := s.addMembers(convID, users, role)
	if err != nil {
		return nil, fmt.Errorf("pebble: %s %d: %w", op, convID, err)
	}
	return out, nil
}

func (s *Store) addMembers(conv uint64, users []string, role store.Role) ([]store.Member, error) {
	st, err := s.lockState(conv, false)
	if err != nil {
		return nil, err
	}
	defer s.release(st)
	defer st.mu.Unlock()
	st.rowsMu.Lock()
	defer st.rowsMu.Unlock()
	st.dropMembers()
	last := st.row.LastSeq
	out := make([]store.Member, 0, len(users))
	added := make(map[string]store.Member)
	b := s.db.NewBatch()
	defer b.Close()
	for _, u := range users {
		if m, ok := added[u]; ok {
			out = append(out, m)
			continue
		}
		m, err := s.member(conv, u)
		if err == nil && m.LeaveSeq == 0 {
			out = append(out, m)
			continue
		}
		if err != nil && !errors.Is(err, store.ErrNotMember) {
			return nil, err
		}
		m = store.Member{ConvID: conv, UserID: u, Role: role, JoinSeq: last + 1}
		if err := b.Set(memberKey(conv, u), encodeMember(m), nil); err != nil {
			return nil, err
		}
		r, err := s.rowOf(st, u)
		if err != nil {
			return nil, err
		}
		// LastSeq = last so the new member's unread count starts at 0. No
		// row is above last: UpdateRows refuses seqs that are not stored.
		r.JoinSeq, r.LeaveSeq, r.LastSeq = m.JoinSeq, 0, last
		if err := b.Set(userConvKey(u, conv), encodeConvRow(r), nil); err != nil {
			return nil, err
		}
		added[u] = m
		out = append(out, m)
	}
	if len(added) == 0 {
		return out, nil
	}
	row := st.row
	row.Members += len(added)
	if err := s.commitMembership(st, b, row); err != nil {
		return nil, err
	}
	return out, nil
}

// RemoveMembers sets LeaveSeq = last seq for the users that are current
// members. Their rows keep LeaveSeq and get LastSeq raised to it: what the
// member could see ends there, whatever fan-out had reached.
//
// A leave needs a seq to be decided by: in a conversation without messages
// LeaveSeq would be 0, which means "current member", so removing a current
// member from it fails with store.ErrConflict.
func (s *Store) RemoveMembers(ctx context.Context, convID uint64, users []string) ([]store.Member, error) {
	const op = "remove members"
	out, err := s.removeMembers(convID, users)
	if err != nil {
		return nil, fmt.Errorf("pebble: %s %d: %w", op, convID, err)
	}
	return out, nil
}

func (s *Store) removeMembers(conv uint64, users []string) ([]store.Member, error) {
	st, err := s.lockState(conv, false)
	if err != nil {
		return nil, err
	}
	defer s.release(st)
	defer st.mu.Unlock()
	st.rowsMu.Lock()
	defer st.rowsMu.Unlock()
	st.dropMembers()
	last := st.row.LastSeq
	var out []store.Member
	removed := make(map[string]bool)
	b := s.db.NewBatch()
	defer b.Close()
	for _, u := range users {
		if removed[u] {
			continue
		}
		m, err := s.member(conv, u)
		if errors.Is(err, store.ErrNotMember) || (err == nil && m.LeaveSeq != 0) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if last == 0 {
			return nil, fmt.Errorf("remove %s before the first message: %w", u, store.ErrConflict)
		}
		m.LeaveSeq = last
		if err := b.Set(memberKey(conv, u), encodeMember(m), nil); err != nil {
			return nil, err
		}
		r, err := s.rowOf(st, u)
		if err != nil {
			return nil, err
		}
		r.JoinSeq, r.LeaveSeq, r.LastSeq = m.JoinSeq, last, last
		if e := st.row.EveryoneSeq; e != 0 && e >= m.JoinSeq {
			// The conversation's @everyone mark moves on without the
			// leaver: its row keeps the last one it was there for.
			r.MentionSeq = max(r.MentionSeq, e)
		}
		if err := b.Set(userConvKey(u, conv), encodeConvRow(r), nil); err != nil {
			return nil, err
		}
		removed[u] = true
		out = append(out, m)
	}
	if len(out) == 0 {
		return out, nil
	}
	row := st.row
	row.Members = max(row.Members-len(out), 0)
	if err := s.commitMembership(st, b, row); err != nil {
		return nil, err
	}
	return out, nil
}

// dropMembers forgets the cached memberships and rows; mu and rowsMu held.
func (st *convState) dropMembers() {
	st.members.Store(nil)
	st.inline = nil
}

// rowOf returns user's U row of st's conversation, or a new one. Callers
// hold st.mu and st.rowsMu.
func (s *Store) rowOf(st *convState, user string) (store.ConvRow, error) {
	r, found, err := s.convRow(user, st.id)
	if err != nil || found {
		return r, err
	}
	return store.ConvRow{ConvID: st.id, UserID: user, Kind: st.row.Kind}, nil
}

// commitMembership writes row as the C row with the membership changes in b,
// synced; st.mu is held.
func (s *Store) commitMembership(st *convState, b *cpebble.Batch, row store.Conversation) error {
	if err := b.Set(convKey(st.id), encodeConv(row), nil); err != nil {
		return err
	}
	if err := s.db.Apply(b, syncWrite); err != nil {
		return err
	}
	st.setRow(row)
	// The synced batch follows every applied append in the WAL.
	st.raiseDurable(row.LastSeq)
	return nil
}

// SetRole changes the role of a current member.
func (s *Store) SetRole(ctx context.Context, convID uint64, user string, role store.Role) error {
	const op = "set role"
	if err := s.changeMember(convID, user, func(m *store.Member) { m.Role = role }); err != nil {
		return fmt.Errorf("pebble: %s %d %s: %w", op, convID, user, err)
	}
	return nil
}

// SetMuted mutes or unmutes a current member.
func (s *Store) SetMuted(ctx context.Context, convID uint64, user string, muted bool) error {
	const op = "set muted"
	if err := s.changeMember(convID, user, func(m *store.Member) { m.Muted = muted }); err != nil {
		return fmt.Errorf("pebble: %s %d %s: %w", op, convID, user, err)
	}
	return nil
}

// changeMember applies change to a current membership; anything else,
// an unknown conversation included, is store.ErrNotMember.
func (s *Store) changeMember(conv uint64, user string, change func(*store.Member)) error {
	st, err := s.lockState(conv, false)
	if errors.Is(err, store.ErrNotFound) {
		return store.ErrNotMember
	}
	if err != nil {
		return err
	}
	defer s.release(st)
	defer st.mu.Unlock()
	m, err := s.member(conv, user)
	if err != nil {
		return err
	}
	if m.LeaveSeq != 0 {
		return store.ErrNotMember
	}
	next := m
	change(&next)
	if next == m {
		return nil
	}
	st.members.Store(nil)
	if err := s.db.Set(memberKey(conv, user), encodeMember(next), syncWrite); err != nil {
		return err
	}
	st.raiseDurable(st.row.LastSeq)
	return nil
}
