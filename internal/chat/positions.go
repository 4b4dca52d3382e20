package chat

import (
	"context"
	"hash/maphash"
	"sync"
	"time"

	"github.com/parley-im/parley/internal/store"
)

// Delivered positions are kept in memory and persisted in batches.
//
// A `delivered` ack is the most frequent frame a server receives (one per
// push, or one per connection and second with cumulative acks), and the
// position it moves only decides whether the peer of a direct conversation
// gets a `delivered` receipt. So an ack is answered from memory: the first
// ack of a (user, conversation) on this process checks the membership and
// reads the stored position; later acks compare and raise the in-memory
// position under a sharded lock, and the receipt goes out at once. A
// background flush (Service.RunPositions) writes the raised positions to
// the store every PositionFlush.
//
// A crash loses at most the last PositionFlush of raised positions: after
// a restart the device's next `delivered` raises them again and its peer
// gets that `delivered` receipt once more. Messages are never affected:
// the stored messages, conversation rows and read positions do not depend
// on it, and re-sends are driven by the gateway's unacknowledged pushes.

// positionShards spreads the positions over independent locks.
const positionShards = 64

// positionIdle is how long an entry that is persisted and untouched stays
// in memory; a later ack reloads it (one membership and one position read).
const positionIdle = 2 * time.Minute

type posKey struct {
	user string
	conv uint64
}

// posEntry is one (user, conversation) delivered position. The entry's
// existence means the user is (or was) a member: membership rows are never
// deleted, so the check never needs repeating.
type posEntry struct {
	seq       uint64 // highest acked, in memory
	persisted uint64 // highest written to the store
	touched   int64  // unix ms of the last ack
}

type posShard struct {
	mu sync.Mutex
	m  map[posKey]*posEntry
}

// convInfo is what an ack needs of a conversation: its kind and, for a
// direct one, the members (who gets receipts), and the last seq seen, to
// treat an ack beyond it as the last seq. A conversation's kind and a
// direct conversation's members never change; lastSeq is re-read only when
// an ack goes beyond it.
type convInfo struct {
	kind    store.ConvKind
	members []string // direct conversations only
	lastSeq uint64
	touched int64
	// conv is a direct conversation as a send read it (directConv): all
	// of it but LastSeq, Tier and EveryoneSeq is fixed at its creation.
	conv *store.Conversation
}

// directConv returns direct conversation conv as remembered, if user is
// one of its two members: a send then needs neither the conversation nor
// the membership read. Both never change (no membership operation applies
// to a direct conversation: members.go group), so the copy never goes
// stale; only LastSeq, which the send does not use, moves.
func (s *Service) directConv(conv uint64, user string) (store.Conversation, bool) {
	p := s.pos
	p.convMu.Lock()
	defer p.convMu.Unlock()
	ci := p.convs[conv]
	if ci == nil || ci.conv == nil || len(ci.members) != 2 || (ci.members[0] != user && ci.members[1] != user) {
		return store.Conversation{}, false
	}
	ci.touched = s.now().UnixMilli()
	return *ci.conv, true
}

// rememberDirect keeps cv, a direct conversation a send just read, for
// directConv once its members are known (directMembers).
func (s *Service) rememberDirect(cv store.Conversation) {
	if cv.Kind != store.Direct {
		return
	}
	p := s.pos
	p.convMu.Lock()
	defer p.convMu.Unlock()
	if ci := p.convs[cv.ID]; ci != nil && ci.conv == nil && len(ci.members) == 2 {
		ci.conv = &cv
	}
}

// lastSeqer is implemented by stores that read a conversation's last seq
// for less than the whole conversation (Cassandra: one index probe, none
// on the conversation's owner).
type lastSeqer interface {
	LastSeq(ctx context.Context, conv uint64) (uint64, error)
}

// directMembers returns the two members of direct conversation conv,
// remembered with the conversation's ack state (they never change).
func (s *Service) directMembers(ctx context.Context, conv uint64) ([]string, error) {
	p := s.pos
	p.convMu.Lock()
	ci := p.convs[conv]
	var members []string
	if ci != nil {
		members = ci.members
	}
	p.convMu.Unlock()
	if members != nil {
		return members, nil
	}
	ms, err := s.store.Members(ctx, conv)
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		members = append(members, m.UserID)
	}
	if len(members) == 2 {
		p.convMu.Lock()
		if ci := p.convs[conv]; ci != nil {
			ci.members = members
		} else {
			p.convs[conv] = &convInfo{kind: store.Direct, members: members, touched: s.now().UnixMilli()}
		}
		p.convMu.Unlock()
	}
	return members, nil
}

// ownKey is a read position as the send path keeps it (ownRead).
type ownKey struct {
	user, device string
	conv         uint64
}

// ownEntry is a lower bound of a read position: a value it had (read
// positions only rise), so a send that takes it for the position before
// the message never misses the read receipt the move deserves; at worst,
// after a move on another process, it pushes one more, as true (the
// sender has read up to its message).
type ownEntry struct {
	seq     uint64
	touched int64
}

type ownShard struct {
	mu sync.Mutex
	m  map[ownKey]*ownEntry
}

type positions struct {
	seed   maphash.Seed
	shards [positionShards]posShard
	own    [positionShards]ownShard

	convMu sync.Mutex
	convs  map[uint64]*convInfo

	flushMu sync.Mutex // one flush at a time
}

func newPositions() *positions {
	p := &positions{seed: maphash.MakeSeed(), convs: make(map[uint64]*convInfo)}
	for i := range p.shards {
		p.shards[i].m = make(map[posKey]*posEntry)
		p.own[i].m = make(map[ownKey]*ownEntry)
	}
	return p
}

func (p *positions) ownShard(k ownKey) *ownShard {
	var h maphash.Hash
	h.SetSeed(p.seed)
	_, _ = h.WriteString(k.user)
	_, _ = h.WriteString(k.device)
	var b [8]byte
	for i := range b {
		b[i] = byte(k.conv >> (8 * i))
	}
	_, _ = h.Write(b[:])
	return &p.own[h.Sum64()%positionShards]
}

// ownRead returns a lower bound of user's read position (of device, with
// per-device reads) in conv that this process knows, if any.
func (s *Service) ownRead(user, device string, conv uint64) (uint64, bool) {
	k := ownKey{user, device, conv}
	sh := s.pos.ownShard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[k]
	if e == nil {
		return 0, false
	}
	e.touched = s.now().UnixMilli()
	return e.seq, true
}

// sawRead records that the read position reached at least seq.
func (s *Service) sawRead(user, device string, conv, seq uint64) {
	k := ownKey{user, device, conv}
	sh := s.pos.ownShard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.m[k]; e != nil {
		e.seq, e.touched = max(e.seq, seq), s.now().UnixMilli()
		return
	}
	sh.m[k] = &ownEntry{seq: seq, touched: s.now().UnixMilli()}
}

func (p *positions) shard(k posKey) *posShard {
	var h maphash.Hash
	h.SetSeed(p.seed)
	_, _ = h.WriteString(k.user)
	var b [8]byte
	for i := range b {
		b[i] = byte(k.conv >> (8 * i))
	}
	_, _ = h.Write(b[:])
	return &p.shards[h.Sum64()%positionShards]
}

// entry returns the (user, conv) position, loading it on first use: the
// membership check and the stored position.
func (s *Service) posEntry(ctx context.Context, user string, conv uint64, nowMS int64) (*posShard, *posEntry, error) {
	k := posKey{user, conv}
	sh := s.pos.shard(k)
	sh.mu.Lock()
	e := sh.m[k]
	sh.mu.Unlock()
	if e != nil {
		return sh, e, nil
	}
	if _, err := s.store.Member(ctx, conv, user); err != nil {
		return nil, nil, err
	}
	stored, err := s.store.Delivered(ctx, user, conv)
	if err != nil {
		return nil, nil, err
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e = sh.m[k]; e == nil { // a concurrent first ack may have won
		e = &posEntry{seq: stored, persisted: stored, touched: nowMS}
		sh.m[k] = e
	}
	return sh, e, nil
}

// conv returns what an ack of up to seq needs to know of conv, re-reading
// it when seq is beyond the last seq known.
func (s *Service) convInfo(ctx context.Context, conv, seq uint64, nowMS int64) (convInfo, error) {
	p := s.pos
	p.convMu.Lock()
	ci := p.convs[conv]
	if ci != nil && seq <= ci.lastSeq {
		ci.touched = nowMS
		out := *ci
		p.convMu.Unlock()
		return out, nil
	}
	p.convMu.Unlock()
	if ls, ok := s.store.(lastSeqer); ok && ci != nil {
		// Only the last seq is new: read it alone (an owner knows it).
		last, err := ls.LastSeq(ctx, conv)
		if err != nil {
			return convInfo{}, err
		}
		p.convMu.Lock()
		defer p.convMu.Unlock()
		if cur := p.convs[conv]; cur != nil {
			ci = cur
		} else {
			p.convs[conv] = ci
		}
		ci.lastSeq = max(ci.lastSeq, last)
		ci.touched = nowMS
		return *ci, nil
	}
	cv, err := s.store.Conversation(ctx, conv)
	if err != nil {
		return convInfo{}, err
	}
	var members []string
	if ci != nil {
		members = ci.members
	} else if cv.Kind == store.Direct {
		ms, err := s.store.Members(ctx, conv)
		if err != nil {
			return convInfo{}, err
		}
		for _, m := range ms {
			members = append(members, m.UserID)
		}
	}
	p.convMu.Lock()
	defer p.convMu.Unlock()
	ci = p.convs[conv]
	if ci == nil {
		ci = &convInfo{kind: cv.Kind, members: members}
		p.convs[conv] = ci
	}
	ci.lastSeq = max(ci.lastSeq, cv.LastSeq)
	ci.touched = nowMS
	return *ci, nil
}

// FlushPositions writes every delivered position raised since the last
// flush to the store and forgets entries (and remembered read positions
// and conversations) idle for positionIdle. A position
// that fails to write stays raised in memory and is tried again next time.
func (s *Service) FlushPositions(ctx context.Context) error {
	p := s.pos
	p.flushMu.Lock()
	defer p.flushMu.Unlock()
	nowMS := s.now().UnixMilli()
	idleBefore := nowMS - positionIdle.Milliseconds()
	type dirty struct {
		k   posKey
		seq uint64
	}
	var batch []dirty
	for i := range p.shards {
		sh := &p.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			switch {
			case e.seq > e.persisted:
				batch = append(batch, dirty{k, e.seq})
			case e.touched < idleBefore:
				delete(sh.m, k)
			}
		}
		sh.mu.Unlock()
	}
	var firstErr error
	persisted := func(d dirty) {
		sh := p.shard(d.k)
		sh.mu.Lock()
		if e := sh.m[d.k]; e != nil {
			e.persisted = max(e.persisted, d.seq)
		}
		sh.mu.Unlock()
	}
	if r, ok := s.store.(store.DeliveredRaiser); ok && len(batch) > 0 {
		// All at once (Cassandra: shared batches, no read-back).
		ps := make([]store.Delivered, len(batch))
		for i, d := range batch {
			ps[i] = store.Delivered{User: d.k.user, ConvID: d.k.conv, Seq: d.seq}
		}
		if firstErr = r.RaiseDelivered(ctx, ps); firstErr == nil {
			for _, d := range batch {
				persisted(d)
			}
		}
		batch = nil
	}
	for _, d := range batch {
		if _, err := s.store.SetDelivered(ctx, d.k.user, d.k.conv, d.seq); err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		persisted(d)
	}
	for i := range p.own {
		sh := &p.own[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if e.touched < idleBefore {
				delete(sh.m, k)
			}
		}
		sh.mu.Unlock()
	}
	p.convMu.Lock()
	for id, ci := range p.convs {
		if ci.touched < idleBefore {
			delete(p.convs, id)
		}
	}
	p.convMu.Unlock()
	if firstErr != nil {
		s.log.Warn("delivered positions: flush failed; kept in memory for the next flush", "err", firstErr)
	}
	return firstErr
}

// RunPositions flushes delivered positions every PositionFlush until ctx
// ends, then once more (with its own deadline), so a clean stop loses
// none. Run it before the store is closed and stop it first.
func (s *Service) RunPositions(ctx context.Context) {
	t := time.NewTicker(s.cfg.PositionFlush)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			_ = s.FlushPositions(fctx)
			cancel()
			return
		case <-t.C:
			_ = s.FlushPositions(ctx)
		}
	}
}
