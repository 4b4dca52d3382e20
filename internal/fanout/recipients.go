package fanout

import (
	"context"
	"fmt"

	"github.com/parley-im/parley/internal/store"
)

// recipients are the members allowed to see j's message: both members of
// a direct conversation, every member of a small group, and in larger
// tiers only the online ones.
func (f *Fanout) recipients(ctx context.Context, cv store.Conversation, tier uint8, j Job) ([]string, error) {
	seq := j.Msg.Seq
	switch {
	case cv.Kind == store.Direct && len(j.Members) == 2:
		// Both members see every message, and they never change.
		return j.Members, nil
	case cv.Kind == store.Direct, tier == TierSmall:
		return f.members(ctx, cv.ID, seq)
	}
	return f.onlineMembers(cv.ID, seq)
}

// members are conv's members who joined at or before seq.
func (f *Fanout) members(ctx context.Context, conv, seq uint64) ([]string, error) {
	members, err := f.st.Members(ctx, conv)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(members))
	for _, mb := range members {
		if mb.JoinSeq <= seq {
			out = append(out, mb.UserID)
		}
	}
	return out, nil
}

// onlineMembers are the online members of a tracked group who joined at or
// before seq, found through the online index so the cost follows the
// members online, not the group's size. The index carries each member's
// join_seq (nothing below it is pushed); it learns joins (Joined) before
// their event is stored and forgets a member when it leaves (Left), so no
// membership is read per recipient.
func (f *Fanout) onlineMembers(conv, seq uint64) ([]string, error) {
	online, ok := f.online.GroupOnline(conv)
	if !ok {
		return nil, fmt.Errorf("group %d is not tracked", conv)
	}
	out := make([]string, 0, len(online))
	for _, m := range online {
		if m.JoinSeq <= seq {
			out = append(out, m.UserID)
		}
	}
	return out, nil
}
