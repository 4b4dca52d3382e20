package cassandra

import (
	"context"
	"fmt"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/parley-im/parley/internal/store"
)

// Notification preferences (store.Notify): conv_mutes, partition user_id,
// clustering conv_id, so a user's mutes are one read; dnd, one row per
// user. Each write is a single idempotent statement.

func (s *Store) SetConvMute(ctx context.Context, user string, convID uint64, until int64) error {
	var err error
	if until == 0 {
		err = s.q(ctx, `DELETE FROM conv_mutes WHERE user_id = ? AND conv_id = ?`, user, i64(convID)).Exec()
	} else {
		err = s.q(ctx, `INSERT INTO conv_mutes (user_id, conv_id, mute_until) VALUES (?, ?, ?)`, user, i64(convID), until).Exec()
	}
	if err != nil {
		return fmt.Errorf("cassandra: set conv mute: %w", err)
	}
	return nil
}

func (s *Store) ConvMute(ctx context.Context, user string, convID uint64) (int64, error) {
	var until int64
	err := s.q(ctx, `SELECT mute_until FROM conv_mutes WHERE user_id = ? AND conv_id = ?`, user, i64(convID)).Scan(&until)
	if err == gocql.ErrNotFound {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("cassandra: conv mute: %w", err)
	}
	return until, nil
}

func (s *Store) ConvMutes(ctx context.Context, user string) (map[uint64]int64, error) {
	it := s.q(ctx, `SELECT conv_id, mute_until FROM conv_mutes WHERE user_id = ?`, user).Iter()
	out := map[uint64]int64{}
	var conv, until int64
	for it.Scan(&conv, &until) {
		out[u64(conv)] = until
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("cassandra: conv mutes: %w", err)
	}
	return out, nil
}

func (s *Store) SetDND(ctx context.Context, user string, d store.DND) error {
	var err error
	if d.Zero() {
		err = s.q(ctx, `DELETE FROM dnd WHERE user_id = ?`, user).Exec()
	} else {
		err = s.q(ctx, `INSERT INTO dnd (user_id, dnd_until, daily, start_min, end_min, utc_offset) VALUES (?, ?, ?, ?, ?, ?)`,
			user, d.Until, d.Daily, d.Start, d.End, d.Offset).Exec()
	}
	if err != nil {
		return fmt.Errorf("cassandra: set dnd: %w", err)
	}
	return nil
}

func (s *Store) DND(ctx context.Context, user string) (store.DND, error) {
	var d store.DND
	err := s.q(ctx, `SELECT dnd_until, daily, start_min, end_min, utc_offset FROM dnd WHERE user_id = ?`, user).
		Scan(&d.Until, &d.Daily, &d.Start, &d.End, &d.Offset)
	if err == gocql.ErrNotFound {
		return store.DND{}, nil
	}
	if err != nil {
		return store.DND{}, fmt.Errorf("cassandra: dnd: %w", err)
	}
	return d, nil
}
