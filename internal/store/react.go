package store

import (
	"context"
	"fmt"
	"slices"
)

// Reactions. A reaction is an event like an edit: an Append with
// TargetSeq and React set, which takes its own seq. Under the
// conversation's lock the engine reads the reactor's own reactions to the
// target (ReactedBy), runs Append.Check on the target (the caller's
// policy: kind, recall, window), and stores with the event the target's
// new counts (Message.Reactions) and the reactor's new set. Counts live on
// the target so that reads need no scan of every reactor; the reactor's
// set is a row of its own (per conversation and user, ordered by seq) so
// that a page of messages learns "me" in one range read.

// Reaction is one emoji's count on a message.
type Reaction struct {
	Emoji string
	Count int
}

// React is the reaction an Append stores: Emoji added to (or, with
// Remove, taken from) the sender's reactions to the target.
type React struct {
	Emoji  string
	Remove bool
}

// Reacted is one message's reactions by one user.
type Reacted struct {
	Seq    uint64
	Emojis []string
}

// Reactions is the per-user side of reactions.
type Reactions interface {
	// ReactedBy lists user's reactions to the messages of conv with
	// from ≤ seq ≤ to, in ascending seq order (messages without any are
	// left out).
	ReactedBy(ctx context.Context, conv uint64, user string, from, to uint64) ([]Reacted, error)
}

// MaxReactionsPerUser bounds one user's emojis on one message (the
// allowed set of the service is smaller).
const MaxReactionsPerUser = 64

// ApplyReact returns target with r applied to its counts and mine (the
// reactor's emojis before) as they are after it. Adding an emoji the
// reactor has, or removing one it has not, is ErrConflict: nothing
// changes, nothing is stored.
func ApplyReact(target Message, mine []string, r React) (Message, []string, error) {
	has := slices.Contains(mine, r.Emoji)
	switch {
	case r.Remove && !has:
		return target, mine, fmt.Errorf("no reaction %q to remove: %w", r.Emoji, ErrConflict)
	case !r.Remove && has:
		return target, mine, fmt.Errorf("reaction %q already there: %w", r.Emoji, ErrConflict)
	case !r.Remove && len(mine) >= MaxReactionsPerUser:
		return target, mine, fmt.Errorf("%d reactions by one user: %w", len(mine), ErrConflict)
	}
	counts := slices.Clone(target.Reactions)
	i := slices.IndexFunc(counts, func(c Reaction) bool { return c.Emoji == r.Emoji })
	next := slices.Clone(mine)
	if r.Remove {
		next = slices.DeleteFunc(next, func(e string) bool { return e == r.Emoji })
		if i >= 0 {
			counts[i].Count--
			if counts[i].Count <= 0 {
				counts = slices.Delete(counts, i, i+1)
			}
		}
	} else {
		next = append(next, r.Emoji)
		if i >= 0 {
			counts[i].Count++
		} else {
			counts = append(counts, Reaction{Emoji: r.Emoji, Count: 1})
		}
	}
	if len(counts) == 0 {
		counts = nil
	}
	if len(next) == 0 {
		next = nil
	}
	target.Reactions = counts
	return target, next, nil
}
