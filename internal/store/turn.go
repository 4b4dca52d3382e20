package store

import (
	"context"
	"sync"
)

// Turn orders the appends of a pipeline: requests that a caller sends one
// after another without waiting for each answer (a connection's sends, see
// route's batches), run concurrently, yet must take their seqs in the order
// sent. Each append of the pipeline carries a Turn (WithTurn): it waits
// for the previous one's to be taken before its seq is claimed, and takes
// its own as soon as its place in the conversation's queue is fixed, so
// that the next append may join the write in flight's successor instead of
// waiting for its ACK.
//
// An engine that queues a conversation's appends (TurnTaker) takes the
// turn itself; for every other engine Check's Append waits for the turn
// before calling the engine and takes it when the engine returns: the
// pipeline's appends then run one after another, in order.
type Turn struct {
	prev <-chan struct{} // closed when the previous append took its turn; nil: first
	mine chan struct{}
	once sync.Once
}

// NewTurn returns the turn that follows prev (nil: the first of its
// pipeline).
func NewTurn(prev *Turn) *Turn {
	t := &Turn{mine: make(chan struct{})}
	if prev != nil {
		t.prev = prev.mine
	}
	return t
}

// Wait blocks until the previous append of the pipeline took its turn, or
// ctx ends.
func (t *Turn) Wait(ctx context.Context) error {
	if t == nil || t.prev == nil {
		return nil
	}
	select {
	case <-t.prev:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Take ends the turn: the next append of the pipeline may claim its seq.
// It waits for the previous turn first (an append that failed early must
// not let its successor overtake its predecessor), so that turns end in
// order; every turn's holder calls it when done, and a second call is a
// no-op.
func (t *Turn) Take() {
	if t == nil {
		return
	}
	t.once.Do(func() {
		if t.prev != nil {
			<-t.prev
		}
		close(t.mine)
	})
}

type turnKey struct{}

// WithTurn returns ctx carrying t for the append it is passed to.
func WithTurn(ctx context.Context, t *Turn) context.Context {
	return context.WithValue(ctx, turnKey{}, t)
}

// TurnOf returns the turn ctx carries, nil if none (an append that orders
// against nothing).
func TurnOf(ctx context.Context) *Turn {
	t, _ := ctx.Value(turnKey{}).(*Turn)
	return t
}

// TurnTaker is an engine whose Append takes the turn of its context
// itself (see Turn), once the append's place among the conversation's
// appends is fixed.
type TurnTaker interface {
	TakesTurns() bool
}
