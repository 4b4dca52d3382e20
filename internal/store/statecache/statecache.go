// Package statecache bounds the in-memory state a store keeps per
// conversation: a map from conversation id to state with a
// least-recently-used list, a size bound and an idle time, and pins that
// keep a state in use from being evicted.
//
// # Safety
//
// A store's per-conversation state orders the conversation's writers (its
// mutex) and carries what is not on disk yet (seqs applied but not yet
// durable, appends in flight, an owner's fencing generation). Two live
// states for one conversation would break that, so a state is evicted only
// when
//
//   - nobody holds it: every user takes it with Get or GetOrCreate, which
//     pin it (under the cache's lock), and gives it back with Release; a
//     state with pins is never evicted, and an evicted state cannot be
//     pinned again because it is no longer in the map;
//   - the store says it is quiescent (Config.Evictable, asked under the
//     cache's lock with no pin held): nothing applied but not durable,
//     nothing in flight, nothing that a reload from disk would get wrong.
//
// The next Get of an evicted conversation finds nothing and the store loads
// a fresh state from disk, as after a restart.
//
// # Cost
//
// Get, GetOrCreate and Release are O(1): a pin is an atomic add, a touch
// moves the state to the front of the list under the cache's lock, which
// the map lookup takes anyway. Eviction looks only at the list's tail and
// at most Config.Scan states per call, so no call walks the whole map; a
// state that cannot go yet (pinned, or not quiescent) is moved to the front
// and looked at again once it reaches the tail.
package statecache

import (
	"sync"
	"sync/atomic"
	"time"
)

// Node is embedded in a store's state type; its zero value is ready.
type Node struct {
	key  uint64
	refs atomic.Int32
	// used is the cache clock at the last pin; guarded by Cache.mu.
	used       int64
	prev, next *Node
	// val is the state that embeds this node; set when inserted.
	val any
}

func (n *Node) node() *Node { return n }

// Config bounds a cache.
type Config struct {
	// Max is the number of states kept; past it the least recently used
	// quiescent ones go. 0 means DefaultMax.
	Max int
	// Idle evicts a quiescent state unused for this long even under Max
	// (checked as later calls come). 0 means DefaultIdle; negative, never.
	Idle time.Duration
	// Scan is the most states one call looks at to evict. 0 means 8.
	Scan int
}

// Defaults: a state costs about 1.3 KiB of heap (measured on Pebble,
// docs/benchmarks.md "Bounded memory"), so the default bound is about
// 85 MiB of conversation state per process.
const (
	DefaultMax  = 65536
	DefaultIdle = 10 * time.Minute
)

// Cache maps conversation ids to states of type T (with P = *T).
type Cache[T any, P interface {
	*T
	node() *Node
}] struct {
	max       int
	idle      int64 // ns; 0: none
	scan      int
	evictable func(P) bool
	start     time.Time

	mu   sync.Mutex
	m    map[uint64]P
	head Node // sentinel: head.next is the most recent, head.prev the least

	evicted atomic.Uint64
}

// New returns an empty cache. evictable reports whether an unpinned state
// may go (see the package comment); it runs under the cache's lock, so it
// must not block: it may TryLock the state's own mutexes.
func New[T any, P interface {
	*T
	node() *Node
}](cfg Config, evictable func(P) bool) *Cache[T, P] {
	if cfg.Max <= 0 {
		cfg.Max = DefaultMax
	}
	if cfg.Idle == 0 {
		cfg.Idle = DefaultIdle
	}
	if cfg.Scan <= 0 {
		cfg.Scan = 8
	}
	c := &Cache[T, P]{max: cfg.Max, scan: cfg.Scan, evictable: evictable, start: time.Now(), m: make(map[uint64]P)}
	if cfg.Idle > 0 {
		c.idle = int64(cfg.Idle)
	}
	c.head.next, c.head.prev = &c.head, &c.head
	return c
}

func (c *Cache[T, P]) now() int64 { return int64(time.Since(c.start)) }

// Get returns key's state pinned, or nil if the cache holds none.
func (c *Cache[T, P]) Get(key uint64) P {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.m[key]
	if p != nil {
		c.pin(p.node(), now)
	}
	c.trim(now)
	return p
}

// GetOrCreate returns key's state pinned, creating it if the cache holds
// none: init runs on the new state under the cache's lock (it must be
// cheap and take no lock).
func (c *Cache[T, P]) GetOrCreate(key uint64, init func(P)) P {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.m[key]
	if p == nil {
		p = P(new(T))
		if init != nil {
			init(p)
		}
		n := p.node()
		n.key, n.val = key, p
		c.m[key] = p
		c.pushFront(n)
	}
	c.pin(p.node(), now)
	c.trim(now)
	return p
}

// Peek returns key's state without pinning it (nil if none). The state may
// be evicted at any time after: callers only read what stays valid in an
// evicted state (an evicted state is quiescent, so it shows the
// conversation as of some moment before the call returned).
func (c *Cache[T, P]) Peek(key uint64) P {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[key]
}

// Release unpins a state returned by Get or GetOrCreate.
func (c *Cache[T, P]) Release(p P) {
	if p.node().refs.Add(-1) < 0 {
		panic("statecache: Release without a pin")
	}
}

// Len is the number of states held.
func (c *Cache[T, P]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// Evicted is the number of states evicted since New.
func (c *Cache[T, P]) Evicted() uint64 { return c.evicted.Load() }

// EvictIdle evicts every state that may go now, whatever its age, and
// returns how many went. It walks the whole list: for tests and for a
// store that is asked to shrink, not for the request path.
func (c *Cache[T, P]) EvictIdle() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for e := c.head.prev; e != &c.head; {
		prev := e.prev
		if c.tryEvict(e) {
			n++
		}
		e = prev
	}
	return n
}

// pin takes a pin on n and moves it to the front; mu held.
func (c *Cache[T, P]) pin(n *Node, now int64) {
	n.refs.Add(1)
	n.used = now
	if c.head.next != n {
		c.unlink(n)
		c.pushFront(n)
	}
}

// trim evicts from the tail while the cache is over Max or its tail has
// been idle for longer than Idle, looking at no more than scan states;
// mu held.
func (c *Cache[T, P]) trim(now int64) {
	for range c.scan {
		n := c.head.prev
		if n == &c.head {
			return
		}
		over := len(c.m) > c.max
		stale := c.idle > 0 && now-n.used > c.idle
		if !over && !stale {
			return
		}
		if !c.tryEvict(n) {
			// In use, or not quiescent yet: look again when it comes
			// back to the tail.
			n.used = now
			c.unlink(n)
			c.pushFront(n)
		}
	}
}

// tryEvict removes n if it has no pin and the store lets it go; mu held.
// A pin is only taken under mu, so a state seen unpinned here stays so.
func (c *Cache[T, P]) tryEvict(n *Node) bool {
	if n.refs.Load() != 0 {
		return false
	}
	p := n.val.(P)
	if c.evictable != nil && !c.evictable(p) {
		return false
	}
	c.unlink(n)
	delete(c.m, n.key)
	n.val = nil
	c.evicted.Add(1)
	return true
}

func (c *Cache[T, P]) unlink(n *Node) {
	n.prev.next = n.next
	n.next.prev = n.prev
	n.prev, n.next = nil, nil
}

func (c *Cache[T, P]) pushFront(n *Node) {
	n.prev = &c.head
	n.next = c.head.next
	c.head.next.prev = n
	c.head.next = n
}
