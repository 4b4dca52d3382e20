package cassandra

import (
	"context"
	"errors"
	"fmt"
	"sync"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/parley-im/parley/internal/store"
)

// Owned direct conversations (Config.Lease set). The pair's conversation
// is decided by the owner of the partition of store.DirectKey (the
// gateways route open_direct there), under the stripe lock of the pair,
// with plain writes — no transaction:
//
//  1. read the pair's row with its write time (and the new id's row);
//  2. if the pair has none, write the new conversation's row and member
//     rows and the pair's row, the latter USING TIMESTAMP epoch·1000+2g+1
//     (writeTS: above every write of an older epoch, and of an older
//     generation g of this epoch); if it has one whose write time is below
//     that timestamp, write the same row again at it (a conversation row
//     the pair's creator did not get to write is written too);
//  3. confirm the lease (Lease.Confirm) — every answer, written or only
//     read, is given only after the lease was found still held;
//  4. the users' conversation rows; the answer.
//
// Why one conversation per pair. Every pair row is written by an owner of
// the pair's partition at a timestamp of its epoch, and a newer epoch's
// timestamps are above every older one's. An answer X was confirmed after
// X was read or written at quorum, at a time the lease was still held at
// epoch e, so any later owner (epoch > e) takes the lease after that, reads
// X (or a rewrite of it) and answers X. Could X still be overwritten? Only
// by a write in flight with a higher timestamp: that needs an owner of
// epoch e' with e' > the write time of X that read "none" before X landed
// — but the owner that answered X wrote it at its own timestamp (step 2)
// unless X already carried that timestamp, so X's write time is at least
// writeTS(e, g) and any such e' is above e: the lease moved after the
// confirmation, so that owner read after X landed. A stale owner's write
// of a new pair row is never acknowledged (its confirmation fails); it
// either landed before the new owner's read (and is what the new owner
// adopts and rewrites) or loses to the new owner's higher timestamp.
// Within one epoch the owner serialises the pair in memory; a pair write
// of unknown outcome moves the pair to the next generation (pairFails),
// so a retry that finds no row writes above the lost write's timestamp.
// Past maxGen generations the lease moves to a new epoch (as writeEpoch).
//
// A row whose write time is above the owner's timestamp (a legacy row
// written by a transaction, or by this process at a generation it no
// longer remembers) is answered as it is once the lease is confirmed: no
// newer epoch exists then, and every write in flight has a lower
// timestamp.

// maxPairFails bounds the pairs remembered with a write of unknown outcome
// under a current epoch; past it a new pair is refused (retry) until
// entries of superseded epochs are pruned. A variable for tests.
var maxPairFails = 1 << 16

// pairFail is a pair whose row write had an unknown outcome under epoch:
// its next write uses generation gen.
type pairFail struct {
	key, epoch, gen uint64
}

type pairFailures struct {
	mu sync.Mutex
	m  map[string]pairFail
}

// pairEpoch returns the epoch and generation of the pair's next write, or
// store.ErrNotOwner if this process does not own the pair's partition.
func (s *Store) pairEpoch(ctx context.Context, key uint64, pair string) (epoch, gen uint64, err error) {
	epoch, ok := s.lease.Epoch(key)
	if !ok {
		return 0, 0, store.ErrNotOwner
	}
	if epoch == 0 || epoch*1000 > 1<<53 {
		return 0, 0, fmt.Errorf("epoch %d out of range", epoch)
	}
	pf := &s.pairFails
	pf.mu.Lock()
	f, failed := pf.m[pair]
	if !failed && len(pf.m) >= maxPairFails {
		s.prunePairFails()
		if len(pf.m) >= maxPairFails {
			pf.mu.Unlock()
			return 0, 0, fmt.Errorf("%d pairs have writes of unknown outcome; retry", len(pf.m))
		}
	}
	pf.mu.Unlock()
	switch {
	case !failed || f.epoch < epoch:
		return epoch, 0, nil
	case f.epoch > epoch:
		return 0, 0, fmt.Errorf("%w: pair written under epoch %d, above %d", store.ErrNotOwner, f.epoch, epoch)
	case f.gen <= maxGen:
		return epoch, f.gen, nil
	}
	next, ok, err := s.lease.Reepoch(ctx, key, epoch)
	switch {
	case err != nil:
		return 0, 0, fmt.Errorf("pair write generations of epoch %d used up and no new epoch: nothing was written, retry: %w", epoch, err)
	case !ok:
		return 0, 0, fmt.Errorf("%w: lease lost when moving on from epoch %d", store.ErrNotOwner, epoch)
	case next <= epoch:
		return 0, 0, fmt.Errorf("lease moved from epoch %d to %d, not above it: nothing was written, retry", epoch, next)
	}
	s.log.Info("cassandra: direct: pair write generations used up; the partition's lease moved to a new epoch", "epoch", next)
	return next, 0, nil
}

// prunePairFails drops the entries whose epoch is no longer this
// process's lease of their partition; under pairFails.mu.
func (s *Store) prunePairFails() {
	for p, f := range s.pairFails.m {
		if e, ok := s.lease.Epoch(f.key); !ok || e != f.epoch {
			delete(s.pairFails.m, p)
		}
	}
}

// pairWriteFailed records that the pair's write at (epoch, gen) had an
// unknown outcome: the next one uses gen+1.
func (s *Store) pairWriteFailed(key uint64, pair string, epoch, gen uint64) {
	pf := &s.pairFails
	pf.mu.Lock()
	defer pf.mu.Unlock()
	if pf.m == nil {
		pf.m = map[string]pairFail{}
	}
	if f, ok := pf.m[pair]; ok && (f.epoch > epoch || f.epoch == epoch && f.gen > gen) {
		return
	}
	pf.m[pair] = pairFail{key: key, epoch: epoch, gen: gen + 1}
}

// pairWritten forgets the pair's failures once a write at (epoch, gen) is
// confirmed: every earlier write has a lower timestamp and loses.
func (s *Store) pairWritten(pair string, epoch, gen uint64) {
	pf := &s.pairFails
	pf.mu.Lock()
	defer pf.mu.Unlock()
	if f, ok := pf.m[pair]; ok && f.epoch == epoch && f.gen == gen {
		delete(pf.m, pair)
	}
}

// directRow reads conv's row with its direct_pair.
func (s *Store) directRow(ctx context.Context, conv uint64) (store.Conversation, string, error) {
	var (
		kind, tier int8
		name, pair string
		created    int64
		members    int
		last, all  int64
		e2e        bool
	)
	err := s.q(ctx, `SELECT kind, name, created_at, members, tier, last_seq, e2e, everyone_seq, direct_pair FROM conversations WHERE conv_id = ?`, i64(conv)).
		Scan(&kind, &name, &created, &members, &tier, &last, &e2e, &all, &pair)
	if errors.Is(err, gocql.ErrNotFound) {
		return store.Conversation{}, "", store.ErrNotFound
	}
	if err != nil {
		return store.Conversation{}, "", err
	}
	return store.Conversation{ID: conv, Kind: store.ConvKind(kind), Name: name, CreatedAt: created,
		LastSeq: u64(last), Members: members, Tier: uint8(tier), E2E: e2e, EveryoneSeq: u64(all)}, pair, nil
}

// ownerDirect is Direct on the pair's owner (see above); the caller holds
// the pair's stripe lock.
func (s *Store) ownerDirect(ctx context.Context, lo, hi, pairLo, pair string, newID uint64, now int64, e2e bool) (store.Conversation, error) {
	key := store.DirectKey(lo, hi, e2e)
	epoch, gen, err := s.pairEpoch(ctx, key, pair)
	if err != nil {
		return store.Conversation{}, err
	}
	ts := writeTS(epoch, gen)

	// 1. The pair's row and the new id's.
	var (
		cur, wt          int64
		pairErr, newErr  error
		wg               sync.WaitGroup
		found, newFree   bool
		row              store.Conversation
		rowPair          string
		rowErr           error
		writePair, write bool // the pair row; the conversation's rows
	)
	wg.Go(func() {
		pairErr = s.q(ctx, `SELECT conv_id, WRITETIME(conv_id) FROM direct_pairs WHERE user_lo = ? AND user_hi = ?`, pairLo, hi).Scan(&cur, &wt)
		if pairErr == nil {
			row, rowPair, rowErr = s.directRow(ctx, u64(cur))
		}
	})
	wg.Go(func() { _, newErr = s.convRow(ctx, newID) })
	wg.Wait()
	switch {
	case pairErr == nil:
		found = true
	case !errors.Is(pairErr, gocql.ErrNotFound):
		return store.Conversation{}, pairErr
	}
	switch {
	case errors.Is(newErr, store.ErrNotFound):
		newFree = true
	case newErr != nil:
		return store.Conversation{}, newErr
	}
	id := newID
	switch {
	case !found:
		writePair, write = true, true
	case errors.Is(rowErr, store.ErrNotFound):
		// The pair's creator wrote the pair row but not (yet) the
		// conversation's: write it (the same rows).
		id, writePair, write = u64(cur), wt < ts, true
	case rowErr != nil:
		return store.Conversation{}, rowErr
	case row.Kind == store.Direct && rowPair == pair:
		id, writePair = u64(cur), wt < ts
	case wt >= ts:
		return store.Conversation{}, fmt.Errorf("pair %q names conversation %d of another pair: %w", pair, cur, store.ErrConflict)
	default:
		// A legacy row naming another pair's conversation: the pair gets
		// a new one.
		writePair, write = true, true
	}
	if write && id == newID && !newFree {
		return store.Conversation{}, fmt.Errorf("conversation %d: %w", newID, store.ErrExists)
	}

	// 2. The writes, as one group-committed write (commit.go): the pair
	// row at the owner's timestamp and, for a conversation not (fully)
	// written yet, its row and members, with the owner's fences of the
	// conversation's partition when this process owns it.
	c := store.Conversation{ID: id, Kind: store.Direct, CreatedAt: now, Members: 2, E2E: e2e}
	convEpoch, owned := s.ownsNew(id)
	owned = owned && write && id == newID
	var stmts []stmt
	if write {
		// last_seq is left null, as in create.
		stmts = append(stmts,
			stmt{`INSERT INTO conversations (conv_id, kind, name, created_at, members, direct_pair, e2e) VALUES (?, ?, ?, ?, ?, ?, ?)`,
				[]any{i64(id), int8(store.Direct), "", now, 2, pair, e2e}},
			stmt{`INSERT INTO members (conv_id, user_id, role, join_seq) VALUES (?, ?, ?, 1)`, []any{i64(id), lo, int8(store.RoleMember)}},
			stmt{`INSERT INTO members (conv_id, user_id, role, join_seq) VALUES (?, ?, ?, 1)`, []any{i64(id), hi, int8(store.RoleMember)}})
		if owned {
			// fenceNew's fences, the members one in the members partition.
			stmts = append(stmts,
				stmt{`UPDATE members USING TIMESTAMP ? SET fence = ? WHERE conv_id = ?`, []any{fenceTS(convEpoch, 0), i64(convEpoch), i64(id)}},
				stmt{`DELETE FROM message_seq USING TIMESTAMP ? WHERE conv_id = ? AND seq_block = ? AND seq > ?`,
					[]any{fenceTS(convEpoch, 0), i64(id), s.blockOf(1), i64(0)}})
		}
	}
	if writePair {
		stmts = append(stmts, stmt{`INSERT INTO direct_pairs (user_lo, user_hi, conv_id) VALUES (?, ?, ?) USING TIMESTAMP ?`,
			[]any{pairLo, hi, i64(id), ts}})
	}
	if err := s.fault("direct.write"); err != nil {
		return store.Conversation{}, err // nothing written
	}
	// Test points: the write lost on its way (it may still land) or its
	// answer lost; either is an unknown outcome.
	err = s.fault("direct.lost")
	if err == nil {
		if err = s.commit.exec(ctx, stmts); err == nil {
			err = s.fault("direct.unknown")
		}
	}
	if err != nil {
		if writePair {
			s.pairWriteFailed(key, pair, epoch, gen)
		}
		return store.Conversation{}, fmt.Errorf("the pair's conversation %d may be written: %w", id, err)
	}

	// 3. The lease.
	if err := s.lease.Confirm(ctx, key, epoch); err != nil {
		s.log.Warn("cassandra: direct: lease lost; not acknowledged", logKeyErr, err)
		return store.Conversation{}, fmt.Errorf("%w: %v", store.ErrNotOwner, err)
	}
	if writePair {
		s.pairWritten(pair, epoch, gen)
	}

	// 4. The users' rows, then the answer.
	if write {
		if err := s.commit.exec(ctx, []stmt{
			{`UPDATE user_conversations SET kind = ?, join_seq = 1 WHERE user_id = ? AND conv_id = ?`, []any{int8(store.Direct), lo, i64(id)}},
			{`UPDATE user_conversations SET kind = ?, join_seq = 1 WHERE user_id = ? AND conv_id = ?`, []any{int8(store.Direct), hi, i64(id)}},
		}); err != nil {
			return store.Conversation{}, err
		}
		if owned {
			s.preload(c, convEpoch, []string{lo, hi})
		}
		if id == newID {
			return c, nil // nothing can be appended before its row exists
		}
		return s.withTop(ctx, c)
	}
	// The creator may have stopped before the users' rows.
	if err := s.finishDirect(ctx, id, lo, hi); err != nil {
		return store.Conversation{}, err
	}
	if top, ok := s.ownedTop(id); ok {
		row.LastSeq = max(row.LastSeq, top)
		return row, nil
	}
	return s.withTop(ctx, row)
}
