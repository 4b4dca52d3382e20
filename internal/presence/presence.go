// Package presence tracks who is online from the gateway's connect and
// disconnect events, for clients that watch other users' presence: changes
// are aggregated per flush interval and each user's changes go out at most
// once per MinGap, so a user flapping, or a huge group, cannot turn
// presence into a broadcast storm. The final state always goes out.
//
// Where presence lives is a Directory: in memory on an embedded node
// (Local), the session registry and Redis in cluster mode. The Tracker
// holds state only for the users its connections watch.
//
// The online members of groups, which the fan-out needs, are indexed by
// fanout.Online (embedded) or fanout.Roster (cluster).
//
// A Tracker is safe for concurrent use; one goroutine (Run) flushes
// aggregated changes.
package presence

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/parley-im/parley/internal/settings"
	"github.com/parley-im/parley/protocol"
)

// Subscriber receives presence batches (a gateway session).
type Subscriber interface {
	Presence(states []protocol.PresenceState)
}

// Config tunes a Tracker. Each field is a server setting under presence.
// (package settings). Zero fields take the defaults of DefaultConfig.
type Config struct {
	Flush       time.Duration `yaml:"flush" help:"presence changes are aggregated over this interval"`
	MinGap      time.Duration `yaml:"min_gap" help:"a user's presence is broadcast at most once per this interval"`
	LastSeenTTL time.Duration `yaml:"last_seen_ttl" help:"how long a user's last seen is kept (in memory on an embedded node, a Redis key with this TTL in cluster mode); last_seen is 0 after that"`
}

// DefaultConfig returns the defaults: flush every second, at most one
// broadcast per user per 5 s, last seen remembered for 24 h.
func DefaultConfig() Config {
	return Config{Flush: time.Second, MinGap: 5 * time.Second, LastSeenTTL: 24 * time.Hour}
}

// Validate reports every setting a Tracker cannot run with, by key.
func (c Config) Validate() error {
	var p settings.Problems
	p.Check(c.Flush > 0, "flush", "must be positive, got %v", c.Flush)
	p.Check(c.MinGap >= 0, "min_gap", "must not be negative, got %v", c.MinGap)
	p.Check(c.LastSeenTTL >= 0, "last_seen_ttl", "must not be negative, got %v", c.LastSeenTTL)
	return p.Err("presence")
}

// Tracker is the node's presence for its watchers: who watches whom, the
// last state read of each watched user, and changes awaiting a flush.
type Tracker struct {
	cfg Config
	dir Directory
	now func() time.Time

	mu struct {
		sync.Mutex
		subs map[string]map[Subscriber]struct{} // watched user → watchers
		// watching is the reverse of subs, to replace a watcher's set.
		watching map[Subscriber][]string
		cache    map[string]State // watched user → last state read
		pending  map[string]bool  // users whose change awaits broadcast
		recheck  map[string]bool  // users to read again, sent if changed
		lastSent map[string]int64 // user → unix ms of the last broadcast
	}
}

// New returns a tracker over an in-memory directory (the embedded node);
// call Run to flush presence changes.
func New(cfg Config, now func() time.Time) *Tracker {
	return NewWith(cfg, NewLocal(cfg.LastSeenTTL, now), now)
}

// NewWith returns a tracker over dir.
func NewWith(cfg Config, dir Directory, now func() time.Time) *Tracker {
	def := DefaultConfig()
	if cfg.Flush <= 0 {
		cfg.Flush = def.Flush
	}
	if cfg.MinGap <= 0 {
		cfg.MinGap = def.MinGap
	}
	if cfg.LastSeenTTL <= 0 {
		cfg.LastSeenTTL = def.LastSeenTTL
	}
	if now == nil {
		now = time.Now
	}
	t := &Tracker{cfg: cfg, dir: dir, now: now}
	t.mu.subs = make(map[string]map[Subscriber]struct{})
	t.mu.watching = make(map[Subscriber][]string)
	t.mu.cache = make(map[string]State)
	t.mu.pending = make(map[string]bool)
	t.mu.recheck = make(map[string]bool)
	t.mu.lastSent = make(map[string]int64)
	dir.Listen(t.notify)
	return t
}

// Directory returns the directory the tracker reads.
func (t *Tracker) Directory() Directory { return t.dir }

// Connected records a new device of user on this node.
func (t *Tracker) Connected(ctx context.Context, user string) {
	t.dir.Changed(ctx, user, true)
}

// Disconnected records a device of user gone from this node.
func (t *Tracker) Disconnected(user string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	t.dir.Changed(ctx, user, false)
}

// notify is the directory's listener.
func (t *Tracker) notify(scope Scope, users []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch scope {
	case Users:
		for _, u := range users {
			if len(t.mu.subs[u]) > 0 {
				t.mu.pending[u] = true
			}
		}
	case OnlineOnes:
		for u, st := range t.mu.cache {
			if st.Online {
				t.mu.recheck[u] = true
			}
		}
	case Everyone:
		for u := range t.mu.subs {
			t.mu.recheck[u] = true
		}
	}
}

// Remembered returns how many users the tracker holds state for: the
// watched ones and, over an in-memory directory, the online ones and
// those whose last seen it keeps (tests, metrics).
func (t *Tracker) Remembered() int {
	n := 0
	if l, ok := t.dir.(*Local); ok {
		n = l.Remembered()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return n + len(t.mu.cache)
}

// Watched returns how many distinct users this tracker's watchers watch
// (tests, metrics).
func (t *Tracker) Watched() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.mu.subs)
}

// Watch replaces the set of users s watches and returns their current
// states. Permission is the caller's business. It fails only when the
// directory cannot be read; s then watches the users all the same.
func (t *Tracker) Watch(ctx context.Context, s Subscriber, users []string) ([]protocol.PresenceState, error) {
	t.mu.Lock()
	dropped := t.unwatchLocked(s)
	if len(users) > 0 {
		t.mu.watching[s] = users
	}
	var added, need []string
	for _, u := range users {
		if _, ok := t.mu.subs[u][s]; ok {
			continue // listed twice
		}
		w := t.mu.subs[u]
		if w == nil {
			w = make(map[Subscriber]struct{})
			t.mu.subs[u] = w
			added = append(added, u)
		}
		w[s] = struct{}{}
		if _, ok := t.mu.cache[u]; !ok {
			need = append(need, u)
		}
	}
	t.mu.Unlock()
	// Followed before the read: a change after the read is heard.
	t.dir.Follow(added)
	t.dir.Unfollow(dropped)
	var read map[string]State
	if len(need) > 0 {
		var err error
		if read, err = t.dir.States(ctx, need); err != nil {
			t.mu.Lock()
			for _, u := range need {
				if len(t.mu.subs[u]) > 0 {
					t.mu.recheck[u] = true
				}
			}
			t.mu.Unlock()
			return nil, err
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]protocol.PresenceState, 0, len(users))
	for _, u := range users {
		st, ok := t.mu.cache[u]
		if !ok {
			st = read[u]
			if len(t.mu.subs[u]) > 0 {
				t.mu.cache[u] = st
			}
		}
		out = append(out, wire(u, st))
	}
	return out, nil
}

func wire(u string, st State) protocol.PresenceState {
	if st.Online {
		return protocol.PresenceState{UserID: u, Online: true}
	}
	return protocol.PresenceState{UserID: u, LastSeen: st.LastSeen}
}

// Unwatch drops all of s's subscriptions (its connection closed).
func (t *Tracker) Unwatch(s Subscriber) {
	t.mu.Lock()
	dropped := t.unwatchLocked(s)
	t.mu.Unlock()
	t.dir.Unfollow(dropped)
}

// unwatchLocked drops s's subscriptions and returns the users nobody
// watches any more (to unfollow).
func (t *Tracker) unwatchLocked(s Subscriber) []string {
	var dropped []string
	for _, u := range t.mu.watching[s] {
		if w := t.mu.subs[u]; w != nil {
			delete(w, s)
			if len(w) == 0 {
				delete(t.mu.subs, u)
				delete(t.mu.cache, u)
				delete(t.mu.pending, u)
				delete(t.mu.recheck, u)
				dropped = append(dropped, u)
			}
		}
	}
	delete(t.mu.watching, s)
	return dropped
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
// Users to recheck are read too and sent only if their state differs from
// the last one read.
func (t *Tracker) Flush() {
	now := t.now().UnixMilli()
	gap := t.cfg.MinGap.Milliseconds()
	t.mu.Lock()
	send := make(map[string]bool)
	for u := range t.mu.pending {
		if last, ok := t.mu.lastSent[u]; ok && now-last < gap {
			continue
		}
		delete(t.mu.pending, u)
		if len(t.mu.subs[u]) > 0 {
			send[u] = true
		}
	}
	check := slices.Collect(maps.Keys(t.mu.recheck))
	clear(t.mu.recheck)
	for u, last := range t.mu.lastSent { // keep the map to recent senders
		if now-last >= gap && !t.mu.pending[u] {
			delete(t.mu.lastSent, u)
		}
	}
	t.mu.Unlock()
	read := slices.AppendSeq(check, maps.Keys(send))
	if len(read) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	states, err := t.dir.States(ctx, read)
	cancel()
	batches := make(map[Subscriber][]protocol.PresenceState)
	t.mu.Lock()
	if err != nil {
		// Read again at the next flush.
		for u := range send {
			t.mu.pending[u] = true
		}
		for _, u := range check {
			t.mu.recheck[u] = true
		}
		t.mu.Unlock()
		return
	}
	for _, u := range check {
		if send[u] {
			continue
		}
		if old, ok := t.mu.cache[u]; ok && old != states[u] {
			if last, ok := t.mu.lastSent[u]; ok && now-last < gap {
				t.mu.pending[u] = true
				continue
			}
			send[u] = true
		}
	}
	for u := range send {
		w := t.mu.subs[u]
		if len(w) == 0 {
			continue
		}
		st := states[u]
		t.mu.cache[u] = st
		t.mu.lastSent[u] = now
		ps := wire(u, st)
		for s := range w {
			batches[s] = append(batches[s], ps)
		}
	}
	t.mu.Unlock()
	for s, states := range batches {
		s.Presence(states)
	}
}
