package store

import (
	"context"
	"fmt"
)

// The key transparency log's storage: its leaves (the encoded entries, in
// order, each index written once) and the deployment's log keys. What the
// bytes mean is internal/kt's; the engines keep them opaque.

// Key transparency bounds: a leaf and the keys blob are small (an entry
// holds at most protocol.MaxKeyDevices devices), and a page is bounded.
const (
	MaxKTLeafBytes = 64 << 10
	MaxKTKeysBytes = 4 << 10
	MaxKTPage      = 1000
)

// KT is the key transparency part of a Store.
type KT interface {
	// KTAppend stores leaf at index, which must be the log's size (every
	// index below is stored): the conditional write that makes one writer
	// win when two processes append at once. ErrConflict when the index is
	// taken (another writer appended: catch up and retry); an index past
	// the size is a caller's bug the engines need not detect.
	KTAppend(ctx context.Context, index uint64, leaf []byte) error
	// KTLeaves returns up to limit (1..MaxKTPage) leaves from index from
	// on, in order, fewer at the end of the log (none at or past it).
	KTLeaves(ctx context.Context, from uint64, limit int) ([][]byte, error)
	// KTKeys returns the deployment's stored log keys, storing fresh when
	// there are none yet: every process of a deployment gets the same
	// keys, whichever called first (get-or-create with a conditional
	// write).
	KTKeys(ctx context.Context, fresh []byte) ([]byte, error)
}

func (c *checked) KTAppend(ctx context.Context, index uint64, leaf []byte) error {
	const op = "kt append"
	if err := c.enterWrite(ctx, op); err != nil {
		return err
	}
	defer c.gate.RUnlock()
	if len(leaf) == 0 || len(leaf) > MaxKTLeafBytes || index >= 1<<63 {
		return fmt.Errorf("%s: %s: a leaf of %d bytes at %d (1..%d bytes below 2^63)", c.name, op, len(leaf), index, MaxKTLeafBytes)
	}
	return c.e.KTAppend(ctx, index, leaf)
}

func (c *checked) KTLeaves(ctx context.Context, from uint64, limit int) ([][]byte, error) {
	const op = "kt leaves"
	if err := c.enter(ctx, op); err != nil {
		return nil, err
	}
	defer c.gate.RUnlock()
	if limit < 1 || limit > MaxKTPage {
		return nil, fmt.Errorf("%s: %s: limit %d outside 1..%d", c.name, op, limit, MaxKTPage)
	}
	if from >= 1<<63 {
		return nil, nil // no such leaf
	}
	return c.e.KTLeaves(ctx, from, limit)
}

func (c *checked) KTKeys(ctx context.Context, fresh []byte) ([]byte, error) {
	const op = "kt keys"
	if err := c.enterWrite(ctx, op); err != nil {
		return nil, err
	}
	defer c.gate.RUnlock()
	if len(fresh) == 0 || len(fresh) > MaxKTKeysBytes {
		return nil, fmt.Errorf("%s: %s: keys of %d bytes (1..%d)", c.name, op, len(fresh), MaxKTKeysBytes)
	}
	return c.e.KTKeys(ctx, fresh)
}
