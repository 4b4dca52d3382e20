package pebble

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/parley-im/parley/internal/store"
)

// The outbox (store.Store.Append, Pending, FanoutDone): Append writes the
// O row of its message in the message's batch, so a message is never
// durable without its fan-out recorded as outstanding; FanoutDone deletes
// O rows without fsync: an entry that a crash brings back only repeats
// fan-out, which is idempotent.

// Pending lists up to limit O rows of durable messages in key order.
func (s *Store) Pending(ctx context.Context, limit int) ([]store.Pending, error) {
	const op = "pending"
	var out []store.Pending
	err := s.scan([]byte{tagOutbox}, func(k, _ []byte) error {
		if len(out) >= limit {
			return errStop
		}
		if len(k) != 17 {
			return fmt.Errorf("outbox key %x: %w", k, errCorrupt)
		}
		p := store.Pending{ConvID: binary.BigEndian.Uint64(k[1:]), Seq: binary.BigEndian.Uint64(k[9:])}
		// An entry above the durable watermark belongs to an append
		// still waiting for its fsync: not yet a stored message.
		st, err := s.readState(p.ConvID)
		if err != nil {
			return err
		}
		durable := st.durable.Load()
		s.release(st)
		if p.Seq <= durable {
			out = append(out, p)
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return nil, fmt.Errorf("pebble: %s: %w", op, err)
	}
	return out, nil
}

type stopError struct{}

func (stopError) Error() string { return "stop" }

var errStop error = stopError{}

// FanoutDone deletes the O rows of seqs in one unsynced batch.
func (s *Store) FanoutDone(ctx context.Context, convID uint64, seqs []uint64) error {
	const op = "fanout done"
	if err := s.fanoutDone(convID, seqs); err != nil {
		return fmt.Errorf("pebble: %s %d: %w", op, convID, err)
	}
	return nil
}

func (s *Store) fanoutDone(conv uint64, seqs []uint64) error {
	st, err := s.readState(conv)
	if err != nil {
		return err
	}
	s.release(st)
	if len(seqs) == 0 {
		return nil
	}
	b := s.db.NewBatch()
	defer b.Close()
	for _, seq := range seqs {
		if err := b.Delete(outboxKey(conv, seq), nil); err != nil {
			return err
		}
	}
	return s.db.Apply(b, noSyncWrite)
}
