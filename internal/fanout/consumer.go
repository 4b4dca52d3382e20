package fanout

import (
	"context"
	"fmt"
	"sync"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// Fanned is a message whose fan-out has run, as the fan-out saw it: what
// consumers are made of.
type Fanned struct {
	Msg  store.Message
	Conv store.Conversation
	// Recipients are the users the message was pushed to: every member
	// allowed to see it when AllRecipients (direct conversations and
	// small groups), the members online otherwise (medium and large).
	Recipients    []string
	AllRecipients bool
	// Reached are the recipients with a device the push was handed to
	// (filled only for text and file messages when a consumer WantsReached).
	Reached []string
}

// Consumer is what hangs off a stored message: it receives every
// fanned-out message, per conversation in seq order and at least once,
// before the message's outbox entry is cleared. Fanned must only record
// (it runs on the fan-out workers); an error keeps the entry and retries
// the message's fan-out, pushes and every consumer included.
type Consumer interface {
	// WantsReached reports whether Fanned needs Reached (collecting it
	// costs a slice per message).
	WantsReached() bool
	Fanned(ctx context.Context, f Fanned) error
}

// consume hands f to every consumer, stopping at the first error.
func (fo *Fanout) consume(ctx context.Context, f Fanned) error {
	for _, c := range fo.consumers {
		if err := c.Fanned(ctx, f); err != nil {
			return fmt.Errorf("consumer %T: %w", c, err)
		}
	}
	return nil
}

// reached collects the users a push was handed to; a nil *reached
// collects nothing, so a fan-out no consumer needs it for pays nothing.
type reached struct {
	mu    sync.Mutex
	users []string
}

func (r *reached) add(us []string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.users = append(r.users, us...)
	r.mu.Unlock()
}

// collectReached returns a collector when a consumer needs to know who a
// text or file message reached, nil otherwise.
func (fo *Fanout) collectReached(m store.Message) *reached {
	if m.Kind != protocol.KindText && m.Kind != protocol.KindFile {
		return nil
	}
	for _, c := range fo.consumers {
		if c.WantsReached() {
			return &reached{}
		}
	}
	return nil
}
