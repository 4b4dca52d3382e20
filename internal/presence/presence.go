// Package presence tracks who is online from the gateway's connect and
// disconnect events, for clients that watch other users' presence: changes
// are aggregated per flush interval and each user's changes go out at most
// once per MinGap, so a user flapping, or a huge group, cannot turn
// presence into a broadcast storm. The final state always goes out.
//
// The online members of groups, which the fan-out needs, are indexed by
// fanout.Online, fed by the same events.
//
// A Tracker is safe for concurrent use; one goroutine (Run) flushes
// aggregated changes.
package presence

import (
	"context"
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
	LastSeenTTL time.Duration `yaml:"last_seen_ttl" help:"how long a process remembers when a user went offline (last_seen; 0 after that)"`
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

// Tracker is the node's presence state.
type Tracker struct {
	cfg Config
	now func() time.Time

	mu struct {
		sync.Mutex
		online map[string]int // user → connected devices
		// seen and seenPrev map a user to the unix ms it went offline: two
		// generations of LastSeenTTL each, so a user's last seen is kept
		// for at least the TTL (and answered only within it) and forgetting
		// costs one map swap per TTL, never a scan.
		seen, seenPrev map[string]int64
		seenSince      int64                              // unix ms when seen began
		subs           map[string]map[Subscriber]struct{} // watched user → watchers
		// watching is the reverse of subs, to replace a watcher's set.
		watching map[Subscriber][]string
		pending  map[string]bool  // users whose change awaits broadcast
		lastSent map[string]int64 // user → unix ms of the last broadcast
	}
}

// New returns a tracker; call Run to flush presence changes.
func New(cfg Config, now func() time.Time) *Tracker {
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
	t := &Tracker{cfg: cfg, now: now}
	t.mu.online = make(map[string]int)
	t.mu.seen = make(map[string]int64)
	t.mu.subs = make(map[string]map[Subscriber]struct{})
	t.mu.watching = make(map[Subscriber][]string)
	t.mu.pending = make(map[string]bool)
	t.mu.lastSent = make(map[string]int64)
	return t
}

// Connected counts a new device of user; the first one makes the user
// online.
func (t *Tracker) Connected(_ context.Context, user string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.mu.online[user]++
	if t.mu.online[user] == 1 {
		t.mu.pending[user] = true
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
	if n < 0 {
		return // a disconnect without a connect
	}
	delete(t.mu.online, user)
	now := t.now().UnixMilli()
	t.rotateLocked(now)
	t.mu.seen[user] = now
	delete(t.mu.seenPrev, user)
	t.mu.pending[user] = true
}

// rotateLocked starts a new generation of last-seen times once the
// current one is LastSeenTTL old; the one before it is dropped.
func (t *Tracker) rotateLocked(now int64) {
	ttl := t.cfg.LastSeenTTL.Milliseconds()
	if t.mu.seenSince == 0 {
		t.mu.seenSince = now
	}
	if age := now - t.mu.seenSince; age >= ttl {
		t.mu.seenPrev = t.mu.seen
		if age >= 2*ttl {
			t.mu.seenPrev = nil
		}
		t.mu.seen = make(map[string]int64, len(t.mu.seen)/2)
		t.mu.seenSince = now
	}
}

// lastSeenLocked returns when user went offline, 0 if unknown or longer
// ago than LastSeenTTL.
func (t *Tracker) lastSeenLocked(user string) int64 {
	at, ok := t.mu.seen[user]
	if !ok {
		at = t.mu.seenPrev[user]
	}
	if at != 0 && t.now().UnixMilli()-at >= t.cfg.LastSeenTTL.Milliseconds() {
		return 0
	}
	return at
}

// Remembered returns how many users the tracker holds state for: online
// ones and those whose last seen it keeps (tests, metrics).
func (t *Tracker) Remembered() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.mu.online) + len(t.mu.seen) + len(t.mu.seenPrev)
}

// Online reports whether user has a connected device on this node.
func (t *Tracker) Online(user string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.mu.online[user] > 0
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
	return protocol.PresenceState{UserID: u, LastSeen: t.lastSeenLocked(u)}
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
