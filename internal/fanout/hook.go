package fanout

import (
	"context"

	"github.com/parley-im/parley/internal/store"
)

// Fanned is a message whose fan-out has run, as the fan-out saw it: what
// webhooks are made of (internal/hooks).
type Fanned struct {
	Msg  store.Message
	Conv store.Conversation
	// Recipients are the users the message was pushed to: every member
	// allowed to see it when AllRecipients (direct conversations and
	// small groups), the members online otherwise (medium and large).
	Recipients    []string
	AllRecipients bool
	// Reached are the recipients with a device the push was handed to
	// (filled only when the hook WantsReached).
	Reached []string
}

// Hook receives every fanned-out message before its outbox entry is
// cleared. Fanned must only record (it runs on the fan-out workers); an
// error keeps the entry and retries the message's fan-out.
type Hook interface {
	WantsReached() bool
	Fanned(ctx context.Context, f Fanned) error
}
