package pebble

import (
	"github.com/parley-im/parley/internal/store"
)

// Coalescible messages: a message with a CoalesceKey is a state
// update, and only the latest one of its conversation with that key carries
// its body on reads. Append keeps the K row of (conv, key) at the latest
// seq in the message's own batch; reads compare each state message's seq
// with it. Superseded messages keep their seq and every field but the body,
// so the seq stays dense for clients' gap detection.

// coalesceLatest returns the K row of (conv, key): the latest applied seq of
// a message with that key, 0 if none.
func (s *Store) coalesceLatest(conv uint64, key string) (uint64, error) {
	v, found, err := s.get(coalesceKey(conv, key))
	if err != nil || !found {
		return 0, err
	}
	return decodeUint(v)
}

// supersede marks the state messages among msgs that a later message with
// the same key replaced, as seen at durable watermark d: a newer state that
// a crash could still take back must not hide an older durable one.
func (s *Store) supersede(st *convState, msgs []store.Message, d uint64) error {
	var latest map[string]uint64
	for i := range msgs {
		m := &msgs[i]
		if m.CoalesceKey == "" {
			continue
		}
		l, ok := latest[m.CoalesceKey]
		if !ok {
			stored, err := s.coalesceLatest(st.id, m.CoalesceKey)
			if err != nil {
				return err
			}
			l = st.latestAt(m.CoalesceKey, stored, d)
			if latest == nil {
				latest = make(map[string]uint64)
			}
			latest[m.CoalesceKey] = l
		}
		if l > m.Seq {
			m.Superseded, m.Body = true, ""
		}
	}
	return nil
}
