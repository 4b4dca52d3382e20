package cassandra

import (
	"context"
	"errors"
	"fmt"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/parley-im/parley/internal/store"
)

// Positions are max-registers: a raise is written USING TIMESTAMP seq, so
// the highest seq wins however the writes interleave, with no read before
// the write and no transaction. The read after the write returns the
// position after the call, which is at least seq.

// SetRead raises the read position of (user, device, conv) to seq.
func (s *Store) SetRead(ctx context.Context, user, device string, convID, seq uint64) (uint64, error) {
	const op = "set read"
	v, err := s.raiseRead(ctx, user, device, convID, seq)
	if err != nil {
		return 0, fmt.Errorf("cassandra: %s: %w", op, err)
	}
	return v, nil
}

// raiseRead raises a read position to seq and returns it.
func (s *Store) raiseRead(ctx context.Context, user, device string, convID, seq uint64) (uint64, error) {
	return s.raise(ctx, seq,
		`UPDATE read_positions USING TIMESTAMP ? SET seq = ? WHERE user_id = ? AND conv_id = ? AND device = ?`,
		`SELECT seq FROM read_positions WHERE user_id = ? AND conv_id = ? AND device = ?`,
		user, i64(convID), device)
}

// Read returns the read position of (user, device, conv), 0 if none.
func (s *Store) Read(ctx context.Context, user, device string, convID uint64) (uint64, error) {
	const op = "read"
	v, err := s.position(ctx, `SELECT seq FROM read_positions WHERE user_id = ? AND conv_id = ? AND device = ?`,
		user, i64(convID), device)
	if err != nil {
		return 0, fmt.Errorf("cassandra: %s: %w", op, err)
	}
	return v, nil
}

// SetDelivered raises the delivered position of (user, conv) to seq.
func (s *Store) SetDelivered(ctx context.Context, user string, convID, seq uint64) (uint64, error) {
	const op = "set delivered"
	v, err := s.raise(ctx, seq,
		`UPDATE delivered_positions USING TIMESTAMP ? SET seq = ? WHERE user_id = ? AND conv_id = ?`,
		`SELECT seq FROM delivered_positions WHERE user_id = ? AND conv_id = ?`,
		user, i64(convID))
	if err != nil {
		return 0, fmt.Errorf("cassandra: %s: %w", op, err)
	}
	return v, nil
}

// RaiseDelivered raises delivered positions as SetDelivered does, without
// reading them back, in group-committed batches (commit.go): the chat
// service's periodic flush of every position raised meanwhile.
func (s *Store) RaiseDelivered(ctx context.Context, ps []store.Delivered) error {
	const op = "raise delivered"
	const chunk = 32 // statements a request; the committer groups requests
	var stmts []stmt
	for _, p := range ps {
		if p.Seq == 0 {
			continue
		}
		if p.Seq > maxSeq {
			return fmt.Errorf("cassandra: %s: seq %d beyond 2^63", op, p.Seq)
		}
		stmts = append(stmts, stmt{`UPDATE delivered_positions USING TIMESTAMP ? SET seq = ? WHERE user_id = ? AND conv_id = ?`,
			[]any{i64(p.Seq), i64(p.Seq), p.User, i64(p.ConvID)}})
	}
	n := (len(stmts) + chunk - 1) / chunk
	if n == 0 {
		return nil
	}
	if err := s.each(ctx, n, func(ctx context.Context, i int) error {
		return s.commit.exec(ctx, stmts[i*chunk:min((i+1)*chunk, len(stmts))])
	}); err != nil {
		return fmt.Errorf("cassandra: %s: %w", op, err)
	}
	return nil
}

var _ store.DeliveredRaiser = (*Store)(nil)

// Delivered returns the delivered position of (user, conv), 0 if none.
func (s *Store) Delivered(ctx context.Context, user string, convID uint64) (uint64, error) {
	const op = "delivered"
	v, err := s.position(ctx, `SELECT seq FROM delivered_positions WHERE user_id = ? AND conv_id = ?`, user, i64(convID))
	if err != nil {
		return 0, fmt.Errorf("cassandra: %s: %w", op, err)
	}
	return v, nil
}

// raise writes seq with update (binding timestamp, value, then key) and
// returns the position read back with get (binding key).
func (s *Store) raise(ctx context.Context, seq uint64, update, get string, key ...any) (uint64, error) {
	if seq > maxSeq {
		return 0, fmt.Errorf("seq %d beyond 2^63", seq)
	}
	if seq > 0 {
		args := append([]any{i64(seq), i64(seq)}, key...)
		if err := s.q(ctx, update, args...).Exec(); err != nil {
			return 0, err
		}
	}
	return s.position(ctx, get, key...)
}

func (s *Store) position(ctx context.Context, get string, key ...any) (uint64, error) {
	var v int64
	err := s.q(ctx, get, key...).Scan(&v)
	if errors.Is(err, gocql.ErrNotFound) {
		return 0, nil
	}
	return u64(v), err
}
