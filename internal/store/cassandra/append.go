package cassandra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/parley-im/parley/internal/store"
)

// Append stores a.Msg with the next seq of its conversation (see the
// package comment for the protocol).
//
// It writes no conversation rows; that is UpdateRows. A message with an
// empty ClientMsgID is never deduplicated; a duplicate returns the original
// as stored, its edits applied but never marked Superseded. With TargetSeq != 0 the
// target must exist; if a.Check is nil the event is stored without
// rewriting the target. Check may run more than once when another process
// rewrites the target at the same time; only its last result is stored.
//
// An error means nothing was stored, except when the outcome of the seq
// claim could not be learnt (the error then says so): the message may then
// be stored, and a retry with the same client_msg_id finds it.
func (s *Store) Append(ctx context.Context, a store.Append) (store.AppendResult, error) {
	const op = "append"
	if a.Msg.MsgID > maxSeq { // a CQL bigint; 0 stops at the seam
		return store.AppendResult{}, fmt.Errorf("cassandra: %s: msg id %d outside [1, 2^63)", op, a.Msg.MsgID)
	}
	// The result is shared with waiting duplicates: it must not alias the
	// caller's slice. Superseded is never stored.
	a.Msg.Mentions = cloneMentions(a.Msg.Mentions)
	a.Msg.Superseded = false
	res, err := s.append(ctx, a)
	if ce, ok := err.(checkError); ok {
		return store.AppendResult{}, ce.err
	}
	if err != nil {
		return store.AppendResult{}, fmt.Errorf("cassandra: %s %d: %w", op, a.Msg.ConvID, err)
	}
	if a.ReadBy != nil && s.lease == nil && !res.Duplicate {
		// Owned appends write the position with the message's last
		// writes; without a lease it follows the message.
		res.ReadRaised = s.raiseReadBy(ctx, *a.ReadBy, a.Msg.ConvID, res.Msg.Seq)
	}
	return res, nil
}

// raiseReadBy raises the read position of Append.ReadBy to seq after an
// unowned append; a failure leaves it to the caller (false).
func (s *Store) raiseReadBy(ctx context.Context, r store.Reader, conv, seq uint64) bool {
	if _, err := s.raiseRead(ctx, r.User, r.Device, conv, seq); err != nil {
		s.log.Warn("cassandra: append: read position of the sender not raised; left to the caller", logKeyConv, conv, logKeySeq, seq, logKeyErr, err)
		return false
	}
	return true
}

// cloneMentions copies ms, with nil for none, so that a message reads back
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
	st, err := s.existing(ctx, a.Msg.ConvID)
	if err != nil {
		return store.AppendResult{}, err
	}
	defer s.release(st)
	var turn *store.Turn
	if s.lease != nil {
		// A pipeline's appends queue in the order sent (store.Turn),
		// each after the previous one queued (ownedAppend takes the
		// turn), and before a repeat of its client_msg_id is looked for:
		// a later append of the pipeline must not take an earlier one's
		// place as the original.
		turn = store.TurnOf(ctx)
		if err := turn.Wait(ctx); err != nil {
			return store.AppendResult{}, err
		}
	}
	if a.Msg.ClientMsgID == "" {
		return s.appendNew(ctx, st, a, false)
	}
	key := a.Msg.Sender + "\x00" + a.Msg.ClientMsgID
	for {
		st.inflight.mu.Lock()
		if p := st.inflight.m[key]; p != nil {
			st.inflight.mu.Unlock()
			turn.Take() // a repeat takes no seq of its own
			select {
			case <-p.done:
			case <-ctx.Done():
				return store.AppendResult{}, ctx.Err()
			}
			if p.err == nil {
				dup := p.res.Msg
				dup.Mentions = cloneMentions(dup.Mentions)
				return store.AppendResult{Msg: dup, Duplicate: true}, nil
			}
			continue // the original failed: take its place
		}
		p := &pendingAppend{done: make(chan struct{})}
		if st.inflight.m == nil {
			st.inflight.m = make(map[string]*pendingAppend)
		}
		st.inflight.m[key] = p
		st.inflight.mu.Unlock()

		p.res, p.err = s.appendNew(ctx, st, a, true)
		st.inflight.mu.Lock()
		delete(st.inflight.m, key)
		if len(st.inflight.m) == 0 {
			st.inflight.m = nil // an idle conversation keeps no map storage
		}
		st.inflight.mu.Unlock()
		close(p.done)
		return p.res, p.err
	}
}

// idemRecord is an idempotency row.
type idemRecord struct {
	msgID  uint64
	bucket int32
	start  uint64
	seq    uint64 // owned appends: the message's seq
}

// appendNew stores a message that this process has not seen before; idem
// says whether it has a client_msg_id.
func (s *Store) appendNew(ctx context.Context, st *convState, a store.Append, idem bool) (store.AppendResult, error) {
	if s.lease != nil {
		return s.ownedAppend(ctx, st, a, idem)
	}
	m := a.Msg
	m.Seq = 0
	bucket := s.bucketOf(m.ServerTime)
	if m.TargetSeq == 0 {
		if err := s.writeBody(ctx, m, bucket); err != nil {
			return store.AppendResult{}, err
		}
		start := uint64(0) // without a record: right above the hint
		if idem {
			rec, ours, err := s.claimIdem(ctx, st, m, bucket)
			if err != nil {
				return store.AppendResult{}, err
			}
			if !ours {
				return s.duplicate(ctx, st, rec)
			}
			start = rec.start
		}
		st.mu.Lock()
		seq, err := s.claim(ctx, st, m.MsgID, bucket, start, idem)
		st.mu.Unlock()
		if err != nil {
			return store.AppendResult{}, err
		}
		if err := s.fault("slots"); err != nil {
			return store.AppendResult{}, err
		}
		m.Seq = seq
		s.afterClaim(ctx, st, seq, m.CoalesceKey)
		return s.stored(ctx, st, a, m, nil)
	}

	// An edit or recall: Check and the rewrite run under the mutex, before
	// the event is stored, so a refused event stores nothing.
	st.mu.Lock()
	locked := true
	defer func() {
		if locked {
			st.mu.Unlock()
		}
	}()
	if idem {
		rec, found, err := s.readIdem(ctx, st.id, m)
		if err != nil {
			return store.AppendResult{}, err
		}
		if found {
			st.mu.Unlock()
			locked = false
			return s.duplicate(ctx, st, rec)
		}
	}
	check, react, err := s.reactCheck(ctx, st.id, a)
	if err != nil {
		return store.AppendResult{}, err
	}
	w, err := s.rewriteTarget(ctx, st, check, m.TargetSeq, pendingEdit{Event: m.MsgID})
	if err != nil {
		return store.AppendResult{}, err
	}
	if err := s.fault("pending"); err != nil {
		return store.AppendResult{}, err
	}
	if err := s.writeBody(ctx, m, bucket); err != nil {
		s.unpend(ctx, st.id, w) // no record, no claim: the event never shows
		return store.AppendResult{}, err
	}
	start := uint64(0)
	if idem {
		rec, ours, err := s.claimIdem(ctx, st, m, bucket)
		if err != nil {
			// The record may be this event's, and a retry (in any
			// process) may claim its slot: the pending version stays.
			return store.AppendResult{}, err
		}
		if !ours {
			// Another process stored the same event meanwhile (with its
			// own msg id and pending version): this one never shows.
			s.unpend(ctx, st.id, w)
			st.mu.Unlock()
			locked = false
			return s.duplicate(ctx, st, rec)
		}
		start = rec.start
	}
	seq, err := s.claim(ctx, st, m.MsgID, bucket, start, idem)
	if err != nil {
		return store.AppendResult{}, err
	}
	st.mu.Unlock()
	locked = false
	if err := s.fault("slots"); err != nil {
		return store.AppendResult{}, err
	}
	m.Seq = seq
	var target *store.Message
	if w != nil {
		_ = s.promote(ctx, st.id, w) // readers resolve it if it failed
		target = &w.msg
	}
	if err := s.fault("promote"); err != nil {
		return store.AppendResult{}, err
	}
	s.afterClaim(ctx, st, seq, m.CoalesceKey)
	if react != nil {
		s.storeMine(ctx, st.id, react)
		target = nil // counts only: no version for former members
	}
	return s.stored(ctx, st, a, m, target)
}

// stored finishes an append whose seq is claimed: the outbox entry and the
// @everyone mark must be written before the message is acknowledged, so a
// failure is returned (the message is stored; the client's retry finds it
// as a duplicate, which writes them again). Rows, when asked, are written
// last; a failure there only leaves them to the caller's fan-out.
//
// target is the edit's or recall's target as rewritten (nil: none). An
// edit's result is recorded in message_edits under the event's seq, before
// the ack, for AsOf; a recall deletes the target's records (AsOf never
// reads a recalled message's). Both are best effort: an edit whose record
// is lost (a failure here, a crash right after the claim) is missing from
// what former members read — they see the version before it, never a
// later one.
func (s *Store) stored(ctx context.Context, st *convState, a store.Append, m store.Message, target *store.Message) (store.AppendResult, error) {
	if err := s.outbox(ctx, st, m); err != nil {
		return store.AppendResult{}, err
	}
	if target != nil {
		s.recordEdit(ctx, st.id, m.Seq, *target)
	}
	res := store.AppendResult{Msg: m}
	if a.Rows {
		if err := s.memberRows(ctx, st.id, m); err != nil {
			s.log.Warn("cassandra: append: rows left to fan-out", logKeyConv, st.id, logKeySeq, m.Seq, logKeyErr, err)
		} else {
			res.RowsWritten = true
		}
	}
	return res, nil
}

// outbox writes m's outbox entry and records an @everyone (a max-register:
// m's seq is its timestamp).
func (s *Store) outbox(ctx context.Context, st *convState, m store.Message) error {
	n := 1
	if m.MentionAll {
		n = 2
	}
	err := s.each(ctx, n, func(ctx context.Context, i int) error {
		if i == 0 {
			entry, err := s.outboxEntries(ctx, st.id, m.Seq)
			if err != nil {
				return err
			}
			return s.q(ctx, entry[0].cql, entry[0].args...).Exec()
		}
		return s.q(ctx, `UPDATE conversations USING TIMESTAMP ? SET everyone_seq = ? WHERE conv_id = ?`,
			i64(m.Seq), i64(m.Seq), i64(st.id)).Exec()
	})
	if err != nil {
		return fmt.Errorf("seq %d is stored but its fan-out could not be recorded; retry to finish it: %w", m.Seq, err)
	}
	return nil
}

// memberRows raises the rows of conv's current members to m's seq, the
// mentioned ones' mention seq too.
func (s *Store) memberRows(ctx context.Context, conv uint64, m store.Message) error {
	members, err := s.members(ctx, conv)
	if err != nil {
		return err
	}
	return s.each(ctx, len(members), func(ctx context.Context, i int) error {
		u := members[i].UserID
		return s.raiseRow(ctx, conv, u, m.Seq, m.MentionAll || slices.Contains(m.Mentions, u))
	})
}

// writeBody stores m's body, which no reader sees until a slot points to
// it. A msg id already used by another message is refused; one used by an
// earlier attempt of the same (sender, client_msg_id) is written again.
func (s *Store) writeBody(ctx context.Context, m store.Message, bucket int32) error {
	var sender, cmid string
	err := s.q(ctx, `SELECT sender, client_msg_id FROM messages WHERE conv_id = ? AND bucket = ? AND message_id = ?`,
		i64(m.ConvID), bucket, i64(m.MsgID)).Scan(&sender, &cmid)
	switch {
	case err == nil && (m.ClientMsgID == "" || sender != m.Sender || cmid != m.ClientMsgID):
		return fmt.Errorf("msg id %d: %w", m.MsgID, store.ErrConflict)
	case err != nil && !errors.Is(err, gocql.ErrNotFound):
		return err
	}
	return s.q(ctx, `INSERT INTO messages (conv_id, bucket, message_id, sender, sender_device, client_msg_id,
		kind, body, target_seq, server_time, mentions, mention_all, coalesce_key, attachment, reply_to)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		i64(m.ConvID), bucket, i64(m.MsgID), m.Sender, m.SenderDevice, m.ClientMsgID,
		m.Kind, m.Body, i64(m.TargetSeq), m.ServerTime, unsetIfEmpty(m.Mentions), m.MentionAll, m.CoalesceKey,
		unsetIfZero(m.Attachment), unsetIfZero(m.ReplyTo)).Exec()
}

// unsetIfEmpty leaves an empty list column unset: binding null would write
// a tombstone with every message.
func unsetIfEmpty(ms []string) any {
	if len(ms) == 0 {
		return gocql.UnsetValue
	}
	return ms
}

// unsetIfZero leaves an optional bigint column of a message (attachment,
// reply_to) unset when the message has none (no tombstone).
func unsetIfZero(v uint64) any {
	if v == 0 {
		return gocql.UnsetValue
	}
	return i64(v)
}

// claimIdem claims (conv, sender, client_msg_id) for m. It returns the
// record that owns the key and whether it is m's.
func (s *Store) claimIdem(ctx context.Context, st *convState, m store.Message, bucket int32) (idemRecord, bool, error) {
	mine := idemRecord{msgID: m.MsgID, bucket: bucket, start: st.hint.Load() + 1}
	for {
		cur := map[string]any{}
		applied, err := s.lwt(ctx, `INSERT INTO idempotency (conv_id, sender, client_msg_id, message_id, bucket, start_seq)
			VALUES (?, ?, ?, ?, ?, ?) IF NOT EXISTS`,
			i64(st.id), m.Sender, m.ClientMsgID, i64(mine.msgID), mine.bucket, i64(mine.start)).MapScanCAS(cur)
		if err == nil {
			if applied {
				return mine, true, nil
			}
			// MapScanCAS returns a CQL int as a Go int.
			id, _ := cur["message_id"].(int64)
			bucket, _ := cur["bucket"].(int)
			start, _ := cur["start_seq"].(int64)
			rec := idemRecord{msgID: u64(id), bucket: int32(bucket), start: u64(start)}
			return rec, rec.msgID == mine.msgID, nil
		}
		// Unknown outcome: a SERIAL read finishes the round and decides.
		rec, found, rerr := s.readIdemAt(ctx, st.id, m, s.serial)
		if rerr != nil {
			return idemRecord{}, false, errors.Join(err, rerr)
		}
		if found {
			return rec, rec.msgID == mine.msgID, nil
		}
		if ctx.Err() != nil {
			return idemRecord{}, false, err
		}
	}
}

func (s *Store) readIdem(ctx context.Context, conv uint64, m store.Message) (idemRecord, bool, error) {
	return s.readIdemAt(ctx, conv, m, s.cons)
}

func (s *Store) readIdemAt(ctx context.Context, conv uint64, m store.Message, c gocql.Consistency) (idemRecord, bool, error) {
	var (
		id, start int64
		rec       idemRecord
	)
	err := s.sess.Query(`SELECT message_id, bucket, start_seq FROM idempotency WHERE conv_id = ? AND sender = ? AND client_msg_id = ?`,
		i64(conv), m.Sender, m.ClientMsgID).WithContext(ctx).Consistency(c).Scan(&id, &rec.bucket, &start)
	if errors.Is(err, gocql.ErrNotFound) {
		return idemRecord{}, false, nil
	}
	if err != nil {
		return idemRecord{}, false, err
	}
	rec.msgID, rec.start = u64(id), u64(start)
	return rec, true, nil
}

// duplicate returns the message that owns an idempotency record, claiming
// its slot first if its owner has not (yet): see claim.
func (s *Store) duplicate(ctx context.Context, st *convState, rec idemRecord) (store.AppendResult, error) {
	st.mu.Lock()
	seq, claimed, err := s.claimFor(ctx, st, rec.msgID, rec.bucket, rec.start, true)
	st.mu.Unlock()
	if err != nil {
		return store.AppendResult{}, fmt.Errorf("original %d: %w", rec.msgID, err)
	}
	m, err := s.messageAt(ctx, st.id, slot{seq: seq, msgID: rec.msgID, bucket: rec.bucket})
	if err != nil {
		return store.AppendResult{}, fmt.Errorf("original %d: %w", rec.msgID, err)
	}
	if claimed {
		// The owner may be gone: finish its append.
		s.afterClaim(ctx, st, seq, m.CoalesceKey)
	}
	// The original may have failed (or died) after its claim, before
	// its outbox entry: write it again.
	if err := s.outbox(ctx, st, m); err != nil {
		return store.AppendResult{}, err
	}
	return store.AppendResult{Msg: m, Duplicate: true}, nil
}

// claim is claimFor without the claimed flag.
func (s *Store) claim(ctx context.Context, st *convState, msgID uint64, bucket int32, start uint64, shared bool) (uint64, error) {
	seq, _, err := s.claimFor(ctx, st, msgID, bucket, start, shared)
	return seq, err
}

// claimFor gives message msgID the lowest free seq ≥ start (0: above the
// hint) and returns it,
// and whether this call wrote the slot. It runs under st.mu.
//
// A slot is tried only when every lower one is known to be claimed, which
// keeps seqs dense. shared says that other callers (duplicates in other
// processes) may be claiming the same message: then every claimer walks
// the slots from the same start (the idempotency record's) and stops at
// the message if it finds it, so the message ends in exactly one slot.
// Without shared, a lost slot sends the claimer straight above the top.
func (s *Store) claimFor(ctx context.Context, st *convState, msgID uint64, bucket int32, start uint64, shared bool) (uint64, bool, error) {
	k := max(start, 1)
	if shared && k <= st.hint.Load() {
		at, top, err := s.find(ctx, st.id, k, msgID)
		if err != nil {
			return 0, false, err
		}
		if at != 0 {
			st.raiseHint(top)
			return at, false, nil
		}
		st.raiseHint(top)
		k = top + 1
	} else {
		k = max(k, st.hint.Load()+1)
	}
	lost := 0
	for {
		if err := ctx.Err(); err != nil {
			return 0, false, err
		}
		holder, applied, err := s.claimSlot(ctx, st.id, k, msgID, bucket)
		if err != nil {
			return 0, false, fmt.Errorf("seq %d: outcome unknown, the message may be stored: %w", k, err)
		}
		st.raiseHint(k)
		if applied || holder == msgID {
			return k, applied, nil
		}
		// k is another message's: another process is appending too. Let
		// its next claim go first, or both keep colliding on the
		// partition; then look above k.
		lost++
		if err := backoff(ctx, min(lost-1, 3)); err != nil {
			return 0, false, err
		}
		if shared {
			at, top, err := s.find(ctx, st.id, k+1, msgID)
			if err != nil {
				return 0, false, err
			}
			st.raiseHint(top)
			if at != 0 {
				return at, false, nil
			}
			k = top + 1
			continue
		}
		top, err := s.top(ctx, st)
		if err != nil {
			return 0, false, err
		}
		k = top + 1
	}
}

// claimSlot tries to insert slot k → msgID. It returns the slot's holder
// and whether this call inserted it. A transaction whose answer is lost
// (timeout, contention) is settled by a SERIAL read of the slot, retried
// with backoff since it contends for the same partition.
func (s *Store) claimSlot(ctx context.Context, conv, k, msgID uint64, bucket int32) (uint64, bool, error) {
	for {
		cur := map[string]any{}
		applied, err := s.lwt(ctx, `INSERT INTO message_seq (conv_id, seq_block, seq, message_id, bucket)
			VALUES (?, ?, ?, ?, ?) IF NOT EXISTS`,
			i64(conv), s.blockOf(k), i64(k), i64(msgID), bucket).MapScanCAS(cur)
		if err == nil {
			if applied {
				return msgID, true, nil
			}
			id, _ := cur["message_id"].(int64)
			return u64(id), false, nil
		}
		s.log.Warn("cassandra: seq claim outcome unknown; reading the slot", logKeyConv, conv, logKeySeq, k, logKeyErr, err)
		id, found, rerr := s.settleSlot(ctx, conv, k)
		if rerr != nil {
			return 0, false, errors.Join(err, rerr)
		}
		if found {
			// Whether this call or a retry wrote it, the slot is id's.
			return id, id == msgID, nil
		}
		// The round was not chosen and can no longer be: try again.
	}
}

// settleSlot reads slot k at SERIAL, retrying with backoff while the
// partition is contended.
func (s *Store) settleSlot(ctx context.Context, conv, k uint64) (uint64, bool, error) {
	const attempts = 8
	var err error
	for i := range attempts {
		var id int64
		err = s.serialRead(ctx, `SELECT message_id FROM message_seq WHERE conv_id = ? AND seq_block = ? AND seq = ?`,
			i64(conv), s.blockOf(k), i64(k)).Scan(&id)
		switch {
		case err == nil:
			return u64(id), true, nil
		case errors.Is(err, gocql.ErrNotFound):
			return 0, false, nil
		}
		if werr := backoff(ctx, i); werr != nil {
			return 0, false, errors.Join(err, werr)
		}
	}
	return 0, false, err
}

// backoff sleeps before retry i (0-based): random up to 10 ms · 2^i,
// capped at 1 s, so contending proposers fall out of step.
func backoff(ctx context.Context, i int) error {
	d := min(10*time.Millisecond<<i, time.Second)
	t := time.NewTimer(rand.N(d) + time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// afterClaim raises the conversation's last_seq hint and, for a state
// message, its key's latest seq to seq. Both are max-registers (USING
// TIMESTAMP seq), so writes arriving out of order never lower them. The
// message is stored already, so a failure here is logged, not returned:
// the hint only saves index probes, and the key catches up with its next
// message.
func (s *Store) afterClaim(ctx context.Context, st *convState, seq uint64, key string) {
	n := 1
	if key != "" {
		n = 2
	}
	err := s.each(ctx, n, func(ctx context.Context, i int) error {
		if i == 0 {
			return s.q(ctx, `UPDATE conversations USING TIMESTAMP ? SET last_seq = ? WHERE conv_id = ?`,
				i64(seq), i64(seq), i64(st.id)).Exec()
		}
		return s.q(ctx, `UPDATE coalesce_latest USING TIMESTAMP ? SET seq = ? WHERE conv_id = ? AND key = ?`,
			i64(seq), i64(seq), i64(st.id), key).Exec()
	})
	if err != nil {
		s.log.Warn("cassandra: append: hints behind", logKeyConv, st.id, logKeySeq, seq, logKeyErr, err)
	}
}

// rewriteTarget writes the target of an edit or recall as check rewrites
// it, as the pending version of ev (the event; Seq or From set), by
// compare-and-set on its rev so that a concurrent rewrite in another
// process is never overwritten unseen. It returns the rewrite (nil when
// check is nil: nothing was rewritten). Readers see the new version only
// once the event's slot is written; promote then makes it the committed
// one. It runs under st.mu.
//
// A pending version found on the target is resolved first: its event
// stored, it is the version check sees (and the new record's committed
// one); not stored, it is dropped — an owner's fence keeps its event from
// ever showing; in a transactional append, a pending version younger than
// pendingAge may still be claiming, so the edit is refused as a conflict.
func (s *Store) rewriteTarget(ctx context.Context, st *convState, check func(store.Message) (store.Message, error), target uint64, ev pendingEdit) (*rewrite, error) {
	top, err := s.top(ctx, st)
	if err != nil {
		return nil, err
	}
	if target > top {
		return nil, fmt.Errorf("target %d: %w", target, store.ErrNotFound)
	}
	ss, err := s.slots(ctx, st.id, target, target, 1)
	if err != nil {
		return nil, err
	}
	if len(ss) == 0 {
		return nil, fmt.Errorf("target %d: %w", target, store.ErrNotFound)
	}
	if check == nil {
		return nil, nil
	}
	if ev.Seq == 0 {
		ev.From = top + 1
	}
	sl := ss[0]
	for {
		r, err := s.readRow(ctx, st.id, sl.bucket, sl.msgID)
		if err != nil {
			return nil, fmt.Errorf("target %d: %w", target, err)
		}
		old, p, err := r.message(st.id, target)
		if err != nil {
			return nil, err
		}
		rec := editRecord{Orig: true}
		if r.rev != nil && len(r.edit) > 0 {
			_ = json.Unmarshal(r.edit, &rec) // r.message decoded it
			rec.Pending = nil
		}
		if p != nil {
			done, err := s.committed(ctx, st.id, p)
			if err != nil {
				return nil, err
			}
			switch {
			case done:
				old = p.Image.apply(old)
				rec = editRecord{editImage: p.Image}
			case s.lease == nil && time.Since(time.UnixMilli(p.At)) < pendingAge:
				return nil, fmt.Errorf("target %d: another edit of it is being stored: %w", target, store.ErrConflict)
			}
		}
		next, err := check(old)
		if err != nil {
			return nil, checkError{err}
		}
		// Identity and CoalesceKey (which indexes the message) are kept:
		// the image holds only what an edit may change.
		ev.Image, ev.At = imageOf(next), time.Now().UnixMilli()
		pe := ev
		rec.Pending = &pe
		rev := 1
		var cond any // nil binds null: the first rewrite
		if r.rev != nil {
			rev, cond = *r.rev+1, *r.rev
		}
		applied, err := s.casEdit(ctx, st.id, sl, rev, cond, rec)
		if err != nil {
			return nil, err
		}
		if applied {
			return &rewrite{sl: sl, rev: rev, rec: rec, msg: imageOf(next).apply(old)}, nil
		}
		// Another process rewrote the target: Check its new version.
	}
}
