package fanout

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// Coalesced reactions. A reaction event takes a seq like any event, but in
// a medium or large group a storm of them (a thousand a second on one
// message) pushed one by one would cost every online member a push per
// reaction. There, reaction events are not pushed themselves: a
// conversation's run of consecutive reaction events is held for at most
// ReactionInterval from its first and leaves as one `reactions` push
// {from_seq, seq, reacted: [{seq, reactions}]} — the counts of every
// target the run changed, as they are after its last event — so an
// online member receives at most one such push per interval per group,
// however many reactions. Any other message of the conversation pushes
// the held run first, so the pushes a device receives still cover the
// seqs in order: a device that has everything up to from_seq−1 has, with
// it, everything up to seq; one that does not fills the gap as for any
// hole (history, whose reaction events are stubs carrying the counts).
// Consumers (webhooks, push notifications) still see every event, at
// once. A run held when the process stops is not pushed: its events are
// stored and acknowledged, and devices learn them by seq (gap fill, sync)
// like a large group's push that was lost.

// IsReaction reports whether kind is a reaction event's.
func IsReaction(kind string) bool { return kind == protocol.KindReact || kind == protocol.KindUnreact }

// reactRun is one conversation's held reaction events. mu is held while
// the run is pushed, so that the conversation's next push waits for it.
type reactRun struct {
	mu     sync.Mutex
	dead   bool // removed from Fanout.reacts: make another
	cv     store.Conversation
	tier   uint8
	from   uint64
	to     uint64
	opened time.Time // the first held event's arrival (zero: none held)
	used   time.Time // the last event held or pushed
	// counts are each target's counts after the run's events (nil: to
	// be read at the push); order is the targets in seq order.
	counts map[uint64]*[]store.Reaction
}

// coalesces reports whether a reaction event of cv in tier is held for a
// reactions push rather than pushed on its own.
func coalesces(cv store.Conversation, tier uint8) bool {
	return cv.Kind == store.Group && tier != TierSmall
}

// holdReaction adds reaction event j (of cv, in tier) to its
// conversation's run.
func (f *Fanout) holdReaction(j Job, cv store.Conversation, tier uint8) {
	now := time.Now()
	for {
		f.reactMu.Lock()
		r := f.reacts[cv.ID]
		if r == nil {
			r = &reactRun{}
			f.reacts[cv.ID] = r
		}
		f.reactMu.Unlock()
		r.mu.Lock()
		if r.dead {
			r.mu.Unlock()
			continue
		}
		if r.opened.IsZero() {
			r.from, r.opened, r.counts = j.Msg.Seq, now, map[uint64]*[]store.Reaction{}
		}
		r.cv, r.tier, r.to, r.used = cv, tier, j.Msg.Seq, now
		r.counts[j.Msg.TargetSeq] = j.Reactions
		r.mu.Unlock()
		return
	}
}

// flushReactions pushes conv's held run, if any, before the conversation's
// next message.
func (f *Fanout) flushReactions(ctx context.Context, conv uint64) {
	f.reactMu.Lock()
	r := f.reacts[conv]
	f.reactMu.Unlock()
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	f.pushRunLocked(ctx, r)
}

// pushRunLocked pushes r's held events as one reactions push and empties
// r. A failure is logged: the events are stored, and devices find them by
// seq.
func (f *Fanout) pushRunLocked(ctx context.Context, r *reactRun) {
	if r.opened.IsZero() {
		return
	}
	conv, from, to, tier := r.cv.ID, r.from, r.to, r.tier
	targets := make([]uint64, 0, len(r.counts))
	for t := range r.counts {
		targets = append(targets, t)
	}
	slices.Sort(targets)
	reacted := make([]protocol.Reacted, 0, len(targets))
	for _, t := range targets {
		var counts []store.Reaction
		if c := r.counts[t]; c != nil {
			counts = *c
		} else {
			msgs, err := f.st.Messages(ctx, conv, t, t, 1)
			if err != nil {
				f.log.Warn("reactions push: target not read; left to gap fill", "conv", conv, "seq", t, "err", err)
				continue
			}
			if len(msgs) == 1 && msgs[0].Seq == t {
				counts = msgs[0].Reactions
			}
		}
		rs := WireReactions(counts)
		if rs == nil {
			rs = []protocol.Reaction{}
		}
		reacted = append(reacted, protocol.Reacted{Seq: t, Reactions: rs})
	}
	r.opened, r.counts, r.used = time.Time{}, nil, time.Now()
	ack := AckPolicy(tier)
	frame := &protocol.Frame{Type: protocol.TypeReactions, ConvID: conv, FromSeq: from, Seq: to, Reacted: reacted, Ack: ack}
	d := delivery{conv: conv, seq: to, untracked: ack == protocol.AckNone}
	var (
		pushed     int
		err        error
		recipients []string
	)
	recipients, err = f.onlineMembers(conv, from)
	if lists, ok := f.groupLists(r.cv, tier); ok {
		var data []byte
		if data, err = json.Marshal(frame); err == nil {
			pushed, err = f.pushGroupData(ctx, lists, data, d)
		}
	} else if err == nil {
		pushed, err = f.push(ctx, recipients, frame, d)
	}
	if err == nil && tier == TierMedium && len(recipients) > 0 {
		_, err = f.writeRows(ctx, conv, to, recipients, false)
	}
	if err != nil {
		f.log.Warn("reactions push failed; left to gap fill", "conv", conv, "from", from, "to", to, "err", err)
	}
	if f.obs.Fanout != nil {
		f.obs.Fanout(TierName(tier), 0, pushed)
	}
}

// reactLoop pushes each run once it has been held for ReactionInterval,
// and forgets conversations whose runs have been idle for a minute, until
// ctx ends.
func (f *Fanout) reactLoop(ctx context.Context) {
	tick := time.NewTicker(max(f.reactEvery/5, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			f.reactMu.Lock()
			due := make([]*reactRun, 0, len(f.reacts))
			for conv, r := range f.reacts {
				if !r.mu.TryLock() {
					continue // being held to or pushed: looked at next tick
				}
				switch {
				case !r.opened.IsZero() && now.Sub(r.opened) >= f.reactEvery:
					due = append(due, r)
				case r.opened.IsZero() && now.Sub(r.used) > time.Minute:
					r.dead = true
					delete(f.reacts, conv)
				}
				r.mu.Unlock()
			}
			f.reactMu.Unlock()
			for _, r := range due {
				r.mu.Lock()
				if !r.opened.IsZero() && time.Since(r.opened) >= f.reactEvery {
					f.pushRunLocked(ctx, r)
				}
				r.mu.Unlock()
			}
		}
	}
}

// withCounts sets on reaction event j's message its target's counts after
// it (from the request, or read), for its push on its own.
func (f *Fanout) withCounts(ctx context.Context, j Job) store.Message {
	m := j.Msg
	if j.Reactions != nil {
		m.Reactions = *j.Reactions
		return m
	}
	msgs, err := f.st.Messages(ctx, m.ConvID, m.TargetSeq, m.TargetSeq, 1)
	if err != nil || len(msgs) != 1 || msgs[0].Seq != m.TargetSeq {
		// Pushed without counts: the client reads them with history.
		return m
	}
	m.Reactions = msgs[0].Reactions
	return m
}
