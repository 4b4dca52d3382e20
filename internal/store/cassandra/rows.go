package cassandra

import (
	"context"
	"fmt"

	"github.com/parley-im/parley/internal/store"
)

// UpdateRows is write fan-out: it raises the rows of the current members
// among users to LastSeq ≥ seq (and, with mention, MentionSeq ≥ seq). The
// members are read with one IN query on the conversation's members
// partition; each row is then one max-register write, so concurrent and
// repeated calls need no lock and never lower a row.
func (s *Store) UpdateRows(ctx context.Context, convID, seq uint64, users []string, mention bool) error {
	const op = "update rows"
	if err := s.updateRows(ctx, convID, seq, users, mention); err != nil {
		return fmt.Errorf("cassandra: %s %d: %w", op, convID, err)
	}
	return nil
}

func (s *Store) updateRows(ctx context.Context, conv, seq uint64, users []string, mention bool) error {
	if err := s.check(ctx, conv); err != nil {
		return err
	}
	if seq == 0 {
		return nil
	}
	if seq > maxSeq {
		return fmt.Errorf("seq %d beyond 2^63", seq)
	}
	seen := make(map[string]bool, len(users))
	valid := users[:0:0]
	for _, u := range users {
		if !seen[u] {
			seen[u] = true
			valid = append(valid, u)
		}
	}
	current, err := s.membersAt(ctx, conv, valid, seq)
	if err != nil {
		return err
	}
	return s.each(ctx, len(current), func(ctx context.Context, i int) error {
		return s.raiseRow(ctx, conv, current[i], seq, mention)
	})
}

// membersAt returns the users whose membership of conv holds seq: current
// members, and former ones whose leave_seq is at or above it.
func (s *Store) membersAt(ctx context.Context, conv uint64, users []string, seq uint64) ([]string, error) {
	const maxIn = 100
	var out []string
	for len(users) > 0 {
		n := min(len(users), maxIn)
		iter := s.q(ctx, `SELECT user_id, join_seq, leave_seq FROM members WHERE conv_id = ? AND user_id IN ?`, i64(conv), users[:n]).Iter()
		var (
			user        string
			join, leave int64
		)
		for iter.Scan(&user, &join, &leave) {
			if seq >= u64(join) && (leave == 0 || seq <= u64(leave)) {
				out = append(out, user)
			}
		}
		if err := iter.Close(); err != nil {
			return nil, err
		}
		users = users[n:]
	}
	return out, nil
}

// UserConversations lists user's conversation rows, former memberships
// included, in conversation id order. A row without a kind was written by
// a raise that raced the row's creation and is skipped; a former member's
// LastSeq and MentionSeq are capped at its LeaveSeq, since a fan-out of a
// seq another process claimed just before the leave may land after it.
func (s *Store) UserConversations(ctx context.Context, user string) ([]store.ConvRow, error) {
	const op = "user conversations"
	iter := s.q(ctx, `SELECT conv_id, kind, join_seq, leave_seq, last_seq, mention_seq FROM user_conversations WHERE user_id = ?`, user).Iter()
	var (
		out                                []store.ConvRow
		conv, join, leave, last, mentioned int64
		kind                               *int8
	)
	for iter.Scan(&conv, &kind, &join, &leave, &last, &mentioned) {
		if kind == nil {
			continue
		}
		r := store.ConvRow{ConvID: u64(conv), UserID: user, Kind: store.ConvKind(*kind),
			JoinSeq: u64(join), LeaveSeq: u64(leave), LastSeq: u64(last), MentionSeq: u64(mentioned)}
		if r.LeaveSeq != 0 {
			r.LastSeq, r.MentionSeq = min(r.LastSeq, r.LeaveSeq), min(r.MentionSeq, r.LeaveSeq)
		}
		out = append(out, r)
		kind = nil
	}
	if err := iter.Close(); err != nil {
		return nil, fmt.Errorf("cassandra: %s: %w", op, err)
	}
	return out, nil
}
