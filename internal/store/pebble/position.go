package pebble

import (
	"context"
	"fmt"
	"hash/maphash"

	"github.com/parley-im/parley/internal/store"
)

// Positions are written with NoSync (see the package comment): a later
// synced write or pebble's own WAL flush persists them.

// SetRead raises the read position of (user, device, conv) to seq.
func (s *Store) SetRead(ctx context.Context, user, device string, convID, seq uint64) (uint64, error) {
	const op = "set read"
	v, err := s.raise(readKey(user, convID, device), seq)
	if err != nil {
		return 0, fmt.Errorf("pebble: %s: %w", op, err)
	}
	return v, nil
}

// raiseReadBy raises the read position of Append.ReadBy to seq, its
// message, once the message is durable: a position never runs ahead of
// what a crash keeps. A failure leaves the raise to the caller (false).
func (s *Store) raiseReadBy(r store.Reader, conv, seq uint64) bool {
	if _, err := s.raise(readKey(r.User, conv, r.Device), seq); err != nil {
		s.log.Warn("pebble: append: read position of the sender not raised; left to the caller", "conv", conv, "seq", seq, logKeyErr, err)
		return false
	}
	return true
}

// Read returns the read position of (user, device, conv), 0 if none.
func (s *Store) Read(ctx context.Context, user, device string, convID uint64) (uint64, error) {
	const op = "read"
	v, err := s.position(readKey(user, convID, device))
	if err != nil {
		return 0, fmt.Errorf("pebble: %s: %w", op, err)
	}
	return v, nil
}

// SetDelivered raises the delivered position of (user, conv) to seq.
func (s *Store) SetDelivered(ctx context.Context, user string, convID, seq uint64) (uint64, error) {
	const op = "set delivered"
	v, err := s.raise(deliveredKey(user, convID), seq)
	if err != nil {
		return 0, fmt.Errorf("pebble: %s: %w", op, err)
	}
	return v, nil
}

// Delivered returns the delivered position of (user, conv), 0 if none.
func (s *Store) Delivered(ctx context.Context, user string, convID uint64) (uint64, error) {
	const op = "delivered"
	v, err := s.position(deliveredKey(user, convID))
	if err != nil {
		return 0, fmt.Errorf("pebble: %s: %w", op, err)
	}
	return v, nil
}

// raise sets the position at key to max(current, seq) and returns it.
func (s *Store) raise(key []byte, seq uint64) (uint64, error) {
	mu := &s.posLocks[maphash.Bytes(s.seed, key)%positionStripes]
	mu.Lock()
	defer mu.Unlock()
	cur, err := s.position(key)
	if err != nil || seq <= cur {
		return cur, err
	}
	if err := s.db.Set(key, encodeUint(seq), noSyncWrite); err != nil {
		return 0, err
	}
	return seq, nil
}

func (s *Store) position(key []byte) (uint64, error) {
	v, found, err := s.get(key)
	if err != nil || !found {
		return 0, err
	}
	return decodeUint(v)
}
