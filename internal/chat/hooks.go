package chat

import (
	"context"
	"fmt"
	"sync"

	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// reached collects the users a push was handed to (for recipient.offline);
// a nil *reached collects nothing, so fan-out without webhooks pays
// nothing.
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

// collectReached returns a collector when the webhooks need to know who a
// text message reached, nil otherwise.
func (s *Service) collectReached(m store.Message) *reached {
	if s.hook == nil || m.Kind != protocol.KindText || !s.hook.WantsReached() {
		return nil
	}
	return &reached{}
}

// hookFanned hands a fanned-out message to the webhooks, which only queue
// it durably; an error retries the fan-out.
func (s *Service) hookFanned(ctx context.Context, m store.Message, cv store.Conversation, tier uint8, recipients []string, rc *reached) error {
	f := fanout.Fanned{Msg: m, Conv: cv, Recipients: recipients, AllRecipients: tier == TierSmall}
	if rc != nil {
		f.Reached = rc.users
	}
	if err := s.hook.Fanned(ctx, f); err != nil {
		return fmt.Errorf("webhooks: %w", err)
	}
	return nil
}
