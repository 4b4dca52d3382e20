// Package presence tracks who is online (M26) from the gateway's connect and
// disconnect events, and serves two consumers:
//
//   - the chat service, which asks for the online members of medium and
//     large groups, so that a send costs work proportional to the members
//     online, not to the group's size (M16);
//   - clients that watch other users' presence: changes are aggregated per
//     flush interval and each user's changes go out at most once per
//     MinGap, so a user flapping, or a huge group, cannot turn presence into
//     a broadcast storm. The final state always goes out.
//
// A Tracker is safe for concurrent use; one goroutine (Run) flushes
// aggregated changes.
package presence

import (
	"context"
	"sync"
	"time"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// Subscriber receives presence batches (a gateway session).
type Subscriber interface {
	Presence(states []protocol.PresenceState)
}

// RowLister lists a user's conversations (the store).
type RowLister interface {
	UserConversations(ctx context.Context, user string) ([]store.ConvRow, error)
}

// Config tunes a Tracker.
type Config struct {
	Flush  time.Duration // aggregation interval (default 1s)
	MinGap time.Duration // at most one broadcast per user per MinGap (default 5s)
}

// Tracker is the node's presence state.
type Tracker struct {
	cfg  Config
	rows RowLister
	now  func() time.Time

	mu struct {
		sync.Mutex
		online   map[string]int   // user → connected devices
		lastSeen map[string]int64 // user → unix ms of going offline
		// groups are the tracked groups (medium and large tiers) with
		// their online members and each one's join_seq, so a send can
		// filter recipients by seq without reading memberships.
		groups map[uint64]map[string]uint64
		subs   map[string]map[Subscriber]struct{} // watched user → watchers
		// watching is the reverse of subs, to replace a watcher's set.
		watching map[Subscriber][]string
		pending  map[string]bool  // users whose change awaits broadcast
		lastSent map[string]int64 // user → unix ms of the last broadcast
	}
}

// New returns a tracker; call Run to flush presence changes.
func New(cfg Config, rows RowLister, now func() time.Time) *Tracker {
	if cfg.Flush <= 0 {
		cfg.Flush = time.Second
	}
	if cfg.MinGap <= 0 {
		cfg.MinGap = 5 * time.Second
	}
	if now == nil {
		now = time.Now
	}
	t := &Tracker{cfg: cfg, rows: rows, now: now}
	t.mu.online = make(map[string]int)
	t.mu.lastSeen = make(map[string]int64)
	t.mu.groups = make(map[uint64]map[string]uint64)
	t.mu.subs = make(map[string]map[Subscriber]struct{})
	t.mu.watching = make(map[Subscriber][]string)
	t.mu.pending = make(map[string]bool)
	t.mu.lastSent = make(map[string]int64)
	return t
}

// Connected counts a new device of user; the first one makes the user
// online and adds it to the tracked groups it belongs to.
func (t *Tracker) Connected(ctx context.Context, user string) {
	t.mu.Lock()
	t.mu.online[user]++
	first := t.mu.online[user] == 1
	tracked := len(t.mu.groups) > 0
	if first {
		t.mu.pending[user] = true
	}
	t.mu.Unlock()
	if !first || !tracked {
		return
	}
	rows, err := t.rows.UserConversations(ctx, user)
	if err != nil {
		return // the group index catches up when the group is next tracked
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mu.online[user] == 0 {
		return
	}
	for _, r := range rows {
		if g := t.mu.groups[r.ConvID]; g != nil && r.LeaveSeq == 0 {
			g[user] = r.JoinSeq
		}
	}
}

// Disconnected counts a device gone; the last one makes the user offline.
func (t *Tracker) Disconnected(user string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.mu.online[user] - 1
	if n > 0 {
		t.mu.online[user] = n
		return
	}
	delete(t.mu.online, user)
	t.mu.lastSeen[user] = t.now().UnixMilli()
	t.mu.pending[user] = true
	for _, g := range t.mu.groups {
		delete(g, user)
	}
}

// Online reports whether user has a connected device on this node.
func (t *Tracker) Online(user string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.mu.online[user] > 0
}

// Tracked reports whether conv's online members are indexed.
func (t *Tracker) Tracked(conv uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.mu.groups[conv] != nil
}

// Track starts indexing conv's online members, given all its current
// members (a one-time cost proportional to the group, paid when it enters
// the medium tier or after a restart).
func (t *Tracker) Track(conv uint64, members []store.Member) {
	t.mu.Lock()
	defer t.mu.Unlock()
	g := make(map[string]uint64)
	for _, m := range members {
		if t.mu.online[m.UserID] > 0 {
			g[m.UserID] = m.JoinSeq
		}
	}
	t.mu.groups[conv] = g
}

// Untrack stops indexing conv (it went back to the small tier).
func (t *Tracker) Untrack(conv uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.mu.groups, conv)
}

// Joined and Left keep a tracked group's index in step with membership.
func (t *Tracker) Joined(conv uint64, members []store.Member) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if g := t.mu.groups[conv]; g != nil {
		for _, m := range members {
			if t.mu.online[m.UserID] > 0 {
				g[m.UserID] = m.JoinSeq
			}
		}
	}
}

func (t *Tracker) Left(conv uint64, users []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if g := t.mu.groups[conv]; g != nil {
		for _, u := range users {
			delete(g, u)
		}
	}
}

// GroupOnline returns the online members of a tracked group with their
// join_seq, and true; false if conv is not tracked.
func (t *Tracker) GroupOnline(conv uint64) ([]store.Member, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	g := t.mu.groups[conv]
	if g == nil {
		return nil, false
	}
	out := make([]store.Member, 0, len(g))
	for u, join := range g {
		out = append(out, store.Member{ConvID: conv, UserID: u, JoinSeq: join})
	}
	return out, true
}

// Watch replaces the set of users s watches and returns their current
// states. Permission is the caller's business.
func (t *Tracker) Watch(s Subscriber, users []string) []protocol.PresenceState {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.unwatchLocked(s)
	if len(users) > 0 {
		t.mu.watching[s] = users
	}
	out := make([]protocol.PresenceState, 0, len(users))
	for _, u := range users {
		w := t.mu.subs[u]
		if w == nil {
			w = make(map[Subscriber]struct{})
			t.mu.subs[u] = w
		}
		w[s] = struct{}{}
		out = append(out, t.stateLocked(u))
	}
	return out
}

// Unwatch drops all of s's subscriptions (its connection closed).
func (t *Tracker) Unwatch(s Subscriber) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.unwatchLocked(s)
}

func (t *Tracker) unwatchLocked(s Subscriber) {
	for _, u := range t.mu.watching[s] {
		if w := t.mu.subs[u]; w != nil {
			delete(w, s)
			if len(w) == 0 {
				delete(t.mu.subs, u)
			}
		}
	}
	delete(t.mu.watching, s)
}

func (t *Tracker) stateLocked(u string) protocol.PresenceState {
	if t.mu.online[u] > 0 {
		return protocol.PresenceState{UserID: u, Online: true}
	}
	return protocol.PresenceState{UserID: u, LastSeen: t.mu.lastSeen[u]}
}

// Run flushes aggregated changes every Flush until ctx ends.
func (t *Tracker) Run(ctx context.Context) {
	tick := time.NewTicker(t.cfg.Flush)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			t.Flush()
		}
	}
}

// Flush sends one batch per watcher with the latest state of every watched
// user that changed, skipping users broadcast less than MinGap ago (they
// stay pending: their final state goes out once the gap has passed).
func (t *Tracker) Flush() {
	now := t.now().UnixMilli()
	gap := t.cfg.MinGap.Milliseconds()
	batches := make(map[Subscriber][]protocol.PresenceState)
	t.mu.Lock()
	for u := range t.mu.pending {
		if last, ok := t.mu.lastSent[u]; ok && now-last < gap {
			continue
		}
		delete(t.mu.pending, u)
		w := t.mu.subs[u]
		if len(w) == 0 {
			continue
		}
		t.mu.lastSent[u] = now
		st := t.stateLocked(u)
		for s := range w {
			batches[s] = append(batches[s], st)
		}
	}
	for u, last := range t.mu.lastSent { // keep the map to recent senders
		if now-last >= gap && !t.mu.pending[u] {
			delete(t.mu.lastSent, u)
		}
	}
	t.mu.Unlock()
	for s, states := range batches {
		s.Presence(states)
	}
}
