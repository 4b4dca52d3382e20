package fanout

import (
	"sync"

	"github.com/parley-im/parley/internal/store"
)

// Scoped is the online-member index of a cluster chat process: Online,
// with each tracked group's entry valid only under the ownership epoch
// of the conversation's partition it was built in.
//
// In cluster mode a conversation's writes — sends, joins, leaves — run on
// its partition's owner, which fans its messages out from its own index.
// An entry built while this process owns the partition sees every later
// membership change of the group, since they run here too (Joined, Left);
// one built under an earlier tenure may have missed changes made by
// another owner meanwhile, and one on a process that does not own the
// partition (an outbox entry another process left) sees none. So Tracked
// answers true only for an entry built under the epoch the process holds
// now; otherwise it drops the entry and the caller builds it again from
// the store's memberships (chat's tier: Members, then Track). Membership
// changes are thereby never lost with a relay event: the relay (best
// effort) only narrows the window of a change made by a stale owner
// during a takeover.
type Scoped struct {
	*Online
	// epoch returns the epoch under which this process holds conv's
	// partition, or false if it holds none.
	epoch func(conv uint64) (uint64, bool)

	mu    sync.Mutex
	built map[uint64]uint64 // tracked conv → epoch its entry was built under
}

// NewScoped scopes o's tracked groups to epoch.
func NewScoped(o *Online, epoch func(conv uint64) (uint64, bool)) *Scoped {
	return &Scoped{Online: o, epoch: epoch, built: make(map[uint64]uint64)}
}

// Tracked reports whether conv's entry exists and was built under the
// epoch this process holds now; a stale entry is dropped.
func (s *Scoped) Tracked(conv uint64) bool {
	if !s.Online.Tracked(conv) {
		return false
	}
	epoch, ok := s.epoch(conv)
	s.mu.Lock()
	built, known := s.built[conv]
	s.mu.Unlock()
	if ok && known && built == epoch {
		return true
	}
	s.Untrack(conv)
	return false
}

// Track builds conv's entry from members, read after this call began: the
// epoch is taken first, so an entry is never credited to an epoch that
// began after its memberships were read.
func (s *Scoped) Track(conv uint64, members []store.Member) {
	epoch, ok := s.epoch(conv)
	s.mu.Lock()
	if ok {
		s.built[conv] = epoch
	} else {
		delete(s.built, conv) // used once, rebuilt next time
	}
	s.mu.Unlock()
	s.Online.Track(conv, members)
}

// Untrack drops conv's entry.
func (s *Scoped) Untrack(conv uint64) {
	s.mu.Lock()
	delete(s.built, conv)
	s.mu.Unlock()
	s.Online.Untrack(conv)
}
