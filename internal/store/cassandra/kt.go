package cassandra

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/parley-im/parley/internal/store"
)

// The key transparency log (store.KT) in two tables: kt_leaves, partition
// bucket = index / ktBucket, clustering index, so a page reads one or two
// partitions and no partition grows without bound; and kt_keys, one row.
// A leaf is written by a lightweight transaction, INSERT … IF NOT EXISTS:
// of two chat processes appending at the same index only one applies, so
// the log cannot fork; the loser catches up and appends after it.

// ktBucket is how many leaves one kt_leaves partition holds.
const ktBucket = 1000

func ktBucketOf(index uint64) int64 { return int64(index / ktBucket) }

func (s *Store) KTAppend(ctx context.Context, index uint64, leaf []byte) error {
	const op = "kt append"
	cur := map[string]any{}
	applied, err := s.lwt(ctx, `INSERT INTO kt_leaves (bucket, idx, leaf) VALUES (?, ?, ?) IF NOT EXISTS`,
		ktBucketOf(index), i64(index), leaf).MapScanCAS(cur)
	if err == nil {
		if !applied {
			return fmt.Errorf("cassandra: %s: index %d is taken: %w", op, index, store.ErrConflict)
		}
		return nil
	}
	// Unknown outcome: read the leaf at SERIAL, which completes a round in
	// progress; ours is there, or another's, or none (not applied).
	var got []byte
	rerr := s.serialRead(ctx, `SELECT leaf FROM kt_leaves WHERE bucket = ? AND idx = ?`, ktBucketOf(index), i64(index)).Scan(&got)
	switch {
	case rerr == nil && bytes.Equal(got, leaf):
		return nil
	case rerr == nil:
		return fmt.Errorf("cassandra: %s: index %d is taken: %w", op, index, store.ErrConflict)
	}
	return fmt.Errorf("cassandra: %s: %w", op, errors.Join(err, rerr))
}

func (s *Store) KTLeaves(ctx context.Context, from uint64, limit int) ([][]byte, error) {
	const op = "kt leaves"
	var out [][]byte
	next := from
	for len(out) < limit {
		b := ktBucketOf(next)
		it := s.q(ctx, `SELECT idx, leaf FROM kt_leaves WHERE bucket = ? AND idx >= ? LIMIT ?`,
			b, i64(next), limit-len(out)).Iter()
		var (
			idx  int64
			leaf []byte
			gap  bool
		)
		for it.Scan(&idx, &leaf) {
			if u64(idx) != next {
				gap = true // appends are at the size, so none; stop at one anyway
				break
			}
			out = append(out, leaf)
			leaf = nil
			next++
		}
		if err := it.Close(); err != nil {
			return nil, fmt.Errorf("cassandra: %s: %w", op, err)
		}
		if gap || ktBucketOf(next) == b {
			break // the bucket ended before its last index: the log ends here
		}
	}
	return out, nil
}

func (s *Store) KTKeys(ctx context.Context, fresh []byte) ([]byte, error) {
	const op = "kt keys"
	cur := map[string]any{}
	applied, err := s.lwt(ctx, `INSERT INTO kt_keys (id, keyset) VALUES (0, ?) IF NOT EXISTS`, fresh).MapScanCAS(cur)
	if err == nil {
		if applied {
			return fresh, nil
		}
		if k, ok := cur["keyset"].([]byte); ok && len(k) > 0 {
			return k, nil
		}
		return nil, fmt.Errorf("cassandra: %s: the stored row has no keys", op)
	}
	var got []byte
	if rerr := s.serialRead(ctx, `SELECT keyset FROM kt_keys WHERE id = 0`).Scan(&got); rerr != nil || len(got) == 0 {
		return nil, fmt.Errorf("cassandra: %s: %w", op, errors.Join(err, rerr))
	}
	return got, nil
}
