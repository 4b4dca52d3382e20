package chat

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/parley-im/parley/protocol"
)

// Group read receipts ("read by N of M") are computed when asked, from the
// read positions the service keeps anyway (every read frame and own send
// writes one per user and conversation): a message's receipts are never
// written, whatever the tier, so reading a group costs no write per member
// per message. An answer costs one membership list, one point read of the
// message (its sender is left out) and one position read per eligible
// member, readPositionReads at a time; the tier changes none of it (read
// positions are per user in every tier).

// readPositionReads bounds the position reads one answer has in flight.
const readPositionReads = 16

// readBy answers read_by for message seq of conv.
func (s *Service) readBy(ctx context.Context, c Caller, conv, seq uint64) (*protocol.Frame, *protocol.Error) {
	if s.cfg.ReadScope == ReadPerDevice {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "read_by needs read positions per user (chat.read_scope: user)")
	}
	me, perr := s.member(ctx, c.User, conv)
	switch {
	case perr != nil:
		return nil, perr
	case me.LeaveSeq != 0:
		return nil, protocol.Errorf(protocol.CodeNotMember, "no longer a member of this conversation")
	case seq < max(me.JoinSeq, 1):
		return nil, protocol.Errorf(protocol.CodeBadReference, "message %d is before you joined the conversation (join_seq %d)", seq, me.JoinSeq)
	}
	msgs, err := s.store.Messages(ctx, conv, seq, seq, 1)
	if err != nil {
		return nil, s.storeErr("read_by", err)
	}
	if len(msgs) == 0 || msgs[0].Seq != seq {
		return nil, protocol.Errorf(protocol.CodeBadReference, "no message %d in this conversation", seq)
	}
	sender := msgs[0].Sender
	members, err := s.store.Members(ctx, conv)
	if err != nil {
		return nil, s.storeErr("read_by", err)
	}
	if len(members) > s.cfg.ReadByMaxMembers {
		return nil, protocol.Errorf(protocol.CodeTooLarge, "read_by answers for conversations of at most %d members, this one has %d", s.cfg.ReadByMaxMembers, len(members))
	}
	var eligible []string
	for _, m := range members {
		if m.UserID != sender && m.JoinSeq <= seq {
			eligible = append(eligible, m.UserID)
		}
	}
	read := make([]bool, len(eligible))
	var (
		wg     sync.WaitGroup
		sem    = make(chan struct{}, readPositionReads)
		failed atomic.Pointer[error]
	)
	for i, u := range eligible {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			pos, err := s.store.Read(ctx, u, "", conv)
			if err != nil {
				failed.CompareAndSwap(nil, &err)
				return
			}
			read[i] = pos >= seq
		})
	}
	wg.Wait()
	if e := failed.Load(); e != nil {
		return nil, s.storeErr("read_by", *e)
	}
	rb := &protocol.ReadBy{ConvID: conv, Seq: seq, MemberCount: len(eligible)}
	list := len(eligible) <= s.cfg.ReadByNames
	for i, u := range eligible {
		if !read[i] {
			continue
		}
		rb.ReadCount++
		if list {
			rb.Users = append(rb.Users, u)
		}
	}
	slices.Sort(rb.Users)
	return &protocol.Frame{Type: protocol.TypeReadBy, ReadBy: rb}, nil
}
