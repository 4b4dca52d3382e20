package cassandra

import (
	"context"
	"errors"
	"fmt"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// Membership changes run under the conversation's mutex and are
// transactions on the member row conditioned on the membership they read
// (join_seq, leave_seq): a change that lost a race against another process
// reads the row again and decides anew. See the package comment.

const memberColumns = `role, join_seq, leave_seq, muted`

func scanMember(conv uint64, user string, q *gocql.Query) (store.Member, error) {
	var (
		role        int8
		join, leave int64
		muted       bool
	)
	err := q.Scan(&role, &join, &leave, &muted)
	if errors.Is(err, gocql.ErrNotFound) {
		return store.Member{}, store.ErrNotMember
	}
	if err != nil {
		return store.Member{}, err
	}
	return store.Member{ConvID: conv, UserID: user, Role: store.Role(role), JoinSeq: u64(join),
		LeaveSeq: u64(leave), Muted: muted}, nil
}

// Member returns the membership of user in conv, a former one included.
func (s *Store) Member(ctx context.Context, convID uint64, user string) (store.Member, error) {
	const op = "member"
	if err := s.enter(ctx, op); err != nil {
		return store.Member{}, err
	}
	defer s.gate.RUnlock()
	m, err := s.member(ctx, convID, user)
	if err != nil {
		return store.Member{}, fmt.Errorf("cassandra: %s %d: %w", op, convID, err)
	}
	return m, nil
}

func (s *Store) member(ctx context.Context, conv uint64, user string) (store.Member, error) {
	if !protocol.ValidID(user) {
		return store.Member{}, store.ErrNotMember
	}
	return scanMember(conv, user, s.q(ctx, `SELECT `+memberColumns+` FROM members WHERE conv_id = ? AND user_id = ?`, i64(conv), user))
}

// serialMember reads a membership at SERIAL, settling a transaction on it
// whose answer was lost.
func (s *Store) serialMember(ctx context.Context, conv uint64, user string) (store.Member, error) {
	return scanMember(conv, user, s.serialRead(ctx, `SELECT `+memberColumns+` FROM members WHERE conv_id = ? AND user_id = ?`, i64(conv), user))
}

// Members lists the current members of conv in user id order.
func (s *Store) Members(ctx context.Context, convID uint64) ([]store.Member, error) {
	const op = "members"
	if err := s.enter(ctx, op); err != nil {
		return nil, err
	}
	defer s.gate.RUnlock()
	out, err := s.members(ctx, convID)
	if err != nil {
		return nil, fmt.Errorf("cassandra: %s %d: %w", op, convID, err)
	}
	return out, nil
}

func (s *Store) members(ctx context.Context, conv uint64) ([]store.Member, error) {
	if err := s.check(ctx, conv); err != nil {
		return nil, err
	}
	iter := s.q(ctx, `SELECT user_id, `+memberColumns+` FROM members WHERE conv_id = ?`, i64(conv)).Iter()
	var (
		out         []store.Member
		user        string
		role        int8
		join, leave int64
		muted       bool
	)
	for iter.Scan(&user, &role, &join, &leave, &muted) {
		if leave == 0 {
			out = append(out, store.Member{ConvID: conv, UserID: user, Role: store.Role(role), JoinSeq: u64(join), Muted: muted})
		}
	}
	return out, iter.Close()
}

// AddMembers adds users with JoinSeq = the top of the seq index + 1, read
// under the mutex that orders this process's claims; a former member
// rejoins with a fresh membership (the given role, not muted). Another
// process may claim that seq concurrently; its message then counts as sent
// after the join, the ambiguity of any concurrent send.
func (s *Store) AddMembers(ctx context.Context, convID uint64, users []string, role store.Role) ([]store.Member, error) {
	const op = "add members"
	if err := s.enter(ctx, op); err != nil {
		return nil, err
	}
	defer s.gate.RUnlock()
	out, err := s.addMembers(ctx, convID, users, role)
	if err != nil {
		return nil, fmt.Errorf("cassandra: %s %d: %w", op, convID, err)
	}
	return out, nil
}

func (s *Store) addMembers(ctx context.Context, conv uint64, users []string, role store.Role) ([]store.Member, error) {
	if role > store.RoleOwner {
		return nil, fmt.Errorf("invalid role %d", role)
	}
	for _, u := range users {
		if !protocol.ValidID(u) {
			return nil, fmt.Errorf("invalid user id %q", u)
		}
	}
	st, err := s.existing(ctx, conv)
	if err != nil {
		return nil, err
	}
	defer s.release(st)
	st.mu.Lock()
	defer st.mu.Unlock()
	last, err := s.top(ctx, st)
	if err != nil {
		return nil, err
	}
	// The joins touch one member row each: they run in parallel (a
	// 3,000-member add was 3,000 × four round trips in a row).
	var distinct []string
	seen := make(map[string]bool, len(users))
	for _, u := range users {
		if !seen[u] {
			seen[u] = true
			distinct = append(distinct, u)
		}
	}
	members := make([]store.Member, len(distinct))
	joined := make([]bool, len(distinct))
	err = s.each(ctx, len(distinct), func(ctx context.Context, i int) error {
		var err error
		members[i], joined[i], err = s.join(ctx, st, distinct[i], role, last)
		return err
	})
	added := 0
	done := make(map[string]store.Member, len(distinct))
	for i, u := range distinct {
		if joined[i] {
			added++
		}
		done[u] = members[i]
	}
	if added > 0 {
		// Those who joined stay joined, even when another failed: keep
		// the count right.
		err = errors.Join(err, s.addToCount(ctx, conv, added))
	}
	if err != nil {
		return nil, err
	}
	out := make([]store.Member, len(users))
	for i, u := range users {
		out[i] = done[u]
	}
	return out, nil
}

// join makes user a current member joining after seq last, unless it is
// one; it returns the membership and whether it joined now.
func (s *Store) join(ctx context.Context, st *convState, user string, role store.Role, last uint64) (store.Member, bool, error) {
	want := store.Member{ConvID: st.id, UserID: user, Role: role, JoinSeq: last + 1}
	for {
		cur, err := s.member(ctx, st.id, user)
		var q *gocql.Query
		switch {
		case err == nil && cur.LeaveSeq == 0:
			return cur, false, nil
		case err == nil:
			q = s.lwt(ctx, `UPDATE members SET role = ?, join_seq = ?, leave_seq = null, muted = null
				WHERE conv_id = ? AND user_id = ? IF join_seq = ? AND leave_seq = ?`,
				int8(role), i64(want.JoinSeq), i64(st.id), user, i64(cur.JoinSeq), i64(cur.LeaveSeq))
		case errors.Is(err, store.ErrNotMember):
			q = s.lwt(ctx, `INSERT INTO members (conv_id, user_id, role, join_seq) VALUES (?, ?, ?, ?) IF NOT EXISTS`,
				i64(st.id), user, int8(role), i64(want.JoinSeq))
		default:
			return store.Member{}, false, err
		}
		applied, err := s.settle(ctx, q, st.id, user, want)
		if err != nil {
			return store.Member{}, false, err
		}
		if !applied {
			continue // another process changed the row: decide again
		}
		// The row starts at the join with no unread; a rejoining member's
		// LastSeq is a max-register, so it is never lowered.
		err = s.q(ctx, `UPDATE user_conversations SET kind = ?, join_seq = ?, leave_seq = null WHERE user_id = ? AND conv_id = ?`,
			int8(st.kind), i64(want.JoinSeq), user, i64(st.id)).Exec()
		if err == nil {
			err = s.raiseRow(ctx, st.id, user, last, false)
		}
		// No @everyone is carried into the row: one sent before the join
		// is not the joiner's, and later ones are read from the
		// conversation (st.everyone is what the last removal saw).
		return want, true, err
	}
}

// settle runs a transaction on a member row and reports whether it applied;
// an unknown outcome is settled by reading the row at SERIAL and comparing
// it with want, the row the transaction writes.
func (s *Store) settle(ctx context.Context, q *gocql.Query, conv uint64, user string, want store.Member) (bool, error) {
	applied, err := q.MapScanCAS(map[string]any{})
	if err == nil {
		return applied, nil
	}
	got, rerr := s.serialMember(ctx, conv, user)
	if rerr != nil && !errors.Is(rerr, store.ErrNotMember) {
		return false, errors.Join(err, rerr)
	}
	return rerr == nil && got == want, nil
}

// raiseRow raises user's row of conv to LastSeq ≥ seq (and MentionSeq
// with mention): max-registers written with seq as their timestamp.
func (s *Store) raiseRow(ctx context.Context, conv uint64, user string, seq uint64, mention bool) error {
	if seq == 0 {
		return nil
	}
	st := rowStmt(conv, user, seq, mention)
	return s.q(ctx, st.cql, st.args...).Exec()
}

// rowStmt is raiseRow's write.
func rowStmt(conv uint64, user string, seq uint64, mention bool) stmt {
	if mention {
		return stmt{`UPDATE user_conversations USING TIMESTAMP ? SET last_seq = ?, mention_seq = ? WHERE user_id = ? AND conv_id = ?`,
			[]any{i64(seq), i64(seq), i64(seq), user, i64(conv)}}
	}
	return stmt{`UPDATE user_conversations USING TIMESTAMP ? SET last_seq = ? WHERE user_id = ? AND conv_id = ?`,
		[]any{i64(seq), i64(seq), user, i64(conv)}}
}

// RemoveMembers sets LeaveSeq = the top of the seq index for the users that
// are current members; their rows keep LeaveSeq and get LastSeq raised to
// it. As in store/pebble, a leave needs a seq to be decided by: removing a
// current member before the first message fails with store.ErrConflict.
func (s *Store) RemoveMembers(ctx context.Context, convID uint64, users []string) ([]store.Member, error) {
	const op = "remove members"
	if err := s.enter(ctx, op); err != nil {
		return nil, err
	}
	defer s.gate.RUnlock()
	out, err := s.removeMembers(ctx, convID, users)
	if err != nil {
		return nil, fmt.Errorf("cassandra: %s %d: %w", op, convID, err)
	}
	return out, nil
}

func (s *Store) removeMembers(ctx context.Context, conv uint64, users []string) ([]store.Member, error) {
	st, err := s.existing(ctx, conv)
	if err != nil {
		return nil, err
	}
	defer s.release(st)
	st.mu.Lock()
	defer st.mu.Unlock()
	last, err := s.top(ctx, st)
	if err != nil {
		return nil, err
	}
	// The leavers' rows keep the conversation's last @everyone they were
	// there for, as a mention (the conversation's mark moves on without
	// them).
	row, err := s.convRow(ctx, conv)
	if err != nil {
		return nil, err
	}
	st.everyone = min(row.EveryoneSeq, last)
	var out []store.Member
	seen := make(map[string]bool, len(users))
	for _, u := range users {
		if seen[u] || !protocol.ValidID(u) {
			continue
		}
		seen[u] = true
		m, left, err := s.leave(ctx, st, u, last)
		if err != nil {
			if len(out) > 0 {
				// Those already removed stay removed: keep the count right.
				err = errors.Join(err, s.addToCount(ctx, conv, -len(out)))
			}
			return nil, err
		}
		if left {
			out = append(out, m)
		}
	}
	if len(out) > 0 {
		if err := s.addToCount(ctx, conv, -len(out)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// leave ends user's current membership at seq last; it reports false for a
// user who is not a current member.
func (s *Store) leave(ctx context.Context, st *convState, user string, last uint64) (store.Member, bool, error) {
	for {
		cur, err := s.member(ctx, st.id, user)
		if errors.Is(err, store.ErrNotMember) || (err == nil && cur.LeaveSeq != 0) {
			return store.Member{}, false, nil
		}
		if err != nil {
			return store.Member{}, false, err
		}
		if last == 0 {
			return store.Member{}, false, fmt.Errorf("remove %s before the first message: %w", user, store.ErrConflict)
		}
		want := cur
		want.LeaveSeq = last
		applied, err := s.settle(ctx, s.lwt(ctx, `UPDATE members SET leave_seq = ? WHERE conv_id = ? AND user_id = ? IF join_seq = ? AND leave_seq = null`,
			i64(last), i64(st.id), user, i64(cur.JoinSeq)), st.id, user, want)
		if err != nil {
			return store.Member{}, false, err
		}
		if !applied {
			continue
		}
		err = s.q(ctx, `UPDATE user_conversations SET kind = ?, join_seq = ?, leave_seq = ? WHERE user_id = ? AND conv_id = ?`,
			int8(st.kind), i64(cur.JoinSeq), i64(last), user, i64(st.id)).Exec()
		if err == nil {
			err = s.raiseRow(ctx, st.id, user, last, false)
		}
		if e := st.everyone; err == nil && e != 0 && e >= cur.JoinSeq {
			err = s.raiseRow(ctx, st.id, user, e, true)
		}
		return want, true, err
	}
}

// SetRole changes the role of a current member.
func (s *Store) SetRole(ctx context.Context, convID uint64, user string, role store.Role) error {
	const op = "set role"
	if err := s.enter(ctx, op); err != nil {
		return err
	}
	defer s.gate.RUnlock()
	err := fmt.Errorf("invalid role %d", role)
	if role <= store.RoleOwner {
		err = s.changeMember(ctx, convID, user, func(m *store.Member) { m.Role = role })
	}
	if err != nil {
		return fmt.Errorf("cassandra: %s %d %s: %w", op, convID, user, err)
	}
	return nil
}

// SetMuted mutes or unmutes a current member.
func (s *Store) SetMuted(ctx context.Context, convID uint64, user string, muted bool) error {
	const op = "set muted"
	if err := s.enter(ctx, op); err != nil {
		return err
	}
	defer s.gate.RUnlock()
	if err := s.changeMember(ctx, convID, user, func(m *store.Member) { m.Muted = muted }); err != nil {
		return fmt.Errorf("cassandra: %s %d %s: %w", op, convID, user, err)
	}
	return nil
}

// changeMember applies change (role and muted only) to a current
// membership; anything else, an unknown conversation included, is
// store.ErrNotMember.
func (s *Store) changeMember(ctx context.Context, conv uint64, user string, change func(*store.Member)) error {
	st, err := s.existing(ctx, conv)
	if errors.Is(err, store.ErrNotFound) {
		return store.ErrNotMember
	}
	if err != nil {
		return err
	}
	defer s.release(st)
	st.mu.Lock()
	defer st.mu.Unlock()
	for {
		cur, err := s.member(ctx, conv, user)
		if err != nil {
			return err
		}
		if cur.LeaveSeq != 0 {
			return store.ErrNotMember
		}
		want := cur
		change(&want)
		if want == cur {
			return nil
		}
		applied, err := s.settle(ctx, s.lwt(ctx, `UPDATE members SET role = ?, muted = ? WHERE conv_id = ? AND user_id = ? IF join_seq = ? AND leave_seq = null`,
			int8(want.Role), want.Muted, i64(conv), user, i64(cur.JoinSeq)), conv, user, want)
		if err != nil || applied {
			return err
		}
	}
}

// addToCount adds delta to conversations.members by compare-and-set. An
// unknown outcome is repaired by counting the current members.
func (s *Store) addToCount(ctx context.Context, conv uint64, delta int) error {
	var cur int
	if err := s.serialRead(ctx, `SELECT members FROM conversations WHERE conv_id = ?`, i64(conv)).Scan(&cur); err != nil {
		return err
	}
	for {
		seen := map[string]any{}
		applied, err := s.lwt(ctx, `UPDATE conversations SET members = ? WHERE conv_id = ? IF members = ?`,
			max(cur+delta, 0), i64(conv), cur).MapScanCAS(seen)
		if err != nil {
			return s.recount(ctx, conv)
		}
		if applied {
			return nil
		}
		cur, _ = seen["members"].(int)
	}
}

// recount sets conversations.members to the number of current members.
func (s *Store) recount(ctx context.Context, conv uint64) error {
	for {
		var cur int
		if err := s.serialRead(ctx, `SELECT members FROM conversations WHERE conv_id = ?`, i64(conv)).Scan(&cur); err != nil {
			return err
		}
		ms, err := s.members(ctx, conv)
		if err != nil {
			return err
		}
		applied, err := s.lwt(ctx, `UPDATE conversations SET members = ? WHERE conv_id = ? IF members = ?`,
			len(ms), i64(conv), cur).MapScanCAS(map[string]any{})
		if err != nil || applied {
			return err
		}
	}
}
