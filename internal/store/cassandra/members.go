package cassandra

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/parley-im/parley/internal/store"
)

// Membership changes run under the conversation's mutex and are
// conditional batches on the members partition, each row conditioned on
// the membership read (join_seq, leave_seq) and, on the owned path, the
// batch on the partition's fence: a change that lost a race against
// another process reads the rows again and decides anew, and one of a
// stale owner is refused. See the package comment.

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
	if ms, ok := s.ownedDirect(convID); ok {
		for _, m := range ms {
			if m.UserID == user {
				return m, nil
			}
		}
		return store.Member{}, fmt.Errorf("cassandra: %s %d: %w", op, convID, store.ErrNotMember)
	}
	m, err := s.member(ctx, convID, user)
	if err != nil {
		return store.Member{}, fmt.Errorf("cassandra: %s %d: %w", op, convID, err)
	}
	return m, nil
}

func (s *Store) member(ctx context.Context, conv uint64, user string) (store.Member, error) {
	return scanMember(conv, user, s.q(ctx, `SELECT `+memberColumns+` FROM members WHERE conv_id = ? AND user_id = ?`, i64(conv), user))
}

// Members lists the current members of conv in user id order.
func (s *Store) Members(ctx context.Context, convID uint64) ([]store.Member, error) {
	const op = "members"
	if ms, ok := s.ownedDirect(convID); ok {
		return ms, nil
	}
	out, err := s.members(ctx, convID)
	if err != nil {
		return nil, fmt.Errorf("cassandra: %s %d: %w", op, convID, err)
	}
	return out, nil
}

// ownedDirect returns the memberships of a direct conversation from
// memory when this process owns it under the epoch it loaded it in and
// knows its two members (created here, or read once by the writer): a
// direct conversation's members join at 1 as plain members and never
// change, and any membership change, which only the owner makes, drops
// the list.
func (s *Store) ownedDirect(conv uint64) ([]store.Member, bool) {
	if s.lease == nil {
		return nil, false
	}
	epoch, ok := s.lease.Epoch(conv)
	if !ok {
		return nil, false
	}
	st := s.convs.Peek(conv)
	if st == nil || !st.exists.Load() || st.kind != store.Direct {
		return nil, false
	}
	st.own.mu.Lock()
	users, loaded := st.own.direct, st.own.epoch == epoch
	st.own.mu.Unlock()
	if !loaded || len(users) != 2 {
		return nil, false
	}
	out := make([]store.Member, len(users))
	for i, u := range users {
		out[i] = store.Member{ConvID: conv, UserID: u, Role: store.RoleMember, JoinSeq: 1}
	}
	slices.SortFunc(out, func(a, b store.Member) int { return strings.Compare(a.UserID, b.UserID) })
	return out, true
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
		if leave == 0 && user != "" { // "": the partition's static fence alone
			out = append(out, store.Member{ConvID: conv, UserID: user, Role: store.Role(role), JoinSeq: u64(join), Muted: muted})
		}
	}
	return out, iter.Close()
}

// AddMembers adds users with JoinSeq = the top of the seq index + 1, read
// under the mutex that orders this process's claims (the owner's top in
// memory on the owned path); a former member rejoins with a fresh
// membership (the given role, not muted). In transactional mode another
// process may claim that seq concurrently; its message then counts as sent
// after the join, the ambiguity of any concurrent send.
func (s *Store) AddMembers(ctx context.Context, convID uint64, users []string, role store.Role) ([]store.Member, error) {
	const op = "add members"
	out, err := s.addMembers(ctx, convID, users, role)
	if err != nil {
		return nil, fmt.Errorf("cassandra: %s %d: %w", op, convID, err)
	}
	return out, nil
}

// memberChunk bounds the member rows of one conditional batch. The rows
// of a conversation share a partition, so a batch of them is one Paxos
// round whatever its size, and rounds on one partition contend: the
// chunks of a change run one after the other. 128 rows stay far below
// Cassandra's batch size limit (50 KiB by default).
const memberChunk = 128

// memberAttempts bounds how often one chunk is decided anew after its
// conditions failed (another writer changed a row meanwhile).
const memberAttempts = 8

// memberChange is one member row a membership change writes.
type memberChange struct {
	had  bool         // a row existed (cur is it)
	cur  store.Member // as read
	want store.Member // as written
	set  string       // the SET clause
	args []any        // its values
}

func (s *Store) addMembers(ctx context.Context, conv uint64, users []string, role store.Role) ([]store.Member, error) {
	st, err := s.existing(ctx, conv)
	if err != nil {
		return nil, err
	}
	defer s.release(st)
	st.mu.Lock()
	defer st.mu.Unlock()
	epoch, last, err := s.memberBase(ctx, st)
	if err != nil {
		return nil, err
	}
	var distinct []string
	seen := make(map[string]bool, len(users))
	for _, u := range users {
		if !seen[u] {
			seen[u] = true
			distinct = append(distinct, u)
		}
	}
	done := make(map[string]store.Member, len(distinct))
	joined, err := s.changeMembers(ctx, st, epoch, distinct, func(u string, cur store.Member, had bool) (memberChange, bool) {
		if had && cur.LeaveSeq == 0 {
			done[u] = cur // already a member
			return memberChange{}, false
		}
		want := store.Member{ConvID: conv, UserID: u, Role: role, JoinSeq: last + 1}
		c := memberChange{had: had, cur: cur, want: want,
			set: `role = ?, join_seq = ?`, args: []any{int8(role), i64(want.JoinSeq)}}
		if had {
			c.set += `, leave_seq = null, muted = null`
		}
		return c, true
	})
	for _, c := range joined {
		done[c.want.UserID] = c.want
	}
	// Those who joined stay joined, even when the change failed later:
	// their rows and the count follow.
	err = errors.Join(err, s.afterMembers(ctx, st, epoch, joined, len(joined), func(b *gocql.Batch, c memberChange) {
		// The row starts at the join with no unread; a rejoining
		// member's LastSeq is a max-register, so it is never lowered. No
		// @everyone is carried into the row: one sent before the join is
		// not the joiner's, and later ones are read from the
		// conversation (st.everyone is what the last removal saw).
		b.Query(`UPDATE user_conversations SET kind = ?, join_seq = ?, leave_seq = null WHERE user_id = ? AND conv_id = ?`,
			int8(st.kind), i64(c.want.JoinSeq), c.want.UserID, i64(conv))
		queryRaise(b, conv, c.want.UserID, last, false)
	}))
	if err != nil {
		return nil, err
	}
	out := make([]store.Member, len(users))
	for i, u := range users {
		out[i] = done[u]
	}
	return out, nil
}

// memberBase prepares a membership change of st, under st.mu: it returns
// the seq the change is decided by (the top) and, on the owned path, the
// epoch its writes are conditioned on. The owner loads the conversation
// under its current epoch first if it has not yet (takeConv, which also
// fences the members partition), as its writer does before a batch.
func (s *Store) memberBase(ctx context.Context, st *convState) (epoch, top uint64, err error) {
	if s.lease == nil {
		top, err = s.top(ctx, st)
		return 0, top, err
	}
	epoch, gen, err := s.writeEpoch(ctx, st)
	if err != nil {
		return 0, 0, err
	}
	o := &st.own
	o.mu.Lock()
	loaded, top, lost := o.epoch == epoch, o.top, epoch <= o.lost
	o.mu.Unlock()
	if lost {
		return 0, 0, store.ErrNotOwner
	}
	if loaded {
		return epoch, top, nil
	}
	if top, err = s.takeConv(ctx, st, epoch, gen); err != nil {
		if errors.Is(err, store.ErrNotOwner) {
			s.lostEpoch(o, epoch)
		}
		return 0, 0, err
	}
	o.mu.Lock()
	o.epoch, o.top, o.hinted = epoch, top, 0
	o.mu.Unlock()
	return epoch, top, nil
}

// lostEpoch records that this process must never write under epoch again.
func (s *Store) lostEpoch(o *ownedConv, epoch uint64) {
	o.mu.Lock()
	o.epoch, o.lost = 0, max(o.lost, epoch)
	o.mu.Unlock()
}

// changeMembers reads the member rows of users and writes the changes
// decide asks for, in conditional batches of memberChunk rows: each row
// conditioned on the membership read (join_seq, leave_seq; no row) and, on
// the owned path (epoch not 0), the batch on the partition's fence being
// epoch, so a stale owner's change is refused once a newer owner loaded
// the conversation (store.ErrNotOwner). It returns the changes written,
// also when a later chunk failed.
func (s *Store) changeMembers(ctx context.Context, st *convState, epoch uint64, users []string,
	decide func(user string, cur store.Member, had bool) (memberChange, bool)) ([]memberChange, error) {
	var done []memberChange
	for lo := 0; lo < len(users); lo += memberChunk {
		chunk := users[lo:min(lo+memberChunk, len(users))]
		for attempt := 0; ; attempt++ {
			if attempt == memberAttempts {
				return done, fmt.Errorf("members keep changing: %w", store.ErrConflict)
			}
			cur, err := s.readMembers(ctx, st.id, chunk, false)
			if err != nil {
				return done, err
			}
			var chs []memberChange
			for _, u := range chunk {
				m, had := cur[u]
				if c, ok := decide(u, m, had); ok {
					chs = append(chs, c)
				}
			}
			if len(chs) == 0 {
				break
			}
			applied, err := s.casMembers(ctx, st.id, epoch, chs)
			if err != nil {
				return done, err
			}
			if applied {
				done = append(done, chs...)
				st.own.mu.Lock()
				st.own.direct = nil // read again when needed
				st.own.mu.Unlock()
				break
			}
			if epoch != 0 {
				if err := s.checkFence(ctx, st, epoch); err != nil {
					return done, err
				}
			}
		}
	}
	return done, nil
}

// readMembers reads the member rows of users (one partition), at SERIAL
// with serial.
func (s *Store) readMembers(ctx context.Context, conv uint64, users []string, serial bool) (map[string]store.Member, error) {
	stmt := `SELECT user_id, ` + memberColumns + ` FROM members WHERE conv_id = ? AND user_id IN ?`
	q := s.q(ctx, stmt, i64(conv), users)
	if serial {
		q = s.serialRead(ctx, stmt, i64(conv), users)
	}
	iter := q.Iter()
	out := make(map[string]store.Member, len(users))
	var (
		user        string
		role        int8
		join, leave int64
		muted       bool
	)
	for iter.Scan(&user, &role, &join, &leave, &muted) {
		if user != "" {
			out[user] = store.Member{ConvID: conv, UserID: user, Role: store.Role(role), JoinSeq: u64(join),
				LeaveSeq: u64(leave), Muted: muted}
		}
	}
	return out, iter.Close()
}

// casMembers writes chs (rows of one partition) in one conditional batch
// and reports whether it applied. An unknown outcome is settled by
// reading the rows at SERIAL (which finishes a Paxos round in progress):
// the batch applied if every row is the one it writes.
func (s *Store) casMembers(ctx context.Context, conv, epoch uint64, chs []memberChange) (bool, error) {
	s.paxos.Add(1)
	b := s.sess.Batch(gocql.UnloggedBatch).WithContext(ctx).Consistency(s.cons).SerialConsistency(s.serial)
	for i, c := range chs {
		var cond string
		args := append(slices.Clone(c.args), i64(conv), c.want.UserID)
		if i == 0 && epoch != 0 {
			cond, args = `fence = ? AND `, append(args, i64(epoch))
		}
		switch {
		case !c.had:
			cond += `join_seq = null`
		case c.cur.LeaveSeq == 0:
			cond, args = cond+`join_seq = ? AND leave_seq = null`, append(args, i64(c.cur.JoinSeq))
		default:
			cond, args = cond+`join_seq = ? AND leave_seq = ?`, append(args, i64(c.cur.JoinSeq), i64(c.cur.LeaveSeq))
		}
		b.Query(`UPDATE members SET `+c.set+` WHERE conv_id = ? AND user_id = ? IF `+cond, args...)
	}
	applied, iter, err := b.MapExecCAS(map[string]any{})
	if iter != nil {
		if cerr := iter.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		return applied, nil
	}
	users := make([]string, len(chs))
	for i, c := range chs {
		users[i] = c.want.UserID
	}
	got, rerr := s.readMembers(ctx, conv, users, true)
	if rerr != nil {
		return false, errors.Join(err, rerr)
	}
	for _, c := range chs {
		if g, ok := got[c.want.UserID]; !ok || g != c.want {
			return false, nil
		}
	}
	return true, nil
}

// checkFence returns store.ErrNotOwner (and gives epoch up) if the
// members partition's fence is no longer epoch: a newer owner loaded the
// conversation.
func (s *Store) checkFence(ctx context.Context, st *convState, epoch uint64) error {
	var fence *int64
	err := s.serialRead(ctx, `SELECT fence FROM members WHERE conv_id = ? LIMIT 1`, i64(st.id)).Scan(&fence)
	if err != nil && !errors.Is(err, gocql.ErrNotFound) {
		return err
	}
	if fence != nil && u64(*fence) == epoch {
		return nil
	}
	s.lostEpoch(&st.own, epoch)
	return fmt.Errorf("%w: members fenced at epoch %v, not %d", store.ErrNotOwner, fence, epoch)
}

// afterMembers finishes a membership change whose member rows chs are
// written: the users' conversation rows (rows adds each one's statements
// to a batch of its partition), the member count moved by delta and, on
// the owned path, the lease confirmation that makes the change
// acknowledgeable, all at once. A stale owner's change that its fence did
// not refuse (it landed before the newer owner loaded the conversation,
// which then sees it) fails the confirmation: never acknowledged.
func (s *Store) afterMembers(ctx context.Context, st *convState, epoch uint64, chs []memberChange, delta int,
	rows func(b *gocql.Batch, c memberChange)) error {
	if len(chs) == 0 && epoch == 0 {
		return nil
	}
	var rowsErr, countErr, leaseErr error
	var wg sync.WaitGroup
	if len(chs) > 0 && rows != nil {
		wg.Go(func() {
			rowsErr = s.each(ctx, len(chs), func(ctx context.Context, i int) error {
				b := s.sess.Batch(gocql.UnloggedBatch).WithContext(ctx).Consistency(s.cons)
				rows(b, chs[i])
				return b.Exec()
			})
		})
	}
	if delta != 0 {
		wg.Go(func() { countErr = s.addToCount(ctx, st.id, delta) })
	}
	if epoch != 0 {
		wg.Go(func() {
			if err := s.lease.Confirm(ctx, st.id, epoch); err != nil {
				s.lostEpoch(&st.own, epoch)
				s.log.Warn("cassandra: lease lost during a membership change; not acknowledged", logKeyConv, st.id, logKeyErr, err)
				leaseErr = fmt.Errorf("%w: %v", store.ErrNotOwner, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(leaseErr, rowsErr, countErr)
}

// queryRaise adds to b the statement raiseRow runs.
func queryRaise(b *gocql.Batch, conv uint64, user string, seq uint64, mention bool) {
	if seq == 0 {
		return
	}
	if mention {
		b.Query(`UPDATE user_conversations USING TIMESTAMP ? SET last_seq = ?, mention_seq = ? WHERE user_id = ? AND conv_id = ?`,
			i64(seq), i64(seq), i64(seq), user, i64(conv))
		return
	}
	b.Query(`UPDATE user_conversations USING TIMESTAMP ? SET last_seq = ? WHERE user_id = ? AND conv_id = ?`,
		i64(seq), i64(seq), user, i64(conv))
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
	epoch, last, err := s.memberBase(ctx, st)
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
	everyone := st.everyone
	var distinct []string
	seen := make(map[string]bool, len(users))
	for _, u := range users {
		if !seen[u] {
			seen[u] = true
			distinct = append(distinct, u)
		}
	}
	var early error
	left, err := s.changeMembers(ctx, st, epoch, distinct, func(u string, cur store.Member, had bool) (memberChange, bool) {
		if !had || cur.LeaveSeq != 0 {
			return memberChange{}, false
		}
		if last == 0 {
			early = fmt.Errorf("remove %s before the first message: %w", u, store.ErrConflict)
			return memberChange{}, false
		}
		want := cur
		want.LeaveSeq = last
		return memberChange{had: true, cur: cur, want: want, set: `leave_seq = ?`, args: []any{i64(last)}}, true
	})
	if early != nil {
		return nil, early // nothing written: last is 0 for every chunk
	}
	// Those already removed stay removed, even when the change failed
	// later: their rows and the count follow.
	err = errors.Join(err, s.afterMembers(ctx, st, epoch, left, -len(left), func(b *gocql.Batch, c memberChange) {
		u := c.want.UserID
		b.Query(`UPDATE user_conversations SET kind = ?, join_seq = ?, leave_seq = ? WHERE user_id = ? AND conv_id = ?`,
			int8(st.kind), i64(c.cur.JoinSeq), i64(last), u, i64(conv))
		queryRaise(b, conv, u, last, false)
		if everyone != 0 && everyone >= c.cur.JoinSeq {
			queryRaise(b, conv, u, everyone, true)
		}
	}))
	if err != nil {
		return nil, err
	}
	out := make([]store.Member, len(left))
	for i, c := range left {
		out[i] = c.want
	}
	return out, nil
}

// SetRole changes the role of a current member.
func (s *Store) SetRole(ctx context.Context, convID uint64, user string, role store.Role) error {
	const op = "set role"
	if err := s.changeMember(ctx, convID, user, func(m *store.Member) { m.Role = role }); err != nil {
		return fmt.Errorf("cassandra: %s %d %s: %w", op, convID, user, err)
	}
	return nil
}

// SetMuted mutes or unmutes a current member.
func (s *Store) SetMuted(ctx context.Context, convID uint64, user string, muted bool) error {
	const op = "set muted"
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
	epoch, _, err := s.memberBase(ctx, st)
	if err != nil {
		return err
	}
	member := true
	changed, err := s.changeMembers(ctx, st, epoch, []string{user}, func(u string, cur store.Member, had bool) (memberChange, bool) {
		member = had && cur.LeaveSeq == 0
		if !member {
			return memberChange{}, false
		}
		want := cur
		change(&want)
		if want == cur {
			return memberChange{}, false
		}
		return memberChange{had: true, cur: cur, want: want, set: `role = ?, muted = ?`, args: []any{int8(want.Role), want.Muted}}, true
	})
	if err == nil && !member {
		return store.ErrNotMember
	}
	return errors.Join(err, s.afterMembers(ctx, st, epoch, changed, 0, nil))
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
