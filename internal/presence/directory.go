package presence

import (
	"context"
	"sync"
	"time"
)

// State is a user's presence as its state of record has it.
type State struct {
	Online bool
	// LastSeen is the unix ms the user's last device went offline, 0 if
	// unknown or longer ago than the last-seen TTL (meaningful only when
	// not Online).
	LastSeen int64
}

// Scope says which followed users a notification is about.
type Scope uint8

const (
	// Users: the users given may have changed.
	Users Scope = iota
	// OnlineOnes: recheck the followed users believed online (a gateway
	// may have died without announcing its disconnects).
	OnlineOnes
	// Everyone: changes may have been missed (a reconnect, dropped
	// messages); recheck every followed user.
	Everyone
)

// Listener receives notifications of followed users' possible changes. It
// must not block: it records what to recheck and returns.
type Listener func(scope Scope, users []string)

// Directory is the presence state of record and its change feed: the
// engine seam between presence's readers (a gateway's watchers, a chat
// process's online-member index) and where presence lives. The embedded
// node's is in memory (Local); cluster mode's keeps online devices in the
// session registry and last seen in Redis with a TTL, and tells followers
// of changes on per-user-shard NATS subjects (internal/cluster/relay). A
// process holds state only for the users it follows, never for everyone
// online. Every implementation passes presencetest.
type Directory interface {
	// Changed records that a device of user connected (online) or
	// disconnected on this node. The caller has already registered
	// (unregistered) the device in the session registry; a disconnect
	// records the user's last seen.
	Changed(ctx context.Context, user string, online bool)
	// States reads the current state of each user.
	States(ctx context.Context, users []string) (map[string]State, error)
	// Follow adds one interest in each user's changes; Unfollow removes
	// one. Listeners hear about users with at least one interest.
	Follow(users []string)
	Unfollow(users []string)
	// Listen adds l to the listeners.
	Listen(l Listener)
}

// Local is the embedded node's Directory: every device connects to this
// process, so online counts live in memory and changes are told to the
// listeners at once. Last seen is kept in two generations of the TTL each,
// so a user's last seen is kept for at least the TTL (and answered only
// within it) and forgetting costs one map swap per TTL, never a scan.
type Local struct {
	ttl time.Duration
	now func() time.Time

	mu struct {
		sync.Mutex
		online         map[string]int // user → connected devices
		seen, seenPrev map[string]int64
		seenSince      int64 // unix ms when seen began
		follow         map[string]int
		listeners      []Listener
	}
}

var _ Directory = (*Local)(nil)

// NewLocal returns an in-memory directory remembering last seen for ttl
// (default 24 h).
func NewLocal(ttl time.Duration, now func() time.Time) *Local {
	if ttl <= 0 {
		ttl = DefaultConfig().LastSeenTTL
	}
	if now == nil {
		now = time.Now
	}
	l := &Local{ttl: ttl, now: now}
	l.mu.online = make(map[string]int)
	l.mu.seen = make(map[string]int64)
	l.mu.follow = make(map[string]int)
	return l
}

// Changed counts a device of user in or out; the last one out records
// the user's last seen.
func (l *Local) Changed(_ context.Context, user string, online bool) {
	l.mu.Lock()
	n := l.mu.online[user]
	if online {
		n++
	} else {
		n--
	}
	switch {
	case n < 0: // a disconnect without a connect
		l.mu.Unlock()
		return
	case n == 0:
		delete(l.mu.online, user)
		now := l.now().UnixMilli()
		l.rotateLocked(now)
		l.mu.seen[user] = now
		delete(l.mu.seenPrev, user)
	default:
		l.mu.online[user] = n
	}
	tell := l.mu.follow[user] > 0
	ls := l.mu.listeners
	l.mu.Unlock()
	if tell {
		for _, f := range ls {
			f(Users, []string{user})
		}
	}
}

// rotateLocked starts a new generation of last-seen times once the
// current one is TTL old; the one before it is dropped.
func (l *Local) rotateLocked(now int64) {
	ttl := l.ttl.Milliseconds()
	if l.mu.seenSince == 0 {
		l.mu.seenSince = now
	}
	if age := now - l.mu.seenSince; age >= ttl {
		l.mu.seenPrev = l.mu.seen
		if age >= 2*ttl {
			l.mu.seenPrev = nil
		}
		l.mu.seen = make(map[string]int64, len(l.mu.seen)/2)
		l.mu.seenSince = now
	}
}

// States answers from memory; it never fails.
func (l *Local) States(_ context.Context, users []string) (map[string]State, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]State, len(users))
	now := l.now().UnixMilli()
	for _, u := range users {
		if l.mu.online[u] > 0 {
			out[u] = State{Online: true}
			continue
		}
		at, ok := l.mu.seen[u]
		if !ok {
			at = l.mu.seenPrev[u]
		}
		if at != 0 && now-at >= l.ttl.Milliseconds() {
			at = 0
		}
		out[u] = State{LastSeen: at}
	}
	return out, nil
}

func (l *Local) Follow(users []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, u := range users {
		l.mu.follow[u]++
	}
}

func (l *Local) Unfollow(users []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, u := range users {
		if n := l.mu.follow[u] - 1; n > 0 {
			l.mu.follow[u] = n
		} else {
			delete(l.mu.follow, u)
		}
	}
}

func (l *Local) Listen(f Listener) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mu.listeners = append(l.mu.listeners, f)
}

// Remembered returns how many users the directory holds state for: online
// ones and those whose last seen it keeps (tests, metrics).
func (l *Local) Remembered() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.mu.online) + len(l.mu.seen) + len(l.mu.seenPrev)
}

// Followed returns how many users have an interest (tests).
func (l *Local) Followed() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.mu.follow)
}
