package chat

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"

	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// Reactions. A react frame is an event like an edit: it takes a seq, the
// store applies it to the target's counts and the reactor's own set under
// the conversation's lock (store.React), and it is fanned out as any
// event (medium and large groups coalesce them: fanout reactions.go).
// Reads carry aggregates, not events: a message carries its counts and
// whether the reader is among them; a reaction event is a stub without
// its emoji, the page's last one of each target carrying the target's
// counts now and the others superseded, so that a device catching up
// over a storm applies one count per message. In an end-to-end encrypted conversation the server
// must not learn who reacted how: a react frame there is e2e_unsupported.

// DefaultReactions is chat.reactions' default set.
const DefaultReactions = "👍 ❤️ 😂 😮 😢 🙏 🎉 🔥"

// maxReactionSet bounds chat.reactions.
const maxReactionSet = 64

// reactionAllowed reports whether emoji is in the configured set.
func (s *Service) reactionAllowed(emoji string) bool {
	return slices.Contains(strings.Fields(s.cfg.Reactions), emoji)
}

// prepareReact runs a reaction's checks that need no lock: the emoji is
// in the set, the target at or after the sender's join_seq, and an added
// emoji within chat.reactions_per_user (from the sender's set before the
// write: two concurrent reactions of one user to one message may pass
// together). It returns the Check the store runs on the target.
func (s *Service) prepareReact(ctx context.Context, c Caller, cv store.Conversation, f *protocol.Frame) (func(store.Message) (store.Message, error), *protocol.Error) {
	if !s.reactionAllowed(f.Emoji) {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "%q is not one of this server's reactions (%s)", f.Emoji, s.cfg.Reactions)
	}
	floor := uint64(1)
	if cv.Kind != store.Direct {
		m, perr := s.member(ctx, c.User, cv.ID)
		if perr != nil {
			return nil, perr
		}
		floor = max(m.JoinSeq, 1)
	}
	if f.TargetSeq < floor {
		return nil, protocol.Errorf(protocol.CodeBadReference, "target_seq %d is before you joined the conversation (join_seq %d)", f.TargetSeq, floor)
	}
	if !f.Remove {
		mine, err := s.store.ReactedBy(ctx, cv.ID, c.User, f.TargetSeq, f.TargetSeq)
		if err != nil {
			return nil, s.storeErr("react", err)
		}
		if len(mine) == 1 && !slices.Contains(mine[0].Emojis, f.Emoji) && len(mine[0].Emojis) >= s.cfg.ReactionsPerUser {
			return nil, protocol.Errorf(protocol.CodeTooLarge, "you have %d reactions on message %d (chat.reactions_per_user %d)", len(mine[0].Emojis), f.TargetSeq, s.cfg.ReactionsPerUser)
		}
	}
	return reactCheck(f), nil
}

// reactCheck accepts a reaction's target under the conversation's lock: a
// message (text, file or state), not an event, not recalled.
func reactCheck(f *protocol.Frame) func(store.Message) (store.Message, error) {
	return func(t store.Message) (store.Message, error) {
		switch {
		case t.Kind != protocol.KindText && t.Kind != protocol.KindFile && t.Kind != protocol.KindState:
			return t, protocol.Errorf(protocol.CodeBadReference, "target_seq %d is not a message (kind %s)", t.Seq, t.Kind)
		case t.Recalled:
			return t, protocol.Errorf(protocol.CodeConflict, "message %d is recalled", t.Seq)
		}
		return t, nil
	}
}

// reactErr is the client-facing error of a reaction's append: one that
// changes nothing is conflict, a target beyond the conversation
// bad_reference.
func (s *Service) reactErr(err error) *protocol.Error {
	switch {
	case errors.Is(err, store.ErrConflict):
		return protocol.Errorf(protocol.CodeConflict, "nothing to change: the reaction is already there, or not there to remove")
	case errors.Is(err, store.ErrNotFound):
		return protocol.Errorf(protocol.CodeBadReference, "target_seq names no stored message")
	}
	return s.storeErr("react", err)
}

// IsReaction reports whether kind is a reaction event's.
func IsReaction(kind string) bool { return kind == protocol.KindReact || kind == protocol.KindUnreact }

// reactLookups bounds the reads in flight that markReactions makes for
// the targets outside the page.
const reactLookups = 8

// markReactions turns wire (conv's messages as user reads them, ascending
// seqs) into aggregates: Me on the counts of the user's own reactions,
// and each reaction event a stub without its emoji: the last one of each
// target carries that target's counts now (read when the target is not
// in the page; absent: none), the others are superseded.
func (s *Service) markReactions(ctx context.Context, conv uint64, user string, wire []protocol.Message) error {
	if len(wire) == 0 {
		return nil
	}
	last := map[uint64]int{} // target → index of its last event in wire
	any := false
	for i := range wire {
		m := &wire[i]
		if IsReaction(m.Kind) {
			m.Body, m.Reactions = "", nil
			last[m.TargetSeq] = i
			continue
		}
		any = any || len(m.Reactions) > 0
	}
	if !any && len(last) == 0 {
		return nil
	}
	// The user's own reactions over the page's range, and the targets
	// outside it one by one.
	lo, hi := wire[0].Seq, wire[len(wire)-1].Seq
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
		sem      = make(chan struct{}, reactLookups)
		mine     = map[uint64][]string{}
		outside  = map[uint64][]protocol.Reaction{}
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	wg.Go(func() {
		rs, err := s.store.ReactedBy(ctx, conv, user, lo, hi)
		if err != nil {
			fail(err)
			return
		}
		mu.Lock()
		for _, r := range rs {
			mine[r.Seq] = r.Emojis
		}
		mu.Unlock()
	})
	for target := range last {
		if target >= lo && target <= hi {
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			msgs, err := s.store.Messages(ctx, conv, target, target, 1)
			if err != nil {
				fail(err)
				return
			}
			rs, err := s.store.ReactedBy(ctx, conv, user, target, target)
			if err != nil {
				fail(err)
				return
			}
			var counts []protocol.Reaction
			if len(msgs) == 1 && msgs[0].Seq == target {
				counts = fanout.WireReactions(msgs[0].Reactions)
			}
			if len(rs) == 1 {
				setMe(counts, rs[0].Emojis)
			}
			mu.Lock()
			outside[target] = counts
			mu.Unlock()
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	for i := range wire {
		m := &wire[i]
		if !IsReaction(m.Kind) {
			setMe(m.Reactions, mine[m.Seq])
		}
	}
	for target, i := range last {
		if target >= lo && target <= hi {
			if j, ok := slices.BinarySearchFunc(wire, target, func(m protocol.Message, seq uint64) int {
				return cmp.Compare(m.Seq, seq)
			}); ok {
				wire[i].Reactions = slices.Clone(wire[j].Reactions)
			}
			continue
		}
		wire[i].Reactions = outside[target]
	}
	for i := range wire {
		if m := &wire[i]; IsReaction(m.Kind) && last[m.TargetSeq] != i {
			m.Superseded = true
		}
	}
	return nil
}

// setMe marks in counts the emojis the reader has.
func setMe(counts []protocol.Reaction, emojis []string) {
	for i := range counts {
		counts[i].Me = slices.Contains(emojis, counts[i].Emoji)
	}
}

// reactorBefore is a reactor's set before r as the store accepted it
// (adding: without the emoji, removing: with it), for recomputing the
// target's counts after r (store.ApplyReact uses the set only to refuse).
func reactorBefore(r store.React) []string {
	if r.Remove {
		return []string{r.Emoji}
	}
	return nil
}
