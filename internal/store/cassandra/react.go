package cassandra

import (
	"context"
	"errors"
	"fmt"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/parley-im/parley/internal/store"
)

// Reactions (store/react.go): the target's counts are in its edit image,
// rewritten with the event like an edit's; the reactor's own set is a row
// of reactions, one partition per (conversation, user) ordered by seq,
// written once the event is stored. A crash between the two leaves the
// count with the event and the reactor's row without it (its next react
// of that emoji counts again); the row is never ahead of the counts.

// reaction is what an append that reacts carries between its Check and
// its end: the reactor's set after it.
type reaction struct {
	user   string
	target uint64
	mine   []string
}

// reactCheck wraps a.Check for a reaction, reading the reactor's set of
// the target first (under the conversation's mutex, as the rewrite runs).
// It returns a.Check unchanged and nil for any other append.
func (s *Store) reactCheck(ctx context.Context, conv uint64, a store.Append) (func(store.Message) (store.Message, error), *reaction, error) {
	if a.React == nil {
		return a.Check, nil, nil
	}
	before, err := s.mine(ctx, conv, a.Msg.Sender, a.Msg.TargetSeq)
	if err != nil {
		return nil, nil, err
	}
	r := &reaction{user: a.Msg.Sender, target: a.Msg.TargetSeq}
	check, react := a.Check, *a.React
	return func(t store.Message) (store.Message, error) {
		if check != nil {
			var err error
			if t, err = check(t); err != nil {
				return t, err
			}
		}
		t, next, err := store.ApplyReact(t, before, react)
		r.mine = next
		return t, err
	}, r, nil
}

func (s *Store) mine(ctx context.Context, conv uint64, user string, seq uint64) ([]string, error) {
	var es []string
	err := s.q(ctx, `SELECT emojis FROM reactions WHERE conv_id = ? AND user_id = ? AND seq = ?`,
		i64(conv), user, i64(seq)).Scan(&es)
	if errors.Is(err, gocql.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reactions of %s on %d: %w", user, seq, err)
	}
	return es, nil
}

// storeMine writes r's reactor's set once its event is stored; a failure
// is logged (the event is stored and acknowledged all the same).
func (s *Store) storeMine(ctx context.Context, conv uint64, r *reaction) {
	var err error
	if len(r.mine) == 0 {
		err = s.q(ctx, `DELETE FROM reactions WHERE conv_id = ? AND user_id = ? AND seq = ?`, i64(conv), r.user, i64(r.target)).Exec()
	} else {
		err = s.q(ctx, `INSERT INTO reactions (conv_id, user_id, seq, emojis) VALUES (?, ?, ?, ?)`, i64(conv), r.user, i64(r.target), r.mine).Exec()
	}
	if err != nil {
		s.log.Warn("cassandra: reaction: the reactor's set not written", logKeyConv, conv, logKeySeq, r.target, logKeyErr, err)
	}
}

// ReactedBy lists user's reactions to the messages of conv in [from, to].
func (s *Store) ReactedBy(ctx context.Context, conv uint64, user string, from, to uint64) ([]store.Reacted, error) {
	iter := s.q(ctx, `SELECT seq, emojis FROM reactions WHERE conv_id = ? AND user_id = ? AND seq >= ? AND seq <= ?`,
		i64(conv), user, i64(from), i64(min(to, 1<<63-1))).Iter()
	var (
		out []store.Reacted
		seq int64
		es  []string
	)
	for iter.Scan(&seq, &es) {
		if len(es) > 0 {
			out = append(out, store.Reacted{Seq: uint64(seq), Emojis: es})
		}
		es = nil
	}
	if err := iter.Close(); err != nil {
		return nil, fmt.Errorf("cassandra: reacted by: %w", err)
	}
	return out, nil
}
