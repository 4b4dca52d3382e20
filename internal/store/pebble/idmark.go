package pebble

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	cpebble "github.com/cockroachdb/pebble/v2"
)

// The message id watermark. An append checks that its msg id is not taken
// (a second chat process with the same node number, or a clock set back
// across a restart, would repeat ids); that check is a point lookup that
// finds nothing almost always. The store keeps a watermark instead: the N
// key holds a value at least every stored message's msg id, written in the
// batch of a message whose id exceeds it (raised by idMarkMargin, so about
// once a second with snowflake ids), and read at Open. An id above the
// watermark cannot be taken and needs no lookup; one at or below it (ids
// from a clock set back) is looked up. A store without an N key (written
// by a release that kept none) gets the watermark from one scan of its
// message keys at Open.
type idMark struct {
	// v is the watermark: at least the id of every message in the store.
	// MaxUint64 turns the shortcut off.
	v atomic.Uint64
	// mu serialises the appends that raise it, so the N key's last write
	// is its highest value.
	mu sync.Mutex
}

// idMarkMargin is how far above a message's id the watermark is raised:
// 2^32 snowflake ids are about one second (ids carry milliseconds << 22).
const idMarkMargin = 1 << 32

// loadIDMark reads the watermark at Open.
func (s *Store) loadIDMark() error {
	v, found, err := s.get(idMarkKey)
	if err != nil {
		return err
	}
	if found {
		if len(v) != 8 {
			return fmt.Errorf("msg id watermark: %d bytes", len(v))
		}
		s.idMark.v.Store(binary.BigEndian.Uint64(v))
		return nil
	}
	// No watermark yet: the highest id of the stored messages (none in a
	// new store).
	var high uint64
	it, err := s.db.NewIter(&cpebble.IterOptions{LowerBound: []byte{tagMessage}, UpperBound: []byte{tagMessage + 1}})
	if err != nil {
		return err
	}
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) != 21 {
			return errors.Join(fmt.Errorf("message key of %d bytes", len(k)), it.Close())
		}
		high = max(high, ^binary.BigEndian.Uint64(k[13:]))
		n++
	}
	if err := it.Close(); err != nil {
		return err
	}
	if n > 0 {
		s.log.Info("pebble: msg id watermark set from the stored messages", "messages", n)
	}
	s.idMark.v.Store(high)
	return nil
}

// idTakenMaybe reports whether msg id may already be stored, so that the
// append must look it up.
func (s *Store) idTakenMaybe(id uint64) bool { return id <= s.idMark.v.Load() }

// raiseIDMark is called, before the batch of a message with id is
// applied, when the id is above the watermark. It returns the N key's new
// value to write in that batch and done, to call once the batch is
// applied (ok reports whether it was); the appends that raise the
// watermark run one at a time between the two calls.
func (s *Store) raiseIDMark(id uint64) (val []byte, done func(ok bool)) {
	s.idMark.mu.Lock()
	next := uint64(math.MaxUint64)
	if id <= math.MaxUint64-idMarkMargin {
		next = id + idMarkMargin
	}
	if next <= s.idMark.v.Load() {
		s.idMark.mu.Unlock()
		return nil, func(bool) {}
	}
	return binary.BigEndian.AppendUint64(nil, next), func(ok bool) {
		if ok {
			s.idMark.v.Store(next)
		}
		s.idMark.mu.Unlock()
	}
}
