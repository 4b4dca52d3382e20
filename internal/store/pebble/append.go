package pebble

import (
	"context"
	"errors"
	"fmt"
	"slices"

	cpebble "github.com/cockroachdb/pebble/v2"

	"github.com/parley-im/parley/internal/store"
)

// Append durably stores a.Msg with the next seq of its conversation. It
// writes no conversation rows; that is UpdateRows.
//
// A message with an empty ClientMsgID is never deduplicated; a duplicate
// returns the original as stored, its durable edits applied but never marked
// Superseded. With TargetSeq != 0 the target must exist; if a.Check is nil
// the event is stored without rewriting the target. Check may change the
// target's content and flags; its identity (conversation, seq, msg id,
// server time) and its CoalesceKey, which indexes it, are kept.
func (s *Store) Append(ctx context.Context, a store.Append) (store.AppendResult, error) {
	const op = "append"
	// The result is shared with waiting duplicates: it must not alias the
	// caller's slice. Superseded is never stored.
	a.Msg.Mentions = cloneMentions(a.Msg.Mentions)
	a.Msg.Superseded = false
	res, err := s.append(ctx, a)
	if ce, ok := err.(checkError); ok {
		return store.AppendResult{}, ce.err
	}
	if err != nil {
		return store.AppendResult{}, fmt.Errorf("pebble: %s: %w", op, err)
	}
	return res, nil
}

// cloneMentions copies ms, with nil for none so that a message reads back
// as it was appended.
func cloneMentions(ms []string) []string {
	if len(ms) == 0 {
		return nil
	}
	return append([]string(nil), ms...)
}

// checkError carries an error of Append.Check, which Append returns
// unchanged: the caller decides the policy and matches its own errors.
type checkError struct{ err error }

func (e checkError) Error() string { return e.err.Error() }

func (s *Store) append(ctx context.Context, a store.Append) (store.AppendResult, error) {
	conv := a.Msg.ConvID
	var idem string
	if a.Msg.ClientMsgID != "" {
		idem = a.Msg.Sender + "\x00" + a.Msg.ClientMsgID
	}
	st, err := s.lockState(conv, false)
	if err != nil {
		return store.AppendResult{}, err
	}
	defer s.release(st)
	for relock := false; ; relock = true {
		if relock {
			st.mu.Lock()
		}
		if p := s.broken.Load(); p != nil {
			st.mu.Unlock()
			return store.AppendResult{}, fmt.Errorf("store failed earlier: %w", *p)
		}
		if idem == "" {
			return s.appendLocked(st, a, "")
		}
		if p := st.inflight[idem]; p != nil {
			st.mu.Unlock()
			select {
			case <-p.done:
			case <-ctx.Done():
				return store.AppendResult{}, ctx.Err()
			}
			if p.err == nil {
				dup := p.msg
				dup.Mentions = cloneMentions(dup.Mentions)
				return store.AppendResult{Msg: dup, Duplicate: true}, nil
			}
			continue // the original failed and stored nothing: take its place
		}
		v, found, err := s.get(idemKey(conv, a.Msg.Sender, a.Msg.ClientMsgID))
		if err != nil {
			st.mu.Unlock()
			return store.AppendResult{}, err
		}
		if !found {
			return s.appendLocked(st, a, idem)
		}
		st.mu.Unlock()
		// Not in flight, so the original's fsync has completed.
		seq, err := decodeUint(v)
		if err != nil {
			return store.AppendResult{}, err
		}
		orig, err := s.messageAt(conv, seq)
		if err != nil {
			return store.AppendResult{}, fmt.Errorf("original of %q: %w", a.Msg.ClientMsgID, err)
		}
		// The original may have been edited since; show its durable version.
		one := []store.Message{orig}
		st.visible(one, st.durable.Load())
		return store.AppendResult{Msg: one[0], Duplicate: true}, nil
	}
}

// appendLocked runs with st.mu held and releases it.
func (s *Store) appendLocked(st *convState, a store.Append, idem string) (res store.AppendResult, err error) {
	conv := st.id
	seq := st.row.LastSeq + 1
	m := a.Msg
	m.Seq = seq
	// Images hide a batch until it is durable; they go if it is never
	// applied. After a failed fsync they stay: the store is broken and the
	// batch may or may not survive a restart.
	locked, applied, overlaid, keyed, rowsLocked := true, false, false, false, false
	var inline []store.ConvRow
	defer func() {
		if rowsLocked {
			st.rowsMu.Unlock()
		}
		if err != nil && !applied && overlaid {
			st.dropRewrite(m.TargetSeq, seq)
		}
		if err != nil && !applied && keyed {
			st.dropKeyImage(m.CoalesceKey, seq)
		}
		if locked {
			st.mu.Unlock()
		}
	}()
	bucket := bucketOf(m.ServerTime, s.bucketMS)
	mkey := msgKey(conv, bucket, m.MsgID)
	if s.idTakenMaybe(m.MsgID) {
		// At or below the watermark (idmark.go): look the id up.
		taken, err := s.exists(mkey)
		if err != nil {
			return res, err
		}
		if taken {
			return res, fmt.Errorf("msg id %d: %w", m.MsgID, store.ErrConflict)
		}
	}

	b := s.db.NewBatch()
	defer b.Close()
	recall := false
	if m.TargetSeq != 0 {
		check := a.Check
		var mine []string
		if a.React != nil {
			before, err := s.mine(conv, m.Sender, m.TargetSeq)
			if err != nil {
				return res, err
			}
			check = reactCheck(a.Check, before, *a.React, &mine)
		}
		// A reaction keeps no version of its target: AsOf restores
		// bodies, and counts are shown as they are now.
		if overlaid, recall, err = s.rewriteTarget(st, b, check, m.TargetSeq, seq, a.React == nil); err != nil {
			return res, err
		}
		if a.React != nil {
			if err = setMine(b, conv, m.Sender, m.TargetSeq, mine); err != nil {
				return res, err
			}
		}
	}
	row := st.row
	row.LastSeq = seq
	if m.MentionAll {
		row.EveryoneSeq = seq
	}
	kvs := [][2][]byte{
		{mkey, encodeMessage(m)},
		{seqKey(conv, seq), encodeSeqRef(seqRef{bucket: bucket, msgID: m.MsgID})},
		{convKey(conv), encodeConv(row)},
	}
	if idem != "" {
		kvs = append(kvs, [2][]byte{idemKey(conv, m.Sender, m.ClientMsgID), encodeUint(seq)})
	}
	// The outbox entry (outbox.go): durable with the message.
	kvs = append(kvs, [2][]byte{outboxKey(conv, seq), nil})
	if a.Rows {
		// Write fan-out in the same batch; rowsMu is held until the batch
		// is applied so a concurrent UpdateRows cannot lower what it sets.
		st.rowsMu.Lock()
		rowsLocked = true
		rkvs, next, err := s.memberRows(st, m)
		if err != nil {
			return res, err
		}
		kvs = append(kvs, rkvs...)
		inline = next
	}
	if m.CoalesceKey != "" {
		// Every K write of the conversation runs under st.mu, so prev is
		// the latest applied seq of the key.
		prev, err := s.coalesceLatest(conv, m.CoalesceKey)
		if err != nil {
			return res, err
		}
		kvs = append(kvs, [2][]byte{coalesceKey(conv, m.CoalesceKey), encodeUint(seq)})
		st.addKeyImage(m.CoalesceKey, seq, prev)
		keyed = true
	}
	for _, kv := range kvs {
		if err = b.Set(kv[0], kv[1], nil); err != nil {
			return res, err
		}
	}

	markDone := func(bool) {}
	if !s.idTakenMaybe(m.MsgID) {
		var mark []byte
		if mark, markDone = s.raiseIDMark(m.MsgID); mark != nil {
			if err = b.Set(idMarkKey, mark, nil); err != nil {
				markDone(false)
				return res, err
			}
		}
	}
	var p *pendingAppend
	if idem != "" {
		p = &pendingAppend{done: make(chan struct{})}
		if st.inflight == nil {
			st.inflight = make(map[string]*pendingAppend)
		}
		st.inflight[idem] = p
	}
	err = s.db.ApplyNoSyncWait(b, syncWrite)
	markDone(err == nil)
	if err != nil {
		if p != nil {
			st.doneInflight(idem)
			p.err = err
			close(p.done)
		}
		return res, err
	}
	applied = true
	st.setRow(row)
	if rowsLocked {
		st.inline = inline
		st.rowsMu.Unlock()
		rowsLocked = false
	}
	locked = false
	st.mu.Unlock()

	// Group commit: this fsync is shared with every batch written meanwhile.
	serr := b.SyncWait()
	if serr != nil {
		s.fail(serr)
	} else {
		st.raiseDurable(seq)
	}
	if p != nil {
		st.mu.Lock()
		st.doneInflight(idem)
		st.mu.Unlock()
		p.msg, p.err = m, serr
		close(p.done)
	}
	if serr != nil {
		return res, fmt.Errorf("wal sync: %w", serr)
	}
	if recall {
		s.dropVersions(conv, m.TargetSeq)
	}
	res = store.AppendResult{Msg: m, RowsWritten: a.Rows}
	if a.ReadBy != nil {
		res.ReadRaised = s.raiseReadBy(*a.ReadBy, conv, seq)
	}
	return res, nil
}

// memberRows returns the U rows of conv's current members raised to m's
// seq (and mention seq), for Append.Rows, and the rows as they will be. It
// runs under mu and rowsMu.
func (s *Store) memberRows(st *convState, m store.Message) ([][2][]byte, []store.ConvRow, error) {
	rows := st.inline
	if rows == nil {
		members, err := s.currentMembers(st.id)
		if err != nil {
			return nil, nil, err
		}
		st.members.Store(&members)
		rows = make([]store.ConvRow, 0, len(members))
		for _, mb := range members {
			r, found, err := s.convRow(mb.UserID, st.id)
			if err != nil {
				return nil, nil, err
			}
			if found && r.LeaveSeq == 0 {
				rows = append(rows, r)
			}
		}
	}
	var out [][2][]byte
	next := make([]store.ConvRow, len(rows))
	for i, r := range rows {
		n := r
		n.LastSeq = max(r.LastSeq, m.Seq)
		if m.MentionAll || slices.Contains(m.Mentions, r.UserID) {
			n.MentionSeq = max(r.MentionSeq, m.Seq)
		}
		next[i] = n
		if n != r {
			out = append(out, [2][]byte{userConvKey(r.UserID, st.id), encodeConvRow(n)})
		}
	}
	return out, next, nil
}

// currentMembers scans conv's B rows for the current members.
func (s *Store) currentMembers(conv uint64) ([]store.Member, error) {
	var out []store.Member
	err := s.scan(memberPrefix(conv), func(k, v []byte) error {
		user, ok := userOfMemberKey(k)
		if !ok {
			return fmt.Errorf("member key %x: %w", k, errCorrupt)
		}
		m, err := decodeMember(conv, user, v)
		if err == nil && m.LeaveSeq == 0 {
			out = append(out, m)
		}
		return err
	})
	return out, err
}

// rewriteTarget adds the target of an edit or recall, as check rewrites it,
// to b, and records its pre-edit image until event is durable. An edit also
// keeps that image as the target's version before event (H, read by AsOf);
// a recall reports itself, and the versions go once it is durable. It
// reports whether it recorded an image and whether the target is now
// recalled.
func (s *Store) rewriteTarget(st *convState, b *cpebble.Batch, check func(store.Message) (store.Message, error), target, event uint64, versioned bool) (overlaid, recall bool, err error) {
	if target > st.row.LastSeq {
		return false, false, fmt.Errorf("target %d: %w", target, store.ErrNotFound)
	}
	ref, old, err := s.seqEntry(st.id, target)
	if err != nil {
		return false, false, fmt.Errorf("target %d: %w", target, err)
	}
	if check == nil {
		return false, false, nil
	}
	next, err := check(old)
	if err != nil {
		return false, false, checkError{err}
	}
	next.ConvID, next.Seq, next.MsgID, next.ServerTime = old.ConvID, old.Seq, old.MsgID, old.ServerTime
	next.CoalesceKey, next.Superseded, next.ReplyTo = old.CoalesceKey, false, old.ReplyTo
	next.Mentions = cloneMentions(next.Mentions)
	if next.Recalled {
		next.Reactions = nil
	}
	if err := b.Set(msgKey(st.id, ref.bucket, ref.msgID), encodeMessage(next), nil); err != nil {
		return false, false, err
	}
	recall = next.Recalled && !old.Recalled
	if versioned && !next.Recalled {
		if err := b.Set(versionKey(st.id, target, event), encodeMessage(old), nil); err != nil {
			return false, false, err
		}
	}
	st.addRewrite(target, event, old)
	return true, recall, nil
}

// dropVersions deletes the versions of a recalled target once the recall is
// durable (before, a crash could bring the message back and its versions
// with it). Without sync and best effort: AsOf never reads the versions of
// a recalled message, so leftovers of a crash only take space.
func (s *Store) dropVersions(conv, target uint64) {
	p := versionPrefix(conv, target)
	if err := s.db.DeleteRange(p, prefixEnd(p), cpebble.NoSync); err != nil {
		s.log.Warn("pebble: recall: versions of the target left behind", "conv", conv, "target", target, logKeyErr, err)
	}
}

// AsOf puts the edited messages of msgs back to what they were at asOf
// (store.Store): the target's version before its first edit above asOf,
// which holds what the message was after every edit up to asOf.
func (s *Store) AsOf(ctx context.Context, convID, asOf uint64, msgs []store.Message) error {
	const op = "as of"
	for i := range msgs {
		m := &msgs[i]
		if !m.Edited || m.Recalled || m.Seq > asOf || m.ConvID != convID {
			continue
		}
		v, found, err := s.firstAbove(versionPrefix(convID, m.Seq), versionKey(convID, m.Seq, asOf+1))
		if err != nil {
			return fmt.Errorf("pebble: %s %d: %w", op, convID, err)
		}
		if !found {
			continue // every edit is at or below asOf
		}
		old, err := decodeMessage(convID, v)
		if err != nil {
			return fmt.Errorf("pebble: %s %d: version of %d: %w", op, convID, m.Seq, err)
		}
		m.Body, m.Edited = old.Body, old.Edited
	}
	return nil
}

// firstAbove returns the value of the first key ≥ from with prefix p.
func (s *Store) firstAbove(p, from []byte) ([]byte, bool, error) {
	it, err := s.db.NewIter(&cpebble.IterOptions{LowerBound: from, UpperBound: prefixEnd(p)})
	if err != nil {
		return nil, false, err
	}
	if !it.First() {
		return nil, false, it.Close()
	}
	v, err := it.ValueAndErr()
	if err != nil {
		return nil, false, errors.Join(err, it.Close())
	}
	v = append([]byte(nil), v...)
	return v, true, it.Close()
}

// seqEntry reads the S row and the message of seq.
func (s *Store) seqEntry(conv, seq uint64) (seqRef, store.Message, error) {
	v, found, err := s.get(seqKey(conv, seq))
	if err != nil {
		return seqRef{}, store.Message{}, err
	}
	if !found {
		return seqRef{}, store.Message{}, store.ErrNotFound
	}
	ref, err := decodeSeqRef(v)
	if err != nil {
		return seqRef{}, store.Message{}, err
	}
	m, err := s.messageOf(conv, ref)
	return ref, m, err
}

func (s *Store) messageAt(conv, seq uint64) (store.Message, error) {
	_, m, err := s.seqEntry(conv, seq)
	return m, err
}

func (s *Store) messageOf(conv uint64, ref seqRef) (store.Message, error) {
	v, found, err := s.get(msgKey(conv, ref.bucket, ref.msgID))
	if err != nil {
		return store.Message{}, err
	}
	if !found {
		return store.Message{}, fmt.Errorf("message %d of the seq index: %w", ref.msgID, errCorrupt)
	}
	return decodeMessage(conv, v)
}

// Messages returns the messages with from ≤ seq ≤ to, lowest first, at most
// limit (limit ≤ 0 returns none).
func (s *Store) Messages(ctx context.Context, convID, from, to uint64, limit int) ([]store.Message, error) {
	const op = "messages"
	msgs, err := s.messages(convID, from, to, limit, false)
	if err != nil {
		return nil, fmt.Errorf("pebble: %s %d: %w", op, convID, err)
	}
	return msgs, nil
}

// Latest returns the highest ≤ n messages with floor ≤ seq < before (before
// 0: no upper bound), in ascending order.
func (s *Store) Latest(ctx context.Context, convID uint64, before, floor uint64, n int) ([]store.Message, error) {
	const op = "latest"
	to := before - 1 // before 0 wraps to no upper bound; before 1 leaves nothing

	msgs, err := s.messages(convID, floor, to, n, true)
	if err != nil {
		return nil, fmt.Errorf("pebble: %s %d: %w", op, convID, err)
	}
	return msgs, nil
}

// messages walks the S index over [from, to] capped at the durable
// watermark, from the low end or (newest) from the high end, and returns the
// messages in ascending order.
func (s *Store) messages(conv, from, to uint64, limit int, newest bool) ([]store.Message, error) {
	st, err := s.readState(conv)
	if err != nil {
		return nil, err
	}
	defer s.release(st)
	d := st.durable.Load() // before the reads: everything ≤ d is durable
	to = min(to, d)
	if limit <= 0 || from > to {
		return nil, nil
	}
	it, err := s.db.NewIter(&cpebble.IterOptions{
		LowerBound: seqKey(conv, from),
		UpperBound: seqKey(conv, to+1), // to ≤ d < MaxUint64
	})
	if err != nil {
		return nil, err
	}
	refs := make([]seqRef, 0, min(limit, int(to-from+1), 256))
	first, next := it.First, it.Next
	if newest {
		first, next = it.Last, it.Prev
	}
	for ok := first(); ok && len(refs) < limit; ok = next() {
		v, verr := it.ValueAndErr()
		if verr != nil {
			return nil, errors.Join(verr, it.Close())
		}
		ref, derr := decodeSeqRef(v)
		if derr != nil {
			return nil, errors.Join(derr, it.Close())
		}
		refs = append(refs, ref)
	}
	if err := it.Close(); err != nil {
		return nil, err
	}
	if newest {
		for i, j := 0, len(refs)-1; i < j; i, j = i+1, j-1 {
			refs[i], refs[j] = refs[j], refs[i]
		}
	}
	out := make([]store.Message, 0, len(refs))
	for _, ref := range refs {
		m, err := s.messageOf(conv, ref)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	st.visible(out, d)
	if err := s.supersede(st, out, d); err != nil {
		return nil, err
	}
	return out, nil
}

// doneInflight forgets the append of idem; mu held. An empty map goes, so
// an idle conversation keeps none (a map keeps its storage).
func (st *convState) doneInflight(idem string) {
	delete(st.inflight, idem)
	if len(st.inflight) == 0 {
		st.inflight = nil
	}
}
