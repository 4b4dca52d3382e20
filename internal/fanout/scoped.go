package fanout

import (
	"sync/atomic"
	"time"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/statecache"
)

// Index is an online-member index: Online (embedded node) or Roster
// (cluster chat process).
type Index interface {
	Tracked(conv uint64) bool
	Track(conv uint64, members []store.Member)
	Untrack(conv uint64)
	Joined(conv uint64, members []store.Member)
	Left(conv uint64, users []string)
	// GroupOnline returns the online members with their join_seq.
	GroupOnline(conv uint64) ([]store.Member, bool)
}

// Scoped is the online-member index of a cluster chat process: an Index,
// with each tracked group's entry valid only under the ownership epoch
// of the conversation's partition it was built in, and at most
// ScopedGroups entries, none idle for longer than ScopedIdle.
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
// the store's memberships (Fanout.Tier: Members, then Track). Membership
// changes are thereby never lost with a relay event: the relay (best
// effort) only narrows the window of a change made by a stale owner
// during a takeover.
//
// An entry also goes when it is the least recently used past
// ScopedGroups, or unused for ScopedIdle (a group whose partition moved
// away, or that went quiet): the next message rebuilds it, one membership
// read.
type Scoped struct {
	Index
	// epoch returns the epoch under which this process holds conv's
	// partition, or false if it holds none.
	epoch func(conv uint64) (uint64, bool)
	built *statecache.Cache[builtEntry, *builtEntry]
}

// builtEntry records the epoch a tracked group's entry was built under.
type builtEntry struct {
	statecache.Node
	conv  uint64
	epoch atomic.Uint64
	ok    atomic.Bool // built while owning the partition
}

// Bounds of a Scoped index.
const (
	ScopedGroups = 65536
	ScopedIdle   = 10 * time.Minute
)

// NewScoped scopes o's tracked groups to epoch.
func NewScoped(o Index, epoch func(conv uint64) (uint64, bool)) *Scoped {
	return newScoped(o, epoch, statecache.Config{Max: ScopedGroups, Idle: ScopedIdle})
}

func newScoped(o Index, epoch func(conv uint64) (uint64, bool), cfg statecache.Config) *Scoped {
	s := &Scoped{Index: o, epoch: epoch}
	s.built = statecache.New(cfg, func(e *builtEntry) bool {
		// Evicted: the group's entry goes with its record (Untrack takes
		// only the index's own locks, never the cache's).
		o.Untrack(e.conv)
		return true
	})
	return s
}

// Tracked reports whether conv's entry exists and was built under the
// epoch this process holds now; a stale entry is dropped.
func (s *Scoped) Tracked(conv uint64) bool {
	e := s.built.Get(conv) // touches it: in use
	if e == nil {
		if s.Index.Tracked(conv) {
			s.Index.Untrack(conv) // evicted record, or never recorded
		}
		return false
	}
	built, ok := e.epoch.Load(), e.ok.Load()
	s.built.Release(e)
	if !s.Index.Tracked(conv) {
		return false
	}
	if epoch, now := s.epoch(conv); ok && now && built == epoch {
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
	e := s.built.GetOrCreate(conv, func(e *builtEntry) { e.conv = conv })
	e.ok.Store(false) // never trusted half-written
	e.epoch.Store(epoch)
	e.ok.Store(ok)
	s.built.Release(e)
	s.Index.Track(conv, members)
}

// Untrack drops conv's entry.
func (s *Scoped) Untrack(conv uint64) {
	if e := s.built.Get(conv); e != nil {
		e.ok.Store(false) // never trusted again; evicted in time
		s.built.Release(e)
	}
	s.Index.Untrack(conv)
}

// NodeIndex is an Index that also tells a tracked group's online members
// by gateway node (Roster): a group message then leaves as one delivery
// per node naming the node's list, with no registry read.
type NodeIndex interface {
	GroupNodes(conv uint64) (map[string]*NodeList, bool)
}

// GroupNodes is the scoped index's GroupNodes, false if it has none; call
// it after Tracked.
func (s *Scoped) GroupNodes(conv uint64) (map[string]*NodeList, bool) {
	if ni, ok := s.Index.(NodeIndex); ok {
		return ni.GroupNodes(conv)
	}
	return nil, false
}

// Groups returns how many groups have an entry record (tests, metrics).
func (s *Scoped) Groups() int { return s.built.Len() }
