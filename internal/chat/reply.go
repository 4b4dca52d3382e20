package chat

import (
	"cmp"
	"context"
	"slices"
	"sync"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// Replies. A send may name in reply_to an earlier message of the same
// conversation; the store keeps the reference with the message and
// through its edits. The server sees only the seq, so replies work the
// same in end-to-end encrypted conversations (the quoted text is the
// client's, inside the envelope).

// checkReply vets a send's reply_to: a message (text, file or state, not
// an event) the sender may see — at or after its join_seq and already
// stored — and not recalled. A refusal stores nothing.
func (s *Service) checkReply(ctx context.Context, c Caller, cv store.Conversation, seq uint64) *protocol.Error {
	floor := uint64(1)
	if !c.Admin && cv.Kind != store.Direct {
		// Direct members join at seq 1.
		m, perr := s.member(ctx, c.User, cv.ID)
		if perr != nil {
			return perr
		}
		floor = max(m.JoinSeq, 1)
	}
	if seq < floor {
		return protocol.Errorf(protocol.CodeBadReference, "reply_to %d is before you joined the conversation (join_seq %d)", seq, floor)
	}
	msgs, err := s.store.Messages(ctx, cv.ID, seq, seq, 1)
	if err != nil {
		return s.storeErr("reply", err)
	}
	if len(msgs) == 0 || msgs[0].Seq != seq {
		return protocol.Errorf(protocol.CodeBadReference, "reply_to %d names no stored message", seq)
	}
	switch t := msgs[0]; {
	case t.Kind != protocol.KindText && t.Kind != protocol.KindFile && t.Kind != protocol.KindState:
		return protocol.Errorf(protocol.CodeBadReference, "reply_to %d is not a message (kind %s)", seq, t.Kind)
	case t.Recalled:
		return protocol.Errorf(protocol.CodeConflict, "message %d is recalled", seq)
	}
	return nil
}

// replyLookups bounds the reads in flight that markReplies makes for the
// targets outside the page.
const replyLookups = 8

// markReplies sets ReplyRecalled on the messages of wire (conv's, as
// read: ascending seqs) whose reply target is recalled. A target in the
// page is seen there; the others are read, each once.
func (s *Service) markReplies(ctx context.Context, conv uint64, wire []protocol.Message) error {
	var outside []uint64
	recalled := map[uint64]bool{}
	for i := range wire {
		r := wire[i].ReplyTo
		if r == 0 {
			continue
		}
		if j, ok := slices.BinarySearchFunc(wire, r, func(m protocol.Message, seq uint64) int { return cmp.Compare(m.Seq, seq) }); ok {
			recalled[r] = wire[j].Recalled
		} else if !slices.Contains(outside, r) {
			outside = append(outside, r)
		}
	}
	if len(recalled) == 0 && len(outside) == 0 {
		return nil
	}
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
		sem      = make(chan struct{}, replyLookups)
	)
	for _, seq := range outside {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			msgs, err := s.store.Messages(ctx, conv, seq, seq, 1)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			recalled[seq] = len(msgs) == 1 && msgs[0].Seq == seq && msgs[0].Recalled
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	for i := range wire {
		if r := wire[i].ReplyTo; r != 0 {
			wire[i].ReplyRecalled = recalled[r]
		}
	}
	return nil
}
