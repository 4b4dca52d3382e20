package chat

import (
	"context"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// syncParallelism bounds the conversations one sync or list reads at once.
const syncParallelism = 16

// Snapshot answers a batch sync: in one request, the new messages of
// every listed conversation (and, with all, every other conversation of the
// user from its read position). Per conversation, with gap = last_seq − from:
// 0 → left out; ≤ SnapshotRangeLimit → the whole range; more → the latest
// SnapshotLatest and the count of the others.
func (s *Service) Snapshot(ctx context.Context, c Caller, req []protocol.SyncConv, all bool) ([]protocol.ConvSnapshot, *protocol.Error) {
	rows, err := s.store.UserConversations(ctx, c.User)
	if err != nil {
		return nil, s.storeErr("sync", err)
	}
	byID := make(map[uint64]store.ConvRow, len(rows))
	for _, r := range rows {
		byID[r.ConvID] = r
	}
	asked := make(map[uint64]uint64, len(req))
	for _, rc := range req {
		if _, ok := byID[rc.ConvID]; !ok {
			return nil, protocol.Errorf(protocol.CodeNotMember, "not a member of conversation %d", rc.ConvID)
		}
		asked[rc.ConvID] = rc.AfterSeq
	}
	// Conversations are read concurrently (a bounded pool): on a
	// wide-column store each is a few round trips, and a user in hundreds
	// of groups must still sync in one request without hundreds of
	// sequential waits.
	snaps := make([]*protocol.ConvSnapshot, len(rows))
	var failed atomic.Pointer[protocol.Error]
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(syncParallelism)
	for i, r := range rows {
		from, ok := asked[r.ConvID]
		if !ok && !all {
			continue
		}
		g.Go(func() error {
			read, err := s.store.Read(gctx, c.User, s.readDevice(c), r.ConvID)
			if err != nil {
				failed.CompareAndSwap(nil, s.storeErr("sync", err))
				return err
			}
			if !ok {
				from = read
			}
			last, perr := s.lastSeq(gctx, r)
			if perr == nil {
				r.LastSeq = last
				snaps[i], perr = s.snapshotOne(gctx, r, from, read)
			}
			if perr != nil {
				failed.CompareAndSwap(nil, perr)
				return perr
			}
			return nil
		})
	}
	if g.Wait() != nil {
		return nil, failed.Load()
	}
	out := make([]protocol.ConvSnapshot, 0, len(rows))
	for _, sn := range snaps {
		if sn != nil {
			out = append(out, *sn)
		}
	}
	if s.obs.Snapshot != nil {
		s.obs.Snapshot(len(out))
	}
	return out, nil
}

// lastSeq is the last seq of r's conversation the user may see: the
// conversation's own last_seq, in every tier and for direct conversations
// too (rows are written by fan-out, which may lag the ACK or have failed
// and wait for compensation; the conversation's last_seq never does),
// capped at the member's leave_seq.
func (s *Service) lastSeq(ctx context.Context, r store.ConvRow) (uint64, *protocol.Error) {
	cv, err := s.store.Conversation(ctx, r.ConvID)
	if err != nil {
		return 0, s.storeErr("sync", err)
	}
	return visibleLast(r, cv), nil
}

// visibleLast is the last seq of cv that r's member may see.
func visibleLast(r store.ConvRow, cv store.Conversation) uint64 {
	last := max(r.LastSeq, cv.LastSeq)
	if r.LeaveSeq != 0 {
		last = min(last, r.LeaveSeq)
	}
	return last
}

// mentioned reports whether a message above read mentions r's member: an
// explicit mention (its row's mention_seq) or, for a current member, the
// conversation's last @everyone since it joined (a leaver's row took the
// last one it was there for when it left).
func mentioned(r store.ConvRow, cv store.Conversation, read uint64) bool {
	if r.MentionSeq > read {
		return true
	}
	e := cv.EveryoneSeq
	return r.LeaveSeq == 0 && e > read && e >= r.JoinSeq
}

func (s *Service) snapshotOne(ctx context.Context, r store.ConvRow, from, read uint64) (*protocol.ConvSnapshot, *protocol.Error) {
	floor := max(r.JoinSeq, 1) - 1 // the member has seen nothing below join_seq
	from = max(from, floor)
	if r.LastSeq <= from {
		return nil, nil
	}
	gap := r.LastSeq - from
	snap := &protocol.ConvSnapshot{
		ConvID: r.ConvID, Kind: r.Kind.String(), LastSeq: r.LastSeq, ReadSeq: read, JoinSeq: r.JoinSeq,
		Unread: r.LastSeq - min(max(read, floor), r.LastSeq), FromSeq: from,
	}
	var (
		msgs []store.Message
		err  error
	)
	if gap <= uint64(s.cfg.SnapshotRangeLimit) {
		msgs, err = s.store.Messages(ctx, r.ConvID, from+1, r.LastSeq, int(gap))
	} else {
		msgs, err = s.store.Latest(ctx, r.ConvID, r.LastSeq+1, from+1, s.cfg.SnapshotLatest)
		snap.MoreUnread = gap - uint64(len(msgs))
	}
	if err == nil {
		err = s.asOfLeave(ctx, r.ConvID, r.LeaveSeq, msgs)
	}
	snap.Messages = fanout.WireAll(msgs)
	if err == nil {
		err = s.markReplies(ctx, r.ConvID, snap.Messages)
	}
	if err == nil {
		err = s.markReactions(ctx, r.ConvID, r.UserID, snap.Messages)
	}
	if err != nil {
		return nil, s.storeErr("sync", err)
	}
	return snap, nil
}

// conversations is the conversation list: every conversation of the
// user with last_seq, unread and the last message.
func (s *Service) conversations(ctx context.Context, c Caller) ([]protocol.ConvSummary, *protocol.Error) {
	rows, err := s.store.UserConversations(ctx, c.User)
	if err != nil {
		return nil, s.storeErr("conversations", err)
	}
	return s.summaries(ctx, c, rows)
}

// summaries are the conversation list entries of rows, c's own.
func (s *Service) summaries(ctx context.Context, c Caller, rows []store.ConvRow) ([]protocol.ConvSummary, *protocol.Error) {
	out := make([]protocol.ConvSummary, 0, len(rows))
	mutes, err := s.store.ConvMutes(ctx, c.User)
	if err != nil {
		return nil, s.storeErr("conversations", err)
	}
	for _, r := range rows {
		cv, err := s.store.Conversation(ctx, r.ConvID)
		if err != nil {
			return nil, s.storeErr("conversations", err)
		}
		read, err := s.store.Read(ctx, c.User, s.readDevice(c), r.ConvID)
		if err != nil {
			return nil, s.storeErr("conversations", err)
		}
		r.LastSeq = visibleLast(r, cv)
		floor := max(r.JoinSeq, 1) - 1
		sum := protocol.ConvSummary{
			ConvID: r.ConvID, Kind: cv.Kind.String(), Name: cv.Name, LastSeq: r.LastSeq,
			ReadSeq: read, JoinSeq: r.JoinSeq, Unread: r.LastSeq - min(max(read, floor), r.LastSeq),
			Mentioned: mentioned(r, cv, read), LeaveSeq: r.LeaveSeq, E2E: cv.E2E, MuteUntil: s.muteUntil(mutes[r.ConvID]),
		}
		if r.LastSeq > floor {
			last, err := s.store.Latest(ctx, r.ConvID, r.LastSeq+1, floor+1, 1)
			if err == nil {
				err = s.asOfLeave(ctx, r.ConvID, r.LeaveSeq, last)
			}
			if err != nil {
				return nil, s.storeErr("conversations", err)
			}
			if len(last) == 1 {
				wm := fanout.WireAll(last)
				if err := s.markReplies(ctx, r.ConvID, wm); err != nil {
					return nil, s.storeErr("conversations", err)
				}
				if err := s.markReactions(ctx, r.ConvID, c.User, wm); err != nil {
					return nil, s.storeErr("conversations", err)
				}
				sum.LastMessage = &wm[0]
			}
		}
		if cv.Kind == store.Direct {
			members, err := s.store.Members(ctx, r.ConvID)
			if err != nil {
				return nil, s.storeErr("conversations", err)
			}
			for _, m := range members {
				if m.UserID != c.User {
					sum.Peer = m.UserID
				}
			}
			if sum.Peer != "" {
				if sum.PeerReadSeq, sum.PeerDeliveredSeq, err = s.peerPositions(ctx, sum.Peer, r.ConvID); err != nil {
					return nil, s.storeErr("conversations", err)
				}
			}
		}
		out = append(out, sum)
	}
	return out, nil
}

// peerPositions are how far the peer of a direct conversation has read and
// received it: what the read and delivered receipts said, for a device that
// was not there to see them. Delivered is the in-memory position where this
// process holds one (it runs ahead of the stored one by at most a flush),
// never below read. Under the per-device read scope no single read
// position stands for the peer, and read is 0.
func (s *Service) peerPositions(ctx context.Context, peer string, conv uint64) (read, delivered uint64, err error) {
	if s.cfg.ReadScope != ReadPerDevice {
		if read, err = s.store.Read(ctx, peer, "", conv); err != nil {
			return 0, 0, err
		}
	}
	if delivered, err = s.store.Delivered(ctx, peer, conv); err != nil {
		return 0, 0, err
	}
	k := posKey{peer, conv}
	sh := s.pos.shard(k)
	sh.mu.Lock()
	if e := sh.m[k]; e != nil {
		delivered = max(delivered, e.seq)
	}
	sh.mu.Unlock()
	return read, max(delivered, read), nil
}
