package pebble

import (
	"context"
	"fmt"

	"github.com/parley-im/parley/internal/store"
)

// UpdateRows is write fan-out: it raises the U rows of the current members
// among users to LastSeq ≥ seq (and, with mention, MentionSeq ≥ seq) in one
// synced batch.
//
// It holds only the conversation's rowsMu, not the seq lock, so fan-out of
// one message runs alongside appends of the next ones. Like Append it
// applies the batch first and waits for the fsync after releasing the lock,
// so concurrent calls share fsyncs. A row applied but not yet synced may be
// read meanwhile; that is harmless because rows only go up and only to
// durable seqs: a crash can only lower a row to where fan-out had not
// reached yet, which compensation and the client's gap detection handle.
//
// A seq above the conversation's durable watermark is refused
// (store.ErrNotFound): fan-out follows a stored message, and a row must not
// point at a message a crash could take back.
func (s *Store) UpdateRows(ctx context.Context, convID, seq uint64, users []string, mention bool) error {
	const op = "update rows"
	if err := s.updateRows(convID, seq, users, mention); err != nil {
		return fmt.Errorf("pebble: %s %d: %w", op, convID, err)
	}
	return nil
}

func (s *Store) updateRows(conv, seq uint64, users []string, mention bool) error {
	st, err := s.readState(conv)
	if err != nil {
		return err
	}
	defer s.release(st)
	if d := st.durable.Load(); seq > d {
		return fmt.Errorf("seq %d is above the last stored seq %d: %w", seq, d, store.ErrNotFound)
	}
	b := s.db.NewBatch()
	defer b.Close()
	st.rowsMu.Lock()
	st.inline = nil // rows change under it
	seen := make(map[string]bool, len(users))
	current := false
	for _, u := range users {
		if seen[u] {
			continue
		}
		seen[u] = true
		r, found, err := s.convRow(u, conv)
		if err != nil {
			st.rowsMu.Unlock()
			return err
		}
		if !found || (r.LeaveSeq != 0 && seq > r.LeaveSeq) || seq < r.JoinSeq {
			// Not a member at seq; a former member's row still takes
			// seqs up to its leave_seq (fan-out may run after the leave).
			continue
		}
		current = true
		next := r
		next.LastSeq = max(r.LastSeq, seq)
		if mention {
			next.MentionSeq = max(r.MentionSeq, seq)
		}
		if next == r {
			continue
		}
		if err := b.Set(userConvKey(u, conv), encodeConvRow(next), nil); err != nil {
			st.rowsMu.Unlock()
			return err
		}
	}
	if !current {
		st.rowsMu.Unlock()
		return nil
	}
	if b.Empty() {
		// Every row was already there, maybe applied by a call still
		// waiting for its fsync: an empty WAL record joins that fsync, so
		// this call too returns only once the rows are durable.
		if err := b.LogData(nil, nil); err != nil {
			st.rowsMu.Unlock()
			return err
		}
	}
	err = s.db.ApplyNoSyncWait(b, syncWrite)
	st.rowsMu.Unlock()
	if err != nil {
		return err
	}
	if err := b.SyncWait(); err != nil {
		s.fail(err)
		return fmt.Errorf("wal sync: %w", err)
	}
	return nil
}

// convRow reads user's U row of conv.
func (s *Store) convRow(user string, conv uint64) (store.ConvRow, bool, error) {
	v, found, err := s.get(userConvKey(user, conv))
	if err != nil || !found {
		return store.ConvRow{}, false, err
	}
	r, err := decodeConvRow(user, conv, v)
	return r, err == nil, err
}

// UserConversations lists user's conversation rows, former memberships
// included, in conversation id order (the U keys' order).
func (s *Store) UserConversations(ctx context.Context, user string) ([]store.ConvRow, error) {
	const op = "user conversations"
	var out []store.ConvRow
	err := s.scan(userConvPrefix(user), func(k, v []byte) error {
		conv, ok := convOfUserConvKey(k)
		if !ok {
			return fmt.Errorf("conversation row key %x: %w", k, errCorrupt)
		}
		r, err := decodeConvRow(user, conv, v)
		out = append(out, r)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("pebble: %s: %w", op, err)
	}
	// AddMembers and RemoveMembers set LastSeq to the applied last seq in a
	// batch readable before its fsync; cap it like Conversation does.
	// Capped after the scan: a state that is loaded now was loaded before
	// any row the scan saw was written through it.
	for i := range out {
		out[i].LastSeq = s.capLastSeq(out[i].ConvID, out[i].LastSeq)
	}
	return out, nil
}
