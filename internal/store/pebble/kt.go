package pebble

import (
	"context"
	"encoding/binary"
	"fmt"

	cpebble "github.com/cockroachdb/pebble/v2"

	"github.com/parley-im/parley/internal/store"
)

// The key transparency log (store.KT):
//
//	L      L | index u64        the leaf (an encoded entry)                   kt_leaves
//	Y      Y                    the log keys                                  kt_keys
//
// Appends and the keys' get-or-create run under ktMu: the check that an
// index is free and its write cannot interleave with another's.

const (
	tagKTLeaf = 'L'
	tagKTKeys = 'Y'
)

func ktLeafKey(index uint64) []byte {
	return binary.BigEndian.AppendUint64(tagged(tagKTLeaf, 9), index)
}

var ktKeysKey = []byte{tagKTKeys}

func (s *Store) KTAppend(ctx context.Context, index uint64, leaf []byte) error {
	const op = "kt append"
	s.ktMu.Lock()
	defer s.ktMu.Unlock()
	k := ktLeafKey(index)
	taken, err := s.exists(k)
	if err != nil {
		return fmt.Errorf("pebble: %s: %w", op, err)
	}
	if taken {
		return fmt.Errorf("pebble: %s: index %d is taken: %w", op, index, store.ErrConflict)
	}
	if err := s.db.Set(k, leaf, syncWrite); err != nil {
		s.fail(err)
		return fmt.Errorf("pebble: %s: %w", op, err)
	}
	return nil
}

func (s *Store) KTLeaves(ctx context.Context, from uint64, limit int) ([][]byte, error) {
	const op = "kt leaves"
	it, err := s.db.NewIter(&cpebble.IterOptions{LowerBound: ktLeafKey(from), UpperBound: prefixEnd([]byte{tagKTLeaf})})
	if err != nil {
		return nil, fmt.Errorf("pebble: %s: %w", op, err)
	}
	var out [][]byte
	next := from
	for ok := it.First(); ok && len(out) < limit; ok = it.Next() {
		if binary.BigEndian.Uint64(it.Key()[1:]) != next {
			break // a gap cannot happen (appends are at the size); stop at one anyway
		}
		v, err := it.ValueAndErr()
		if err != nil {
			_ = it.Close()
			return nil, fmt.Errorf("pebble: %s: %w", op, err)
		}
		out = append(out, append([]byte(nil), v...))
		next++
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("pebble: %s: %w", op, err)
	}
	return out, nil
}

func (s *Store) KTKeys(ctx context.Context, fresh []byte) ([]byte, error) {
	const op = "kt keys"
	s.ktMu.Lock()
	defer s.ktMu.Unlock()
	cur, found, err := s.get(ktKeysKey)
	if err != nil {
		return nil, fmt.Errorf("pebble: %s: %w", op, err)
	}
	if found {
		return cur, nil
	}
	if err := s.db.Set(ktKeysKey, fresh, syncWrite); err != nil {
		s.fail(err)
		return nil, fmt.Errorf("pebble: %s: %w", op, err)
	}
	return append([]byte(nil), fresh...), nil
}
