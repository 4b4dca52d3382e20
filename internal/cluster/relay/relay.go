package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	natsio "github.com/nats-io/nats.go"
	goredis "github.com/redis/go-redis/v9"

	pnats "github.com/parley-im/parley/internal/bus/nats"
	"github.com/parley-im/parley/internal/presence"
	"github.com/parley-im/parley/internal/registry"
	"github.com/parley-im/parley/internal/store"
)

// subjectShard carries the presence hints of the users of one shard.
func subjectShard(ns string, shard int) string { return ns + ".presence.s." + strconv.Itoa(shard) }

// subjectMembers carries membership changes of tracked groups between
// chat processes (best effort: a process trusts a group's entry only under
// the ownership epoch it built it in, fanout.Scoped).
func subjectMembers(ns string) string { return ns + ".members" }

// Members is what the membership relay feeds: a chat process's
// online-member index.
type Members interface {
	Joined(conv uint64, members []store.Member)
	Left(conv uint64, users []string)
}

type membersEvent struct {
	Node   string         `json:"n"`
	Conv   uint64         `json:"c"`
	Joined []store.Member `json:"j,omitempty"`
	Left   []string       `json:"l,omitempty"`
}

// Config tunes a Relay.
type Config struct {
	Namespace string
	Node      string
	// Shards is how many presence subjects users are spread over
	// (cluster.presence_shards; default 256). Every process of a
	// deployment must use the same number.
	Shards int
	// LastSeenTTL is how long a user's last seen is kept in Redis
	// (presence.last_seen_ttl; default 24 h).
	LastSeenTTL time.Duration
	// Resync is how often the leases of the gateways followed users are
	// on are checked (cluster.presence_resync; default 15 s).
	Resync time.Duration
	Logger *slog.Logger
}

// DefaultShards is the default number of presence shards.
const DefaultShards = 256

type nodeUsers struct {
	epoch string // "" until the first check
	users map[string]struct{}
}

// Relay is cluster mode's presence.Directory, plus the relay of membership
// changes between chat processes (Joined, Left).
type Relay struct {
	nc      *natsio.Conn
	rdb     goredis.UniversalClient
	reg     registry.Registry
	cfg     Config
	log     *slog.Logger
	members Members // nil: this process keeps no online index
	now     func() time.Time
	gate    pnats.Gate
	// ticks, if not nil, replaces Run's one-second check clock (tests).
	ticks <-chan time.Time

	mu struct {
		sync.Mutex
		follow map[string]int // user → interests
		// on is, for each gateway node, the followed users the last read
		// found online there, and the node's lease epoch when first
		// checked: a node whose epoch changes (it died, or restarted and
		// dropped its entries) has those users read again.
		on    map[string]*nodeUsers
		where map[string][]string // followed user → nodes of its last read
		// reads numbers States' reads in the order they start; placed is,
		// per followed user, the number of the read where is from: an
		// older read that returns later does not put back where the user
		// was.
		reads     uint64
		placed    map[string]uint64
		shardRefs []int // shard → followed users in it
		subs      []*natsio.Subscription
		// drops counts the hints the client dropped on any subscription
		// so far; seen is, per shard, how many of its subscription's
		// drops are counted. drops only grows, also when a subscription
		// goes (its unseen drops are counted first), so a removed
		// subscription's count cannot hide new drops on another one.
		seen      []int
		drops     uint64
		listeners []presence.Listener
		closed    bool
	}
}

var _ presence.Directory = (*Relay)(nil)

// New returns a relay; members, if not nil, receives the membership
// changes other processes announce. Call Run.
func New(nc *natsio.Conn, rdb goredis.UniversalClient, reg registry.Registry, members Members, cfg Config) *Relay {
	if cfg.Shards <= 0 {
		cfg.Shards = DefaultShards
	}
	if cfg.LastSeenTTL <= 0 {
		cfg.LastSeenTTL = presence.DefaultConfig().LastSeenTTL
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 15 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Relay{nc: nc, rdb: rdb, reg: reg, cfg: cfg, log: cfg.Logger, members: members, now: time.Now}
	r.mu.follow = make(map[string]int)
	r.mu.on = make(map[string]*nodeUsers)
	r.mu.where = make(map[string][]string)
	r.mu.placed = make(map[string]uint64)
	r.mu.shardRefs = make([]int, cfg.Shards)
	r.mu.subs = make([]*natsio.Subscription, cfg.Shards)
	r.mu.seen = make([]int, cfg.Shards)
	return r
}

// ShardOf returns user's presence shard among n.
func ShardOf(user string, n int) int {
	h := uint32(2166136261)
	for i := 0; i < len(user); i++ {
		h ^= uint32(user[i])
		h *= 16777619
	}
	return int(h % uint32(n))
}

func (r *Relay) lastSeenKey(user string) string { return r.cfg.Namespace + ":ls:" + user }

// hint is the message on a shard subject: a device of User connected
// (Online) or disconnected somewhere.
type hint struct {
	User   string `json:"u"`
	Online bool   `json:"o,omitempty"`
}

// decodeHint parses a hint; a hint without a user is an error.
func decodeHint(data []byte) (hint, error) {
	var h hint
	if err := json.Unmarshal(data, &h); err != nil {
		return hint{}, err
	}
	if h.User == "" {
		return hint{}, errors.New("relay: hint without a user")
	}
	return h, nil
}

// Changed records a disconnect's last seen in Redis and tells the user's
// followers on its shard subject.
func (r *Relay) Changed(ctx context.Context, user string, online bool) {
	if !online {
		now := r.now().UnixMilli()
		if err := r.rdb.Set(ctx, r.lastSeenKey(user), now, r.cfg.LastSeenTTL).Err(); err != nil {
			r.log.Warn("presence: last seen not recorded", "err", err)
		}
	}
	data, _ := json.Marshal(hint{User: user, Online: online})
	if err := r.nc.Publish(subjectShard(r.cfg.Namespace, ShardOf(user, r.cfg.Shards)), data); err != nil {
		r.log.Warn("presence: hint not sent", "err", err)
	}
}

// deadLookup is the Redis registry's lookup that also names the users
// whose entries belonged to a dead gateway (rredis.Registry.LookupDead).
type deadLookup interface {
	LookupDead(ctx context.Context, users []string) (map[string][]registry.Entry, []string, error)
}

// epochReader reads gateways' lease epochs (rredis.Registry.Epochs).
type epochReader interface {
	Epochs(ctx context.Context, nodes []string) (map[string]string, error)
}

// placeLocked records where a followed user's devices are, per the read
// just done; mu held.
func (r *Relay) placeLocked(user string, entries []registry.Entry) {
	for _, n := range r.mu.where[user] {
		if nu := r.mu.on[n]; nu != nil {
			delete(nu.users, user)
			if len(nu.users) == 0 {
				delete(r.mu.on, n)
			}
		}
	}
	delete(r.mu.where, user)
	if r.mu.follow[user] == 0 {
		delete(r.mu.placed, user)
		return
	}
	if len(entries) == 0 {
		return
	}
	nodes := make([]string, 0, len(entries))
	for _, e := range entries {
		if slices.Contains(nodes, e.Node) {
			continue
		}
		nodes = append(nodes, e.Node)
		nu := r.mu.on[e.Node]
		if nu == nil {
			nu = &nodeUsers{users: make(map[string]struct{})}
			r.mu.on[e.Node] = nu
		}
		nu.users[user] = struct{}{}
	}
	r.mu.where[user] = nodes
}

// checkNodes reads the lease epochs of the nodes followed users are on
// and returns the users on nodes whose epoch changed since the first
// check (those nodes are forgotten until a read finds users there again);
// ok is false if the registry cannot tell epochs.
func (r *Relay) checkNodes(ctx context.Context) (users []string, ok bool) {
	er, ok := r.reg.(epochReader)
	if !ok {
		return nil, false
	}
	r.mu.Lock()
	nodes := make([]string, 0, len(r.mu.on))
	for n := range r.mu.on {
		nodes = append(nodes, n)
	}
	r.mu.Unlock()
	if len(nodes) == 0 {
		return nil, true
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	epochs, err := er.Epochs(cctx, nodes)
	cancel()
	if err != nil {
		r.log.Warn("presence: gateway leases unreadable; rechecked next time", "err", err)
		return nil, true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range nodes {
		nu := r.mu.on[n]
		if nu == nil {
			continue
		}
		e := epochs[n]
		switch {
		case nu.epoch == "" && e != "":
			nu.epoch = e // the first check
			continue
		case nu.epoch == e && e != "":
			continue // alive
		}
		// Dead (no lease) or restarted (a new epoch; its former entries
		// are dropped): read its users again.
		for u := range nu.users {
			users = append(users, u)
			if w := slices.DeleteFunc(r.mu.where[u], func(x string) bool { return x == n }); len(w) > 0 {
				r.mu.where[u] = w
			} else {
				delete(r.mu.where, u)
			}
		}
		delete(r.mu.on, n)
	}
	return users, true
}

// Gone records users offline whose devices were dropped without their
// disconnects (a gateway starting under the name of one that died clears
// what it left): their last seen, pipelined, and a hint each.
func (r *Relay) Gone(ctx context.Context, users []string) {
	now := r.now().UnixMilli()
	for len(users) > 0 {
		part := users[:min(len(users), statesBatch)]
		users = users[len(part):]
		p := r.rdb.Pipeline()
		for _, u := range part {
			p.Set(ctx, r.lastSeenKey(u), now, r.cfg.LastSeenTTL)
		}
		if _, err := p.Exec(ctx); err != nil {
			r.log.Warn("presence: last seen of dropped devices not recorded", "users", len(part), "err", err)
		}
		for _, u := range part {
			data, _ := json.Marshal(hint{User: u})
			if err := r.nc.Publish(subjectShard(r.cfg.Namespace, ShardOf(u, r.cfg.Shards)), data); err != nil {
				r.log.Warn("presence: hint not sent", "err", err)
				return
			}
		}
	}
}

// statesBatch bounds the users of one pipelined read.
const statesBatch = 1000

// States reads users' devices from the registry and the last seen of
// those without any from Redis: two or three pipelined round trips per
// statesBatch users.
func (r *Relay) States(ctx context.Context, users []string) (map[string]presence.State, error) {
	return r.states(ctx, users, nil)
}

// Placed is States, also answering the gateway nodes of each online
// user's devices (sorted): the fan-out's roster groups members by node.
func (r *Relay) Placed(ctx context.Context, users []string) (map[string]presence.State, map[string][]string, error) {
	where := make(map[string][]string)
	states, err := r.states(ctx, users, where)
	return states, where, err
}

func (r *Relay) states(ctx context.Context, users []string, where map[string][]string) (map[string]presence.State, error) {
	out := make(map[string]presence.State, len(users))
	for len(users) > 0 {
		part := users[:min(len(users), statesBatch)]
		users = users[len(part):]
		var online map[string][]registry.Entry
		var died []string
		var err error
		r.mu.Lock()
		r.mu.reads++
		read := r.mu.reads
		r.mu.Unlock()
		if dl, ok := r.reg.(deadLookup); ok {
			online, died, err = dl.LookupDead(ctx, part)
		} else {
			online, err = r.reg.Lookup(ctx, part)
		}
		if err != nil {
			return nil, fmt.Errorf("relay: presence: %w", err)
		}
		r.mu.Lock()
		for _, u := range part {
			if read < r.mu.placed[u] {
				continue // a newer read placed u
			}
			r.placeLocked(u, online[u])
			if r.mu.follow[u] > 0 {
				r.mu.placed[u] = read
			}
		}
		r.mu.Unlock()
		var offline []string
		for _, u := range part {
			if es := online[u]; len(es) > 0 {
				nodes := make([]string, 0, len(es))
				for _, e := range es {
					if !slices.Contains(nodes, e.Node) {
						nodes = append(nodes, e.Node)
					}
				}
				slices.Sort(nodes)
				if where != nil {
					where[u] = nodes
				}
				out[u] = presence.State{Online: true}
			} else {
				offline = append(offline, u)
			}
		}
		if len(offline) == 0 {
			continue
		}
		if len(died) > 0 {
			// Devices of a gateway that died: it could not record their
			// last seen, so the read that finds them gone does.
			now := r.now().UnixMilli()
			p := r.rdb.Pipeline()
			for _, u := range died {
				if len(online[u]) == 0 {
					p.Set(ctx, r.lastSeenKey(u), now, r.cfg.LastSeenTTL)
				}
			}
			if _, err := p.Exec(ctx); err != nil {
				r.log.Warn("presence: last seen of a dead gateway's users not recorded", "err", err)
			}
		}
		p := r.rdb.Pipeline()
		cmds := make([]*goredis.StringCmd, len(offline))
		for i, u := range offline {
			cmds[i] = p.Get(ctx, r.lastSeenKey(u))
		}
		if _, err := p.Exec(ctx); err != nil && !errors.Is(err, goredis.Nil) {
			return nil, fmt.Errorf("relay: presence: last seen: %w", err)
		}
		for i, u := range offline {
			at, _ := cmds[i].Int64() // missing (expired): 0
			out[u] = presence.State{LastSeen: at}
		}
	}
	return out, nil
}

// Follow adds an interest in each user, subscribing to shards that had
// none.
func (r *Relay) Follow(users []string) {
	if len(users) == 0 {
		return
	}
	subscribed := false
	defer func() {
		if subscribed {
			// The server has the new subscriptions when Follow returns,
			// so a change after it is heard.
			if err := r.nc.FlushTimeout(5 * time.Second); err != nil {
				r.log.Warn("presence: flush of shard subscriptions failed", "err", err)
			}
		}
	}()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, u := range users {
		r.mu.follow[u]++
		if r.mu.follow[u] > 1 {
			continue
		}
		sh := ShardOf(u, r.cfg.Shards)
		r.mu.shardRefs[sh]++
		if r.mu.subs[sh] == nil && !r.mu.closed {
			sub, err := r.nc.Subscribe(subjectShard(r.cfg.Namespace, sh), r.gate.Wrap(r.receive, nil))
			if err != nil {
				// Its users are read again at the next resync.
				r.log.Warn("presence: shard subscription failed", "shard", sh, "err", err)
				continue
			}
			r.mu.subs[sh] = sub
			r.mu.seen[sh] = 0
			subscribed = true
		}
	}
}

// Unfollow removes an interest in each user, unsubscribing from shards
// left without followed users.
func (r *Relay) Unfollow(users []string) {
	if len(users) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, u := range users {
		n := r.mu.follow[u] - 1
		if n > 0 {
			r.mu.follow[u] = n
			continue
		}
		if n < 0 {
			continue
		}
		delete(r.mu.follow, u)
		r.placeLocked(u, nil)
		sh := ShardOf(u, r.cfg.Shards)
		if r.mu.shardRefs[sh]--; r.mu.shardRefs[sh] == 0 && r.mu.subs[sh] != nil {
			r.countDropsLocked(sh) // its last drops still count
			_ = r.mu.subs[sh].Unsubscribe()
			r.mu.subs[sh] = nil
			r.mu.seen[sh] = 0
		}
	}
}

// countDropsLocked adds to drops the hints the client dropped on shard
// sh's subscription since last counted; mu held.
func (r *Relay) countDropsLocked(sh int) {
	s := r.mu.subs[sh]
	if s == nil {
		return
	}
	if n, err := s.Dropped(); err == nil && n > r.mu.seen[sh] {
		r.mu.drops += uint64(n - r.mu.seen[sh])
		r.mu.seen[sh] = n
	}
}

func (r *Relay) Listen(l presence.Listener) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mu.listeners = append(r.mu.listeners, l)
}

// receive handles a hint: told to the listeners if the user is followed.
func (r *Relay) receive(m *natsio.Msg) {
	h, err := decodeHint(m.Data)
	if err != nil {
		return
	}
	r.mu.Lock()
	followed := r.mu.follow[h.User] > 0
	ls := r.mu.listeners
	r.mu.Unlock()
	if followed {
		r.tell(ls, presence.Users, []string{h.User})
	}
}

func (r *Relay) tell(ls []presence.Listener, scope presence.Scope, users []string) {
	for _, l := range ls {
		l(scope, users)
	}
}

// Followed returns how many users this process follows and how many shard
// subjects it subscribes to (tests, metrics).
func (r *Relay) Followed() (users, shards int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.mu.subs {
		if s != nil {
			shards++
		}
	}
	return len(r.mu.follow), shards
}

// Joined tells the other processes of members that joined conv.
func (r *Relay) Joined(conv uint64, members []store.Member) {
	r.announce(membersEvent{Node: r.cfg.Node, Conv: conv, Joined: members})
}

// Left tells the other processes of users that left conv.
func (r *Relay) Left(conv uint64, users []string) {
	r.announce(membersEvent{Node: r.cfg.Node, Conv: conv, Left: users})
}

func (r *Relay) announce(ev membersEvent) {
	data, _ := json.Marshal(ev)
	if len(data) > int(r.nc.MaxPayload()) {
		// A join of more users than one message holds: the other
		// processes rebuild the group from the store when they own it.
		r.log.Warn("membership announce too large; left to the owners' rebuild", "conv", ev.Conv, "bytes", len(data))
		return
	}
	if err := r.nc.Publish(subjectMembers(r.cfg.Namespace), data); err != nil {
		r.log.Warn("membership announce failed", "err", err)
	}
}

// Run applies other processes' membership changes and tells the listeners
// what to read again: every followed user after a NATS reconnect or
// dropped hints; every Resync, the ones on a gateway whose lease lapsed
// or changed (all the online ones if the registry cannot tell leases). It
// unsubscribes and waits for the running handlers when ctx ends.
func (r *Relay) Run(ctx context.Context) error {
	defer func() {
		r.mu.Lock()
		r.mu.closed = true
		for i, s := range r.mu.subs {
			if s != nil {
				_ = s.Unsubscribe()
				r.mu.subs[i] = nil
			}
		}
		r.mu.Unlock()
		r.gate.Close()
	}()
	if r.members != nil {
		sub, err := r.nc.Subscribe(subjectMembers(r.cfg.Namespace), r.gate.Wrap(func(m *natsio.Msg) {
			var ev membersEvent
			if json.Unmarshal(m.Data, &ev) != nil || ev.Node == r.cfg.Node {
				return
			}
			if len(ev.Joined) > 0 {
				r.members.Joined(ev.Conv, ev.Joined)
			}
			if len(ev.Left) > 0 {
				r.members.Left(ev.Conv, ev.Left)
			}
		}, nil))
		if err != nil {
			return fmt.Errorf("relay: members: %w", err)
		}
		defer sub.Unsubscribe()
	}
	ticks := r.ticks
	if ticks == nil {
		check := time.NewTicker(time.Second)
		defer check.Stop()
		ticks = check.C
	}
	reconnects := r.nc.Stats().Reconnects
	var dropped uint64
	last := r.now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticks:
		}
		r.mu.Lock()
		for sh := range r.mu.subs {
			r.countDropsLocked(sh)
		}
		d := r.mu.drops
		ls := r.mu.listeners
		r.mu.Unlock()
		if rc := r.nc.Stats().Reconnects; rc != reconnects || d > dropped {
			reconnects = rc
			last = r.now()
			r.tell(ls, presence.Everyone, nil)
		} else if r.now().Sub(last) >= r.cfg.Resync {
			// A gateway killed without disconnecting announces nothing:
			// its lease lapses. Only the users on gateways whose lease
			// changed are read again (one round trip for the leases).
			last = r.now()
			if users, ok := r.checkNodes(ctx); !ok {
				r.tell(ls, presence.OnlineOnes, nil)
			} else if len(users) > 0 {
				r.tell(ls, presence.Users, users)
			}
		}
		dropped = d
	}
}
