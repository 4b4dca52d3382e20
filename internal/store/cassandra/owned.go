package cassandra

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/parley-im/parley/internal/store"
)

// Lease tells the store under which fencing epoch this process owns a
// conversation's partition (see "Owned appends" in the package comment).
// Epochs of one partition grow strictly with every new lease, and each is
// at most 2^53 / 1000 (a Cassandra write timestamp is derived from it).
type Lease interface {
	// Epoch returns the epoch of this process's lease on conv's
	// partition, or ok false if it holds none or must stop writing under
	// it (its lease ends too soon).
	Epoch(conv uint64) (epoch uint64, ok bool)
	// Confirm returns nil if the lease of conv's partition is still held
	// at epoch in the lease store (one round trip), an error otherwise.
	Confirm(ctx context.Context, conv, epoch uint64) error
	// Reepoch moves this process's lease of conv's partition, if it is
	// still held at epoch, to a new epoch above every earlier one of the
	// partition, keeping it (one round trip, atomic in the lease store),
	// and returns the new epoch, which Epoch returns from then on for every
	// conversation of the partition; a lease already moved on by this
	// process returns its newer epoch. ok false: the lease is no longer
	// held at epoch (lost). An error: the outcome is unknown.
	Reepoch(ctx context.Context, conv, epoch uint64) (next uint64, ok bool, err error)
}

// Limits of an owned batch: at most maxBatch messages of one conversation
// go in one write, and a batch never spans two message_seq partitions (a
// single-partition batch is applied atomically).
const (
	maxBatch = 64
	// maxGen bounds the write generations within one epoch: each failed
	// batch write moves to the next generation, and the timestamps of
	// generation g are epoch·1000 + 2g (fence) and + 2g + 1 (writes). A
	// conversation whose generations run out moves its partition's lease
	// to a new epoch (writeEpoch), where generations start at 0 again.
	maxGen = 499
	// batchTimeout bounds one batch's writes when the caller that runs it
	// has gone.
	batchTimeout = 10 * time.Second
	// writeAttempts of one batch write before the batch fails.
	writeAttempts = 3
)

// ownedConv is the owner's state of one conversation; guarded by mu.
type ownedConv struct {
	mu sync.Mutex
	// epoch under which top was loaded and the fence written (0: none).
	epoch uint64
	gen   uint64
	// top is the highest seq written and confirmed under epoch.
	top uint64
	// genEpoch is the epoch under which gen last moved up.
	genEpoch uint64
	// lost is the highest epoch found to be superseded: never written
	// under again.
	lost    uint64
	queue   []*ownedReq
	running bool
	// hinted is the last seq written to the conversation's last_seq hint
	// under epoch (see afterOwned).
	hinted uint64
	// sweep: a batch's effects (coalesce keys, hint) failed; the next
	// load finishes them (finishLast), even of this process's own slots.
	sweep bool
	// orphans are the slots of bodies whose slot write failed or was not
	// confirmed: the next load deletes those it does not find (orphans.go).
	orphans []slot
	// direct holds the members of a direct conversation once read: they
	// never change.
	direct []string
}

type ownedReq struct {
	a    store.Append
	idem bool
	res  store.AppendResult
	err  error
	done chan struct{}
}

func fenceTS(epoch, gen uint64) int64 { return int64(epoch*1000 + 2*gen) }
func writeTS(epoch, gen uint64) int64 { return int64(epoch*1000 + 2*gen + 1) }

// ownedAppend queues a for the conversation's writer and waits for its
// outcome. The first caller to find the writer idle runs it: it takes the
// queue in batches until the queue is empty, so appends that arrive while
// a batch is being written share the next one.
func (s *Store) ownedAppend(ctx context.Context, st *convState, a store.Append, idem bool) (store.AppendResult, error) {
	if _, ok := s.lease.Epoch(st.id); !ok {
		return store.AppendResult{}, store.ErrNotOwner
	}
	r := &ownedReq{a: a, idem: idem, done: make(chan struct{})}
	o := &st.own
	o.mu.Lock()
	o.queue = append(o.queue, r)
	run := !o.running
	o.running = true
	o.mu.Unlock()
	// Queued: the pipeline's next append may queue behind this one while
	// it is written (append waited for the turn).
	store.TurnOf(ctx).Take()
	if run {
		s.runOwned(st)
	}
	select {
	case <-r.done:
		return r.res, r.err
	case <-ctx.Done():
		// The batch goes on; the client's retry finds the outcome.
		return store.AppendResult{}, fmt.Errorf("%w (the message may be stored)", ctx.Err())
	}
}

// TakesTurns reports whether Append takes the turn of its context itself
// (store.Turn): owned appends do, as they queue.
func (s *Store) TakesTurns() bool { return s.lease != nil }

// runOwned writes the queue of st in batches until it is empty.
func (s *Store) runOwned(st *convState) {
	o := &st.own
	for {
		o.mu.Lock()
		if len(o.queue) == 0 {
			o.running = false
			o.mu.Unlock()
			return
		}
		n := 1
		if o.queue[0].a.Msg.TargetSeq == 0 {
			for n < len(o.queue) && n < maxBatch && o.queue[n].a.Msg.TargetSeq == 0 {
				n++
			}
		}
		batch := slices.Clone(o.queue[:n])
		o.queue = slices.Delete(o.queue, 0, n)
		o.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
		later := s.writeOwned(ctx, st, batch)
		cancel()
		for _, r := range batch {
			if !slices.Contains(later, r) {
				close(r.done)
			}
		}
	}
}

func failAll(batch []*ownedReq, err error) {
	for _, r := range batch {
		if r.err == nil && r.res.Msg.Seq == 0 {
			r.err = err
		}
	}
}

// writeOwned writes one batch (see "Owned appends"). Every request of the
// batch gets a result or an error, except those it returns: they did not
// fit in the batch's message_seq partition and are back at the head of
// the queue.
func (s *Store) writeOwned(ctx context.Context, st *convState, batch []*ownedReq) (later []*ownedReq) {
	o := &st.own
	// st.mu orders the batch against membership changes of the process.
	st.mu.Lock()
	defer st.mu.Unlock()
	epoch, gen, err := s.writeEpoch(ctx, st)
	if err != nil {
		failAll(batch, err)
		return nil
	}
	o.mu.Lock()
	loaded, top, lost := o.epoch == epoch, o.top, epoch <= o.lost
	o.mu.Unlock()
	if lost {
		failAll(batch, store.ErrNotOwner)
		return
	}
	if !loaded {
		var err error
		if top, err = s.takeConv(ctx, st, epoch, gen); err != nil {
			if errors.Is(err, store.ErrNotOwner) {
				o.mu.Lock()
				o.lost = max(o.lost, epoch)
				o.mu.Unlock()
			}
			failAll(batch, err)
			return
		}
		o.mu.Lock()
		o.epoch, o.top, o.hinted = epoch, top, 0
		o.mu.Unlock()
	}

	// Duplicates: the idempotency records, read while the bodies are
	// written (the bodies of duplicates stay unreferenced, invisible).
	recs := make([]idemRecord, len(batch))
	found := make([]bool, len(batch))
	var bodies []store.Message
	for _, r := range batch {
		if r.a.Msg.TargetSeq == 0 { // an edit's is written after Check, below
			bodies = append(bodies, r.a.Msg)
		}
	}
	var bodyErr error
	var wg sync.WaitGroup
	wg.Go(func() { bodyErr = s.insertBodies(ctx, bodies) })
	err = s.each(ctx, len(batch), func(ctx context.Context, i int) error {
		r := batch[i]
		if !r.idem || top == 0 {
			// With no message stored yet no record can count (verifyIdem
			// takes none above the top): a new conversation's first
			// batch reads none.
			return nil
		}
		rec, f, err := s.readOwnedIdem(ctx, st.id, r.a.Msg)
		recs[i], found[i] = rec, f
		return err
	})
	wg.Wait()
	if err := errors.Join(err, bodyErr); err != nil {
		failAll(batch, err)
		return
	}
	var fresh []*ownedReq
	var dupBodies []slot // bodies of duplicates: never to be used
	for i, r := range batch {
		if !found[i] {
			fresh = append(fresh, r)
			continue
		}
		at, err := s.verifyIdem(ctx, st.id, recs[i], top)
		switch {
		case err != nil:
			r.err = err
		case at == 0:
			fresh = append(fresh, r) // a record of a write that never counted
		default:
			if m := r.a.Msg; m.TargetSeq == 0 && m.MsgID != recs[i].msgID {
				dupBodies = append(dupBodies, slot{msgID: m.MsgID, bucket: s.bucketOf(m.ServerTime)})
			}
			m, err := s.messageAt(ctx, st.id, slot{seq: at, msgID: recs[i].msgID, bucket: recs[i].bucket})
			if err == nil {
				// The original may have lost its outbox entry: write it again.
				err = s.outbox(ctx, st, m)
			}
			r.res, r.err = store.AppendResult{Msg: m, Duplicate: true}, err
		}
	}
	s.dropBodies(ctx, st.id, dupBodies)
	if len(fresh) == 0 {
		return
	}
	var w *rewrite // an edit's or recall's target as rewritten (pending)
	var react *reaction
	if t := fresh[0].a; t.Msg.TargetSeq != 0 {
		check, r, err := s.reactCheck(ctx, st.id, t)
		if err != nil {
			fresh[0].err = err
			return
		}
		react = r
		if w, err = s.rewriteTarget(ctx, st, check, t.Msg.TargetSeq, pendingEdit{Event: t.Msg.MsgID, Seq: top + 1}); err != nil {
			if ce, ok := err.(checkError); ok {
				err = ce.err
			}
			fresh[0].err = err
			return
		}
		if err := s.fault("pending"); err != nil {
			fresh[0].err = err
			return
		}
		if err := s.insertBodies(ctx, []store.Message{t.Msg}); err != nil {
			s.unpend(ctx, st.id, w) // its slot is never written
			fresh[0].err = err
			return
		}
	}
	// Seqs: dense from top+1, within top+1's message_seq partition (the
	// rest wait for the next batch).
	if room := s.block - (top+1)%s.block; uint64(len(fresh)) > room {
		later = slices.Clone(fresh[room:])
		o.mu.Lock()
		o.queue = slices.Insert(o.queue, 0, later...)
		o.mu.Unlock()
		fresh = fresh[:room]
	}
	msgs := make([]store.Message, len(fresh))
	for i, r := range fresh {
		m := r.a.Msg
		m.Seq = top + 1 + uint64(i)
		msgs[i] = m
	}
	err = s.fault("slots.lost")
	if err == nil {
		if err = s.writeSlots(ctx, st.id, msgs, epoch, gen); err == nil {
			err = s.fault("slots.unknown")
		}
	}
	if err != nil {
		// The outcome is unknown: the next batch loads the top again and
		// fences above it at a new generation, so a late arrival of this
		// write is shadowed (and its bodies, if not stored, deleted).
		s.rememberOrphans(o, msgs)
		s.regenerate(o, epoch, gen)
		failAll(fresh, fmt.Errorf("seqs %d..%d: outcome unknown, the messages may be stored: %w",
			msgs[0].Seq, msgs[len(msgs)-1].Seq, err))
		return
	}
	if err := s.fault("slots"); err != nil {
		failAll(fresh, err)
		return
	}
	// Fencing: a write is acknowledged only if the lease still held after
	// it; a new owner loads the top after taking the lease, so it either
	// saw these slots or shadows them.
	if err := s.lease.Confirm(ctx, st.id, epoch); err != nil {
		s.rememberOrphans(o, msgs)
		o.mu.Lock()
		o.epoch, o.lost = 0, max(o.lost, epoch)
		o.mu.Unlock()
		s.log.Warn("cassandra: lease lost during a write; not acknowledged", logKeyConv, st.id, logKeyErr, err)
		failAll(fresh, fmt.Errorf("%w: %v", store.ErrNotOwner, err))
		return
	}
	last := msgs[len(msgs)-1].Seq
	o.mu.Lock()
	if o.epoch == epoch {
		o.top = last
	}
	o.mu.Unlock()
	st.raiseHint(last)
	if w != nil && s.promote(ctx, st.id, w) != nil {
		o.mu.Lock()
		o.epoch, o.sweep = 0, true // the next batch's load promotes it
		o.mu.Unlock()
	}
	if err := s.fault("promote"); err != nil {
		failAll(fresh, err)
		return
	}
	switch {
	case react != nil:
		s.storeMine(ctx, st.id, react)
	case w != nil:
		s.recordEdit(ctx, st.id, last, w.msg) // as in stored
	}
	rows, read, err := s.afterOwned(ctx, st, fresh, msgs, epoch, gen)
	if err != nil {
		// An idempotency record may be missing: the next batch repairs
		// them (takeConv) before it reads any.
		s.regenerate(o, epoch, gen)
		failAll(fresh, err)
		return later
	}
	for i, r := range fresh {
		m := msgs[i]
		m.Mentions = cloneMentions(m.Mentions)
		r.res = store.AppendResult{Msg: m, RowsWritten: r.a.Rows && rows, ReadRaised: r.a.ReadBy != nil && read}
	}
	return later
}

// regenerate makes the next batch of o load the top again and fence above
// it at the generation after gen: what the last write under gen left is
// then either seen (and repaired, see takeConv) or shadowed. Past maxGen
// that takes a new epoch (writeEpoch).
func (s *Store) regenerate(o *ownedConv, epoch, gen uint64) {
	o.mu.Lock()
	o.epoch, o.gen, o.genEpoch = 0, gen+1, epoch
	o.mu.Unlock()
}

// writeEpoch returns the epoch and the write generation of st's next batch
// or load, under st.mu. A newer epoch than the one o's generation moved
// up in starts at generation 0: its timestamps are above every older
// epoch's. When the generations of the lease's epoch are used up (a
// generation past maxGen would reach the next epoch's timestamps, and a
// late arrival of the last failed write would no longer be shadowed), the
// lease moves to a new epoch (Lease.Reepoch) and every conversation of the
// partition loads and fences again under it, as after a takeover; until
// it has one, st is not written (an error: retry), and a lease found lost
// is given up as on a failed Confirm.
func (s *Store) writeEpoch(ctx context.Context, st *convState) (epoch, gen uint64, err error) {
	epoch, ok := s.lease.Epoch(st.id)
	if !ok {
		return 0, 0, store.ErrNotOwner
	}
	o := &st.own
	o.mu.Lock()
	if o.genEpoch < epoch {
		o.gen = 0
	}
	gen = o.gen
	o.mu.Unlock()
	if gen <= maxGen {
		return epoch, gen, nil
	}
	next, ok, err := s.lease.Reepoch(ctx, st.id, epoch)
	switch {
	case err != nil:
		return 0, 0, fmt.Errorf("write generations of epoch %d used up and no new epoch: nothing was written, retry: %w", epoch, err)
	case !ok:
		s.lostEpoch(o, epoch)
		s.log.Warn("cassandra: lease lost when moving to a new epoch", logKeyConv, st.id)
		return 0, 0, fmt.Errorf("%w: lease lost when moving on from epoch %d", store.ErrNotOwner, epoch)
	case next <= epoch:
		return 0, 0, fmt.Errorf("lease moved from epoch %d to %d, not above it: nothing was written, retry", epoch, next)
	}
	s.log.Info("cassandra: write generations used up; the partition's lease moved to a new epoch", logKeyConv, st.id, "epoch", next)
	o.mu.Lock()
	o.epoch, o.gen = 0, 0
	o.mu.Unlock()
	return next, 0, nil
}

// takeConv loads the conversation's top for a new epoch (or generation)
// and fences above it: a range tombstone over the seqs above the top in
// the next seq's partition, timestamped above every write of older epochs
// and generations, so a stale writer's slots there — landed or still in
// flight — never show. A stale writer has at most one batch in flight per
// conversation, and a batch starts at most one above a top that every
// later owner sees and stays in one partition, so that range is the only
// one it can write to.
func (s *Store) takeConv(ctx context.Context, st *convState, epoch, gen uint64) (uint64, error) {
	if epoch == 0 || epoch*1000 > 1<<53 {
		return 0, fmt.Errorf("epoch %d out of range", epoch)
	}
	row, err := s.convRow(ctx, st.id)
	if err != nil {
		return 0, err
	}
	top := row.LastSeq // written only after a confirmed write: a real slot
	var newest int64   // write time of the top slot
	for b := top / s.block; ; b++ {
		var seq, wt int64
		err := s.q(ctx, `SELECT seq, WRITETIME(message_id) FROM message_seq WHERE conv_id = ? AND seq_block = ? ORDER BY seq DESC LIMIT 1`,
			i64(st.id), i64(b)).Scan(&seq, &wt)
		if errors.Is(err, gocql.ErrNotFound) {
			break
		}
		if err != nil {
			return 0, err
		}
		if u64(seq) >= top {
			top, newest = u64(seq), wt
		}
		if u64(seq) != (b+1)*s.block-1 {
			break
		}
	}
	// The top slot is its newest writer's: one of a later epoch means
	// this process lost the partition (it must not write above a newer
	// owner's slots, where that owner's fence does not reach).
	if newest > writeTS(epoch, gen) {
		return 0, fmt.Errorf("%w: seq %d was written after epoch %d", store.ErrNotOwner, top, epoch)
	}
	var fenceErr, membersErr, repairErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		fenceErr = s.q(ctx, `DELETE FROM message_seq USING TIMESTAMP ? WHERE conv_id = ? AND seq_block = ? AND seq > ?`,
			fenceTS(epoch, gen), i64(st.id), s.blockOf(top+1), i64(top)).Exec()
	})
	// The members partition's fence: membership changes are conditioned
	// on it (members.go), so an older owner's are refused from here on.
	wg.Go(func() {
		membersErr = s.q(ctx, `UPDATE members USING TIMESTAMP ? SET fence = ? WHERE conv_id = ?`,
			fenceTS(epoch, gen), i64(epoch), i64(st.id)).Exec()
	})
	st.own.mu.Lock()
	sweep := st.own.sweep
	st.own.mu.Unlock()
	if newest != writeTS(epoch, gen) || sweep {
		// The top slot is another writer's (an older epoch or
		// generation): its last batch may lack records and effects. (A
		// reload of an evicted state finds its own, whose records and
		// effects were written, unless they failed: sweep.)
		wg.Go(func() { repairErr = s.finishLast(ctx, st.id, top, epoch, gen) })
	}
	wg.Wait()
	if err := errors.Join(fenceErr, membersErr); err != nil {
		return 0, fmt.Errorf("fence: %w", err)
	}
	if repairErr != nil {
		return 0, fmt.Errorf("last batch: %w", repairErr)
	}
	st.own.mu.Lock()
	st.own.sweep = false
	st.own.mu.Unlock()
	s.dropOrphans(ctx, st, top) // the fence is written
	return top, nil
}

// finishLast writes (again) the idempotency records and the effects
// (sweep: promoted edits, coalesce keys, the hint) of the slots a last
// batch below top may have left without them: its writer writes them
// after the slots and may have died or failed in between. A batch stays
// within one message_seq partition and holds at most maxBatch messages,
// and a writer starts a batch only after the previous one's records and
// effects are written or, failing that, after this repair under a new
// generation (or a reload with sweep set); so only the last maxBatch
// slots of top's partition can lack them.
func (s *Store) finishLast(ctx context.Context, conv, top, epoch, gen uint64) error {
	if top == 0 {
		return nil
	}
	lo := max(top-min(top, maxBatch-1), top/s.block*s.block, 1)
	ss, err := s.slots(ctx, conv, lo, top, maxBatch)
	if err != nil || len(ss) == 0 {
		return err
	}
	msgs, err := s.bodies(ctx, conv, ss)
	if err != nil {
		return err
	}
	if err := s.writeIdem(ctx, conv, msgs, epoch, gen); err != nil {
		return err
	}
	return s.sweep(ctx, conv, msgs)
}

// insertBodies writes message bodies (group commit: commit.go); msg ids
// are unique (Snowflake), and a body no slot points to is invisible. A
// large body is written on its own.
func (s *Store) insertBodies(ctx context.Context, msgs []store.Message) error {
	var small []stmt
	var big []stmt
	for _, m := range msgs {
		st := stmt{`INSERT INTO messages (conv_id, bucket, message_id, sender, sender_device, client_msg_id,
		kind, body, target_seq, server_time, mentions, mention_all, coalesce_key, attachment, reply_to)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, []any{
			i64(m.ConvID), s.bucketOf(m.ServerTime), i64(m.MsgID), m.Sender, m.SenderDevice, m.ClientMsgID,
			m.Kind, m.Body, i64(m.TargetSeq), m.ServerTime, unsetIfEmpty(m.Mentions), m.MentionAll, m.CoalesceKey,
			unsetIfZero(m.Attachment), unsetIfZero(m.ReplyTo)}}
		if st.size() > maxGroupBytes/4 {
			big = append(big, st)
		} else {
			small = append(small, st)
		}
	}
	return s.each(ctx, 1+len(big), func(ctx context.Context, i int) error {
		if i == 0 {
			// The bodies of a batch may fall in several buckets.
			return s.commit.execSplit(ctx, small)
		}
		return s.q(ctx, big[i-1].cql, big[i-1].args...).Exec()
	})
}

// readOwnedIdem reads an idempotency record with its seq (0 for a record
// of a transactional append, which has only start_seq).
func (s *Store) readOwnedIdem(ctx context.Context, conv uint64, m store.Message) (idemRecord, bool, error) {
	var (
		id, start int64
		seq       *int64
		rec       idemRecord
	)
	err := s.q(ctx, `SELECT message_id, bucket, start_seq, seq FROM idempotency WHERE conv_id = ? AND sender = ? AND client_msg_id = ?`,
		i64(conv), m.Sender, m.ClientMsgID).Scan(&id, &rec.bucket, &start, &seq)
	if errors.Is(err, gocql.ErrNotFound) {
		return idemRecord{}, false, nil
	}
	if err != nil {
		return idemRecord{}, false, err
	}
	rec.msgID, rec.start = u64(id), u64(start)
	if seq != nil {
		rec.seq = u64(*seq)
	}
	return rec, true, nil
}

// verifyIdem returns the seq at which rec's message is stored, or 0 if it
// is not: a record whose slot was fenced off or never written (a stale
// owner's, or one of a failed batch) does not make a duplicate.
func (s *Store) verifyIdem(ctx context.Context, conv uint64, rec idemRecord, top uint64) (uint64, error) {
	if rec.seq == 0 {
		at, _, err := s.find(ctx, conv, max(rec.start, 1), rec.msgID)
		if at > top {
			at = 0
		}
		return at, err
	}
	if rec.seq > top {
		return 0, nil
	}
	ss, err := s.slots(ctx, conv, rec.seq, rec.seq, 1)
	if err != nil || len(ss) == 0 || ss[0].msgID != rec.msgID {
		return 0, err
	}
	return rec.seq, nil
}

// writeSlots writes the slots of msgs (dense, one message_seq partition)
// in one batch at the epoch's write timestamp: a batch's writes of one
// partition are applied atomically (no batch log; the group commit may
// share the batch with other conversations' writes, each partition's share
// atomic), and a later owner's writes and fences win over it. The identical batch is retried, which is idempotent. The
// idempotency records follow (afterOwned); takeConv repairs those of a
// batch whose writer died or failed in between.
func (s *Store) writeSlots(ctx context.Context, conv uint64, msgs []store.Message, epoch, gen uint64) error {
	stmts := make([]stmt, len(msgs))
	for i, m := range msgs {
		stmts[i] = stmt{`INSERT INTO message_seq (conv_id, seq_block, seq, message_id, bucket) VALUES (?, ?, ?, ?, ?) USING TIMESTAMP ?`,
			[]any{i64(conv), s.blockOf(m.Seq), i64(m.Seq), i64(m.MsgID), s.bucketOf(m.ServerTime), writeTS(epoch, gen)}}
	}
	var err error
	for attempt := range writeAttempts {
		if err = s.commit.exec(ctx, stmts); err == nil {
			return nil
		}
		if werr := backoff(ctx, attempt); werr != nil {
			return errors.Join(err, werr)
		}
	}
	return err
}

// writeIdem writes the idempotency records of msgs (their seqs included)
// at the epoch's write timestamp.
func (s *Store) writeIdem(ctx context.Context, conv uint64, msgs []store.Message, epoch, gen uint64) error {
	return s.commit.exec(ctx, s.idemStmts(conv, msgs, epoch, gen))
}

// idemStmts are the writes of msgs' idempotency records.
func (s *Store) idemStmts(conv uint64, msgs []store.Message, epoch, gen uint64) []stmt {
	var out []stmt
	for _, m := range msgs {
		if m.ClientMsgID != "" {
			out = append(out, stmt{`INSERT INTO idempotency (conv_id, sender, client_msg_id, message_id, bucket, start_seq, seq)
			VALUES (?, ?, ?, ?, ?, ?, ?) USING TIMESTAMP ?`,
				[]any{i64(conv), m.Sender, m.ClientMsgID, i64(m.MsgID), s.bucketOf(m.ServerTime), i64(m.Seq), i64(m.Seq), writeTS(epoch, gen)}})
		}
	}
	return out
}

// afterOwned writes, after the lease is confirmed, what the batch's
// acknowledgements promise, as one group-committed write (commit.go): the
// idempotency records, outbox entries, @everyone and the read positions of
// ReadBy, with the members' rows if asked and the members are known
// without a read (a direct conversation's, once read); a failure fails the
// requests (the client's retry, a duplicate, writes the outbox entry
// again, after the next batch repaired the records, and leaves rows and
// read position to the caller). Rows that need the members read are
// written alongside (returned: whether they were; a failure is logged and
// left to the caller), as are the last_seq hint and coalesce keys
// (max-registers; a failure is logged). The hint is written only when the
// batch enters a message_seq partition the last hint did not reach: every
// reader probes the index from the hint's partition up, so a hint within
// the right partition is as good as an exact one.
func (s *Store) afterOwned(ctx context.Context, st *convState, reqs []*ownedReq, msgs []store.Message, epoch, gen uint64) (rows, read bool, err error) {
	last := msgs[len(msgs)-1].Seq
	var everyone uint64
	keys := map[string]uint64{}
	wantRows := false
	readers := map[store.Reader]uint64{} // → the seq of its last message
	for i, m := range msgs {
		if m.MentionAll {
			everyone = m.Seq
		}
		if m.CoalesceKey != "" {
			keys[m.CoalesceKey] = m.Seq
		}
		wantRows = wantRows || reqs[i].a.Rows
		if r := reqs[i].a.ReadBy; r != nil {
			readers[*r] = m.Seq
		}
	}
	o := &st.own
	o.mu.Lock()
	hint := o.hinted == 0 || s.blockOf(last) != s.blockOf(o.hinted)
	o.mu.Unlock()
	// One group-committed write (commit.go) carries the idempotency
	// records, outbox entries, @everyone, read positions and, when the
	// members are known without a read, their rows.
	stmts := s.idemStmts(st.id, msgs, epoch, gen)
	seqs := make([]uint64, len(msgs))
	for i, m := range msgs {
		seqs[i] = m.Seq
	}
	entries, err := s.outboxEntries(ctx, st.id, seqs...)
	if err != nil {
		return false, false, fmt.Errorf("seqs %d..%d are stored but their fan-out could not be recorded; retry to finish it: %w",
			msgs[0].Seq, last, err)
	}
	stmts = append(stmts, entries...)
	if everyone != 0 {
		stmts = append(stmts, stmt{`UPDATE conversations USING TIMESTAMP ? SET everyone_seq = ? WHERE conv_id = ?`,
			[]any{i64(everyone), i64(everyone), i64(st.id)}})
	}
	for r, seq := range readers {
		stmts = append(stmts, stmt{`UPDATE read_positions USING TIMESTAMP ? SET seq = ? WHERE user_id = ? AND conv_id = ? AND device = ?`,
			[]any{i64(seq), i64(seq), r.User, i64(st.id), r.Device}})
	}
	rowsInline := false
	if wantRows {
		o.mu.Lock()
		users := o.direct
		o.mu.Unlock()
		if users != nil {
			rowsInline = true
			stmts = append(stmts, s.rowStmts(st.id, users, msgs)...)
		}
	}
	var rowsErr, mainErr error
	var wg sync.WaitGroup
	wg.Go(func() { mainErr = s.commit.exec(ctx, stmts) })
	if hint || len(keys) > 0 {
		wg.Go(func() {
			var err error
			if hint {
				err = s.q(ctx, `UPDATE conversations USING TIMESTAMP ? SET last_seq = ? WHERE conv_id = ?`,
					i64(last), i64(last), i64(st.id)).Exec()
				if err == nil {
					o.mu.Lock()
					if o.epoch == epoch {
						o.hinted = max(o.hinted, last)
					}
					o.mu.Unlock()
				}
			}
			for k, seq := range keys {
				if err != nil {
					break
				}
				err = s.q(ctx, `UPDATE coalesce_latest USING TIMESTAMP ? SET seq = ? WHERE conv_id = ? AND key = ?`,
					i64(seq), i64(seq), i64(st.id), k).Exec()
			}
			if err != nil {
				// The next batch loads the top again, which sweeps.
				o.mu.Lock()
				o.epoch, o.sweep = 0, true
				o.mu.Unlock()
				s.log.Warn("cassandra: append: hints behind; the next write sweeps", logKeyConv, st.id, logKeySeq, last, logKeyErr, err)
			}
		})
	}
	if wantRows && !rowsInline {
		wg.Go(func() { rowsErr = s.batchRows(ctx, st, msgs) })
	}
	wg.Wait()
	if mainErr != nil {
		return false, false, fmt.Errorf("seqs %d..%d are stored but their idempotency records or fan-out could not be recorded; retry to finish it: %w",
			msgs[0].Seq, last, mainErr)
	}
	if rowsErr != nil {
		s.log.Warn("cassandra: append: rows left to fan-out", logKeyConv, st.id, logKeySeq, last, logKeyErr, rowsErr)
	}
	return wantRows && rowsErr == nil, len(readers) > 0, nil
}

// batchRows raises the rows of the conversation's current members to the
// batch's last seq, and the mention seq of the mentioned ones to the last
// message that mentions them. A direct conversation's members, which never
// change, are read once.
func (s *Store) batchRows(ctx context.Context, st *convState, msgs []store.Message) error {
	users, err := s.rowUsers(ctx, st)
	if err != nil {
		return err
	}
	return s.commit.execSplit(ctx, s.rowStmts(st.id, users, msgs)) // a partition per member
}

// rowStmts are the writes of batchRows for users (as raiseRow's).
func (s *Store) rowStmts(conv uint64, users []string, msgs []store.Message) []stmt {
	last := msgs[len(msgs)-1].Seq
	var out []stmt
	for _, u := range users {
		var mention uint64
		for _, m := range msgs {
			if m.MentionAll || slices.Contains(m.Mentions, u) {
				mention = m.Seq
			}
		}
		if mention != 0 && mention != last {
			out = append(out, rowStmt(conv, u, mention, true))
		}
		out = append(out, rowStmt(conv, u, last, mention == last))
	}
	return out
}

// rowUsers returns the conversation's current members.
func (s *Store) rowUsers(ctx context.Context, st *convState) ([]string, error) {
	o := &st.own
	o.mu.Lock()
	users := o.direct
	o.mu.Unlock()
	if users != nil {
		return users, nil
	}
	members, err := s.members(ctx, st.id)
	if err != nil {
		return nil, err
	}
	users = make([]string, len(members))
	for i, m := range members {
		users[i] = m.UserID
	}
	if st.exists.Load() && st.kind == store.Direct && len(users) == 2 {
		o.mu.Lock()
		o.direct = users
		o.mu.Unlock()
	}
	return users, nil
}

// ownedTop returns the top this process wrote as the conversation's
// owner, if it owns it under the epoch it loaded the top in.
func (s *Store) ownedTop(conv uint64) (uint64, bool) {
	if s.lease == nil {
		return 0, false
	}
	epoch, ok := s.lease.Epoch(conv)
	if !ok {
		return 0, false
	}
	// Unpinned: an evicted state's owner was idle, and its top was
	// written and confirmed under its epoch (a reload finds it again).
	st := s.convs.Peek(conv)
	if st == nil {
		return 0, false
	}
	st.own.mu.Lock()
	defer st.own.mu.Unlock()
	return st.own.top, st.own.epoch == epoch
}
