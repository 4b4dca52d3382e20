package cassandra

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/statecache"
)

// convState is this process's view of one conversation.
type convState struct {
	statecache.Node
	id uint64

	// kind is set before exists and never changes; readers load exists
	// first.
	kind   store.ConvKind
	exists atomic.Bool
	// hint is a seq known to be claimed (0: none known): claims start
	// right above it and index probes start at its block.
	hint atomic.Uint64

	// mu orders this process's seq claims, edits and membership changes
	// of the conversation.
	mu sync.Mutex
	// everyone is the @everyone seq a removal under mu marks on the
	// leavers' rows; guarded by mu.
	everyone uint64

	// inflight maps sender 0x00 client_msg_id to this process's append in
	// progress; a local duplicate waits for it instead of racing it.
	inflight struct {
		mu sync.Mutex
		m  map[string]*pendingAppend
	}

	// own is the owner's writer (Config.Lease set).
	own ownedConv
}

type pendingAppend struct {
	done chan struct{}
	res  store.AppendResult // valid after done if err == nil
	err  error
}

func (st *convState) raiseHint(seq uint64) {
	for {
		cur := st.hint.Load()
		if seq <= cur || st.hint.CompareAndSwap(cur, seq) {
			return
		}
	}
}

// state returns conv's state, pinned, creating an empty one; the caller
// calls s.release.
func (s *Store) state(conv uint64) *convState {
	return s.convs.GetOrCreate(conv, func(st *convState) {
		st.id = conv
	})
}

// release unpins a state of state or existing.
func (s *Store) release(st *convState) { s.convs.Release(st) }

// existing returns conv's state, pinned, after checking that the
// conversation exists (store.ErrNotFound if not); the caller calls
// s.release. Only existing conversations are cached.
func (s *Store) existing(ctx context.Context, conv uint64) (*convState, error) {
	if st := s.convs.Get(conv); st != nil {
		if st.exists.Load() {
			return st, nil
		}
		s.release(st)
	}
	row, err := s.convRow(ctx, conv)
	if err != nil {
		return nil, err
	}
	st := s.state(conv)
	s.learn(st, row)
	return st, nil
}

// check returns store.ErrNotFound if conv does not exist.
func (s *Store) check(ctx context.Context, conv uint64) error {
	st, err := s.existing(ctx, conv)
	if err == nil {
		s.release(st)
	}
	return err
}

// quiescent reports whether st may be evicted (statecache): it runs
// unpinned under the cache's lock. Nothing may be in flight, and an
// owner's writer must be idle with nothing that a reload would lose: a
// state that went through a write of unknown outcome carries a generation
// whose fence its writes must stay above, and one that lost its epoch
// must never write under it again, so such a state stays while its lease
// is still at that epoch (a new epoch starts over: its timestamps are above
// every older one's).
func (s *Store) quiescent(st *convState) bool {
	if !st.mu.TryLock() {
		return false
	}
	defer st.mu.Unlock()
	if !st.inflight.mu.TryLock() {
		return false
	}
	busy := len(st.inflight.m) != 0
	st.inflight.mu.Unlock()
	if busy {
		return false
	}
	o := &st.own
	if !o.mu.TryLock() {
		return false
	}
	defer o.mu.Unlock()
	if o.running || len(o.queue) != 0 || o.sweep {
		return false
	}
	if o.gen == 0 && o.lost == 0 {
		return true
	}
	epoch, ok := s.lease.Epoch(st.id)
	return ok && epoch > max(o.genEpoch, o.lost)
}

// learn records what a conversations row says about st.
func (s *Store) learn(st *convState, row store.Conversation) {
	st.raiseHint(row.LastSeq)
	if !st.exists.Load() {
		st.mu.Lock()
		if !st.exists.Load() {
			st.kind = row.Kind
			st.exists.Store(true)
		}
		st.mu.Unlock()
	}
}

// convRow reads a conversations row as stored: LastSeq is the hint.
func (s *Store) convRow(ctx context.Context, conv uint64) (store.Conversation, error) {
	var (
		kind, tier int8
		name       string
		created    int64
		members    int
		last, all  int64
		e2e        bool
	)
	err := s.q(ctx, `SELECT kind, name, created_at, members, tier, last_seq, e2e, everyone_seq FROM conversations WHERE conv_id = ?`, i64(conv)).
		Scan(&kind, &name, &created, &members, &tier, &last, &e2e, &all)
	if errors.Is(err, gocql.ErrNotFound) {
		return store.Conversation{}, store.ErrNotFound
	}
	if err != nil {
		return store.Conversation{}, err
	}
	return store.Conversation{ID: conv, Kind: store.ConvKind(kind), Name: name, CreatedAt: created,
		LastSeq: u64(last), Members: members, Tier: uint8(tier), E2E: e2e, EveryoneSeq: u64(all)}, nil
}

// ScanConvIDs calls fn with the id of every conversation, a page at a
// time, in token order, not id order (the table is hashed by id): the
// search indexer's catch-up in cluster mode (search.ConvScanner).
func (s *Store) ScanConvIDs(ctx context.Context, fn func(ids []uint64) error) error {
	iter := s.q(ctx, `SELECT conv_id FROM conversations`).PageSize(1000).Iter()
	ids := make([]uint64, 0, 1000)
	var id int64
	for iter.Scan(&id) {
		ids = append(ids, u64(id))
		if len(ids) == cap(ids) {
			if err := fn(ids); err != nil {
				iter.Close()
				return err
			}
			ids = ids[:0]
		}
	}
	if err := iter.Close(); err != nil {
		return fmt.Errorf("cassandra: scan conversation ids: %w", err)
	}
	if len(ids) > 0 {
		return fn(ids)
	}
	return nil
}

// CreateConversation stores c with its members, all with JoinSeq 1.
func (s *Store) CreateConversation(ctx context.Context, c store.Conversation, members []store.Member) error {
	const op = "create conversation"
	if err := s.create(ctx, c, members, ""); err != nil {
		return fmt.Errorf("cassandra: %s %d: %w", op, c.ID, err)
	}
	return nil
}

// create stores a new conversation (store.ErrExists if the id is taken)
// and then its members; pair is the direct_pairs key of a 1:1
// conversation, "" for a group.
func (s *Store) create(ctx context.Context, c store.Conversation, members []store.Member, pair string) error {
	seen := make(map[string]bool, len(members))
	uniq := members[:0:0]
	for _, m := range members {
		if !seen[m.UserID] {
			seen[m.UserID] = true
			uniq = append(uniq, m)
		}
	}
	// last_seq is left null: it is a max-register written with the seq as
	// its timestamp, which a write with a wall-clock timestamp would shadow.
	ins := s.lwt(ctx, `INSERT INTO conversations (conv_id, kind, name, created_at, members, direct_pair, e2e)
		VALUES (?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS`,
		i64(c.ID), int8(c.Kind), c.Name, c.CreatedAt, len(uniq), pair, c.E2E)
	applied, err := ins.MapScanCAS(map[string]any{})
	if err != nil {
		// Unknown outcome: the row decides whether the insert was ours.
		applied, err = s.sameConvRow(ctx, c, len(uniq), pair)
	}
	if err != nil {
		return err
	}
	if !applied {
		return store.ErrExists
	}
	epoch, owned := s.ownsNew(c.ID)
	var membersErr, fenceErr error
	var wg sync.WaitGroup
	wg.Go(func() { membersErr = s.writeMembers(ctx, c.ID, c.Kind, uniq) })
	if owned {
		wg.Go(func() { fenceErr = s.fenceNew(ctx, c.ID, epoch) })
	}
	wg.Wait()
	if err := errors.Join(membersErr, fenceErr); err != nil {
		return err
	}
	if owned {
		s.preload(c, epoch, nil)
	}
	return nil
}

// ownsNew returns the epoch under which this process owns the partition
// of a conversation it is creating, if it does.
func (s *Store) ownsNew(conv uint64) (uint64, bool) {
	if s.lease == nil {
		return 0, false
	}
	epoch, ok := s.lease.Epoch(conv)
	// One out of range is refused by takeConv at the first write.
	return epoch, ok && epoch != 0 && epoch*1000 <= 1<<53
}

// fenceNew writes the fences takeConv writes for a conversation whose top
// is 0 (one this process is creating, under an epoch ownsNew returned): a
// stale owner that loads it
// (under an older epoch) has its slots and membership changes shadowed or
// refused as after a takeover.
func (s *Store) fenceNew(ctx context.Context, conv, epoch uint64) error {
	return s.each(ctx, 2, func(ctx context.Context, i int) error {
		if i == 0 {
			return s.q(ctx, `UPDATE members USING TIMESTAMP ? SET fence = ? WHERE conv_id = ?`,
				fenceTS(epoch, 0), i64(epoch), i64(conv)).Exec()
		}
		return s.q(ctx, `DELETE FROM message_seq USING TIMESTAMP ? WHERE conv_id = ? AND seq_block = ? AND seq > ?`,
			fenceTS(epoch, 0), i64(conv), s.blockOf(1), i64(0)).Exec()
	})
}

// preload records, after fenceNew, that this process owns the new
// conversation c under epoch with top 0, so its first write needs no load
// (takeConv). A state that already went through a load (a request that
// named the new id before its creation finished) is left as it is;
// direct lists the members of a direct conversation (nil: read when
// needed).
func (s *Store) preload(c store.Conversation, epoch uint64, direct []string) {
	st := s.state(c.ID)
	defer s.release(st)
	c.LastSeq = 0 // a new conversation's (a caller's value is ignored)
	s.learn(st, c)
	st.mu.Lock()
	defer st.mu.Unlock()
	o := &st.own
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.epoch != 0 || o.gen != 0 || o.lost != 0 || o.running || len(o.queue) != 0 || st.hint.Load() != 0 {
		return
	}
	o.epoch, o.top, o.hinted = epoch, 0, 0
	if direct != nil {
		o.direct = direct
	}
}

// sameConvRow reads conv's row at SERIAL and reports whether it is the one
// create would have written.
func (s *Store) sameConvRow(ctx context.Context, c store.Conversation, members int, pair string) (bool, error) {
	var (
		kind      int8
		name, got string
		created   int64
		n         int
	)
	err := s.serialRead(ctx, `SELECT kind, name, created_at, members, direct_pair FROM conversations WHERE conv_id = ?`, i64(c.ID)).
		Scan(&kind, &name, &created, &n, &got)
	if err != nil {
		return false, err
	}
	return store.ConvKind(kind) == c.Kind && name == c.Name && created == c.CreatedAt && n == members && got == pair, nil
}

// writeMembers writes the members and conversation rows of a new
// conversation.
func (s *Store) writeMembers(ctx context.Context, conv uint64, kind store.ConvKind, members []store.Member) error {
	return s.each(ctx, len(members), func(ctx context.Context, i int) error {
		m := members[i]
		err := s.q(ctx, `INSERT INTO members (conv_id, user_id, role, join_seq) VALUES (?, ?, ?, 1)`,
			i64(conv), m.UserID, int8(m.Role)).Exec()
		if err != nil {
			return err
		}
		return s.q(ctx, `UPDATE user_conversations SET kind = ?, join_seq = 1 WHERE user_id = ? AND conv_id = ?`,
			int8(kind), m.UserID, i64(conv)).Exec()
	})
}

// each runs fn for 0..n-1 with bounded parallelism and returns the first
// error; it returns after every fn has.
func (s *Store) each(ctx context.Context, n int, fn func(ctx context.Context, i int) error) error {
	const parallel = 16
	if n == 1 {
		return fn(ctx, 0)
	}
	var (
		wg   sync.WaitGroup
		sem  = make(chan struct{}, parallel)
		mu   sync.Mutex
		errs []error
	)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := fn(ctx, i); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// pairKey is the direct_pairs key (and conversations.direct_pair) of a
// user pair, sorted so (a, b) and (b, a) meet.
func pairKey(a, b string) (lo, hi string) {
	if b < a {
		a, b = b, a
	}
	return a, b
}

// Direct returns the 1:1 conversation of a and b, creating it as newID.
func (s *Store) Direct(ctx context.Context, a, b string, newID uint64, now int64) (store.Conversation, error) {
	return s.directPair(ctx, a, b, newID, now, false)
}

// DirectE2E is Direct for the pair's end-to-end encrypted conversation. Its
// direct_pairs row has user_lo "e2e:<lo>" (":" is not allowed in ids).
func (s *Store) DirectE2E(ctx context.Context, a, b string, newID uint64, now int64) (store.Conversation, error) {
	return s.directPair(ctx, a, b, newID, now, true)
}

func (s *Store) directPair(ctx context.Context, a, b string, newID uint64, now int64, e2e bool) (store.Conversation, error) {
	const op = "direct"
	lo, hi := pairKey(a, b)
	mu := &s.directLocks[maphash.String(directSeed, lo+"\x00"+hi)%directStripes] // both kinds share a stripe
	mu.Lock()
	defer mu.Unlock()
	var c store.Conversation
	var err error
	if s.lease != nil {
		pairLo := lo
		if e2e {
			pairLo = "e2e:" + lo
		}
		c, err = s.ownerDirect(ctx, lo, hi, pairLo, pairLo+"\x00"+hi, newID, now, e2e)
	} else {
		c, err = s.direct(ctx, lo, hi, newID, now, e2e)
	}
	if err != nil {
		return store.Conversation{}, fmt.Errorf("cassandra: %s: %w", op, err)
	}
	return c, nil
}

var directSeed = maphash.MakeSeed()

// direct resolves the pair to a conversation id with a transaction on
// direct_pairs, then makes sure that conversation exists and is this
// pair's. A pair row left by a crash between the two steps is finished by
// the next call; one whose id turned out to belong to another conversation
// is removed again.
func (s *Store) direct(ctx context.Context, lo, hi string, newID uint64, now int64, e2e bool) (store.Conversation, error) {
	pairLo := lo
	if e2e {
		pairLo = "e2e:" + lo
	}
	pair := pairLo + "\x00" + hi
	if c, ok, err := s.newDirect(ctx, lo, hi, pairLo, pair, newID, now, e2e); err != nil || ok {
		return c, err
	}
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return store.Conversation{}, err
		}
		if attempt > 3 {
			return store.Conversation{}, fmt.Errorf("pair %q keeps changing: %w", pair, store.ErrConflict)
		}
		id, ours, err := s.claimPair(ctx, pairLo, hi, newID)
		if err != nil {
			return store.Conversation{}, err
		}
		row, err := s.convRow(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			// The pair's creator has not written the conversation yet, or
			// crashed before: create it (again); both write the same rows.
			c := store.Conversation{ID: id, Kind: store.Direct, CreatedAt: now, E2E: e2e}
			members := []store.Member{{UserID: lo}, {UserID: hi}}
			err = s.create(ctx, c, members, pair)
			if errors.Is(err, store.ErrExists) {
				err = nil // someone else's creation won; the check below decides
			}
			if err == nil {
				row, err = s.convRow(ctx, id)
			}
		}
		if err != nil {
			return store.Conversation{}, err
		}
		if row.Kind == store.Direct && s.pairOf(ctx, id) == pair {
			// The creator may still be writing the members rows, or have
			// crashed before: write the missing ones.
			if err := s.finishDirect(ctx, id, lo, hi); err != nil {
				return store.Conversation{}, err
			}
			return s.withTop(ctx, row)
		}
		// The id belongs to another conversation: undo the pair row.
		if err := s.releasePair(ctx, pairLo, hi, id); err != nil {
			return store.Conversation{}, err
		}
		if ours {
			return store.Conversation{}, fmt.Errorf("conversation %d: %w", id, store.ErrExists)
		}
	}
}

// newDirect creates the pair's conversation as newID when the pair has
// none yet, in the fewest round trips: the pair and newID are read (one
// round); the conversation's row and member rows are written (invisible:
// nothing refers to newID yet) with, when this process owns newID's
// partition, the owner's fences; then the pair is claimed (the commit
// point, the one transaction); then the users' rows. It reports false,
// having changed nothing visible, when the pair exists, newID is taken or
// another creator claimed the pair first (its rows are deleted again):
// the caller then takes the general path. A crash after the claim leaves
// the users' rows to finishDirect.
func (s *Store) newDirect(ctx context.Context, lo, hi, pairLo, pair string, newID uint64, now int64, e2e bool) (store.Conversation, bool, error) {
	var (
		pairErr, convErr error
		wg               sync.WaitGroup
	)
	wg.Go(func() {
		var id int64
		pairErr = s.q(ctx, `SELECT conv_id FROM direct_pairs WHERE user_lo = ? AND user_hi = ?`, pairLo, hi).Scan(&id)
	})
	wg.Go(func() { _, convErr = s.convRow(ctx, newID) })
	wg.Wait()
	if !errors.Is(pairErr, gocql.ErrNotFound) || !errors.Is(convErr, store.ErrNotFound) {
		return store.Conversation{}, false, errors.Join(ignoreNotFound(pairErr), ignoreNotFound(convErr))
	}
	c := store.Conversation{ID: newID, Kind: store.Direct, CreatedAt: now, Members: 2, E2E: e2e}
	epoch, owned := s.ownsNew(newID)
	var rowErr, membersErr, fenceErr error
	wg.Go(func() {
		// last_seq is left null, as in create.
		rowErr = s.q(ctx, `INSERT INTO conversations (conv_id, kind, name, created_at, members, direct_pair, e2e)
			VALUES (?, ?, ?, ?, ?, ?, ?)`, i64(newID), int8(store.Direct), "", now, 2, pair, e2e).Exec()
	})
	wg.Go(func() {
		b := s.sess.Batch(gocql.UnloggedBatch).WithContext(ctx).Consistency(s.cons)
		for _, u := range []string{lo, hi} {
			b.Query(`INSERT INTO members (conv_id, user_id, role, join_seq) VALUES (?, ?, ?, 1)`, i64(newID), u, int8(store.RoleMember))
		}
		if owned {
			// The members fence of fenceNew, in the same partition.
			b.Query(`UPDATE members USING TIMESTAMP ? SET fence = ? WHERE conv_id = ?`, fenceTS(epoch, 0), i64(epoch), i64(newID))
		}
		membersErr = b.Exec()
	})
	if owned {
		wg.Go(func() {
			fenceErr = s.q(ctx, `DELETE FROM message_seq USING TIMESTAMP ? WHERE conv_id = ? AND seq_block = ? AND seq > ?`,
				fenceTS(epoch, 0), i64(newID), s.blockOf(1), i64(0)).Exec()
		})
	}
	wg.Wait()
	if err := errors.Join(rowErr, membersErr, fenceErr); err != nil {
		s.dropNew(ctx, newID)
		return store.Conversation{}, false, err
	}
	id, ours, err := s.claimPair(ctx, pairLo, hi, newID)
	if err != nil {
		return store.Conversation{}, false, err // the general path's claim settles it
	}
	if !ours || id != newID {
		s.dropNew(ctx, newID)
		return store.Conversation{}, false, nil
	}
	if err := s.each(ctx, 2, func(ctx context.Context, i int) error {
		u := []string{lo, hi}[i]
		return s.q(ctx, `UPDATE user_conversations SET kind = ?, join_seq = 1 WHERE user_id = ? AND conv_id = ?`,
			int8(store.Direct), u, i64(newID)).Exec()
	}); err != nil {
		return store.Conversation{}, false, err
	}
	if owned {
		s.preload(c, epoch, []string{lo, hi})
	}
	return c, true, nil
}

func ignoreNotFound(err error) error {
	if errors.Is(err, gocql.ErrNotFound) || errors.Is(err, store.ErrNotFound) {
		return nil
	}
	return err
}

// dropNew deletes what newDirect wrote for an id no pair refers to (best
// effort: the rows are unreachable anyway).
func (s *Store) dropNew(ctx context.Context, id uint64) {
	err := errors.Join(
		s.q(ctx, `DELETE FROM conversations WHERE conv_id = ?`, i64(id)).Exec(),
		s.q(ctx, `DELETE FROM members WHERE conv_id = ?`, i64(id)).Exec())
	if err != nil {
		s.log.Warn("cassandra: direct: dropping an unclaimed conversation failed", logKeyConv, id, logKeyErr, err)
	}
}

// finishDirect writes the member and conversation rows of lo and hi in
// direct conversation id whose conversation row is missing (each
// creator writes a user's conversation row last); rows that exist are
// left as they are.
func (s *Store) finishDirect(ctx context.Context, id uint64, lo, hi string) error {
	users := []string{lo, hi}
	missing := make([]bool, 2)
	if err := s.each(ctx, 2, func(ctx context.Context, i int) error {
		var kind *int8
		err := s.q(ctx, `SELECT kind FROM user_conversations WHERE user_id = ? AND conv_id = ?`, users[i], i64(id)).Scan(&kind)
		missing[i] = errors.Is(err, gocql.ErrNotFound) || err == nil && kind == nil
		return ignoreNotFound(err)
	}); err != nil {
		return err
	}
	var add []store.Member
	for i, u := range users {
		if missing[i] {
			add = append(add, store.Member{UserID: u})
		}
	}
	if len(add) == 0 {
		return nil
	}
	return s.writeMembers(ctx, id, store.Direct, add)
}

// claimPair inserts pair → newID unless the pair has a conversation; it
// returns the pair's conversation and whether the row is the one it wrote.
func (s *Store) claimPair(ctx context.Context, lo, hi string, newID uint64) (uint64, bool, error) {
	cur := map[string]any{}
	applied, err := s.lwt(ctx, `INSERT INTO direct_pairs (user_lo, user_hi, conv_id) VALUES (?, ?, ?) IF NOT EXISTS`,
		lo, hi, i64(newID)).MapScanCAS(cur)
	if err == nil {
		if applied {
			return newID, true, nil
		}
		id, _ := cur["conv_id"].(int64)
		return u64(id), false, nil
	}
	// Unknown outcome: read the row at SERIAL.
	var id int64
	if rerr := s.serialRead(ctx, `SELECT conv_id FROM direct_pairs WHERE user_lo = ? AND user_hi = ?`, lo, hi).Scan(&id); rerr != nil {
		return 0, false, errors.Join(err, rerr)
	}
	return u64(id), u64(id) == newID, nil
}

func (s *Store) releasePair(ctx context.Context, lo, hi string, id uint64) error {
	_, err := s.lwt(ctx, `DELETE FROM direct_pairs WHERE user_lo = ? AND user_hi = ? IF conv_id = ?`, lo, hi, i64(id)).
		MapScanCAS(map[string]any{})
	return err
}

// pairOf returns conversations.direct_pair of id ("" if unreadable: the
// caller then treats the id as someone else's, which is the safe side).
func (s *Store) pairOf(ctx context.Context, id uint64) string {
	var pair string
	if err := s.q(ctx, `SELECT direct_pair FROM conversations WHERE conv_id = ?`, i64(id)).Scan(&pair); err != nil {
		s.log.Warn("cassandra: direct: reading the pair failed", logKeyConv, id, logKeyErr, err)
		return ""
	}
	return pair
}

// Conversation returns the conversation's row with LastSeq read from the
// seq index.
func (s *Store) Conversation(ctx context.Context, id uint64) (store.Conversation, error) {
	const op = "conversation"
	row, err := s.convRow(ctx, id)
	if top, owned := s.ownedTop(id); err == nil && owned {
		// The owner knows the top without reading the index.
		row.LastSeq = max(row.LastSeq, top)
	} else if err == nil {
		row, err = s.withTop(ctx, row)
	}
	if err != nil {
		return store.Conversation{}, fmt.Errorf("cassandra: %s %d: %w", op, id, err)
	}
	return row, nil
}

// withTop sets row.LastSeq to the top of the seq index.
func (s *Store) withTop(ctx context.Context, row store.Conversation) (store.Conversation, error) {
	st := s.state(row.ID)
	defer s.release(st)
	s.learn(st, row)
	top, err := s.top(ctx, st)
	row.LastSeq = top
	return row, err
}

// SetTier records the conversation's fan-out tier. Nothing else writes
// the tier cell, so a plain write suffices.
func (s *Store) SetTier(ctx context.Context, convID uint64, tier uint8) error {
	const op = "set tier"
	err := s.check(ctx, convID)
	if err == nil {
		err = s.q(ctx, `UPDATE conversations SET tier = ? WHERE conv_id = ?`, int8(tier), i64(convID)).Exec()
	}
	if err != nil {
		return fmt.Errorf("cassandra: %s %d: %w", op, convID, err)
	}
	return nil
}

// ConvStates returns the number of conversation states in memory and how
// many have been evicted since Open (for tests, benchmarks and metrics).
func (s *Store) ConvStates() (held int, evicted uint64) {
	return s.convs.Len(), s.convs.Evicted()
}

// EvictIdle evicts every conversation state that may go now and returns
// how many went: tests use it to force a reload between two operations.
func (s *Store) EvictIdle() int { return s.convs.EvictIdle() }

// LastSeq returns the conversation's last seq: from memory on its owner,
// else one index probe (Conversation reads the conversations row too).
func (s *Store) LastSeq(ctx context.Context, id uint64) (uint64, error) {
	const op = "last seq"
	if top, owned := s.ownedTop(id); owned {
		return top, nil
	}
	st, err := s.existing(ctx, id)
	if err == nil {
		defer s.release(st)
		var top uint64
		if top, err = s.top(ctx, st); err == nil {
			return top, nil
		}
	}
	return 0, fmt.Errorf("cassandra: %s %d: %w", op, id, err)
}
