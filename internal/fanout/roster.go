package fanout

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parley-im/parley/internal/bus"
	"github.com/parley-im/parley/internal/presence"
	"github.com/parley-im/parley/internal/store"
)

// Roster is the online-member index of a cluster chat process: Online's
// answers, built without mirroring the cluster's online users. For each
// tracked group it holds the group's members (all of them, with their
// join_seq) and which are online; a member's online state is read from the
// presence directory (the session registry, one pipelined read per batch)
// when the group is tracked, and read again whenever the directory tells
// of a change of that user (it follows exactly the members of tracked
// groups). So its memory follows the groups this process tracks (bounded
// by Scoped), never the number of users online in the cluster.
//
// A read of a user that started before a notification of that user is
// not applied: the notification queues a newer read. Run does the reads
// that notifications queue; a failed read is retried.
//
// Locks. mu guards the users and the groups' members, and the work in
// proportion to the users held runs under it (a notification of
// everyone, tracking or untracking a large group, applying a batch of
// reads). The send path (Tracked, GroupOnline) never takes it: it finds
// the group in view, a hash-sharded map of the tracked groups under
// read-write locks that a writer holds only to add or remove one group,
// and returns the group's snapshot of its online members, built after a
// change under the group's own lock and then shared. Writers hold mu,
// then a view shard's lock or a group's lock, each for one group. The
// change of a group's online members made by one call (Track, Joined,
// Left, a batch of reads) is applied to the group under its lock at
// once, so a send sees it whole or not at all, as it did when one lock
// guarded everything (TestRosterSendSeesChangesWhole).
type Roster struct {
	dir presence.Directory
	log *slog.Logger
	// prefix and lists number the versions of the groups' node lists
	// (GroupNodes): unique across processes and restarts.
	prefix string
	lists  atomic.Uint64

	mu    sync.Mutex
	users map[string]*rosterUser
	dirty map[string]bool // users to read again
	kick  chan struct{}

	// view holds the tracked groups; changed under mu.
	view [rosterShards]rosterShard
}

const rosterShards = 64

type rosterShard struct {
	mu sync.RWMutex
	m  map[uint64]*rosterGroup
}

type rosterUser struct {
	online bool
	nodes  []string          // gateway nodes of its devices, when online
	ver    uint64            // bumped by every notification of the user
	groups map[uint64]uint64 // tracked group → join_seq
}

type rosterGroup struct {
	members map[string]uint64 // every current member → join_seq; under Roster.mu

	// mu guards online, nodes and lists, changed also under Roster.mu.
	mu     sync.Mutex
	online map[string]uint64   // the online members
	nodes  map[string][]string // their gateway nodes, where known
	// snap is online as a slice, shared until a change (nil after one).
	snap atomic.Pointer[[]store.Member]
	// lists are the online members by node (GroupNodes), built after a
	// change; prev is the last built, whose unchanged lists keep their
	// versions.
	lists, prev map[string]*NodeList
}

// NodeList is one version of the list of a group's online members on one
// gateway node. Its members are read-only; Sent records that the node
// acknowledged a delivery carrying it, so later ones name it only.
type NodeList struct {
	Version string
	Members []bus.Member
	Sent    atomic.Bool
}

func (r *Roster) shard(conv uint64) *rosterShard {
	// Conversation ids are Snowflake ids: mix the bits (as Online does).
	x := conv * 0x9E3779B97F4A7C15
	return &r.view[(x>>32)%rosterShards]
}

// group returns conv's entry, nil if not tracked.
func (r *Roster) group(conv uint64) *rosterGroup {
	sh := r.shard(conv)
	sh.mu.RLock()
	g := sh.m[conv]
	sh.mu.RUnlock()
	return g
}

// rosterBatch bounds the users read in one pipelined directory call.
const rosterBatch = 1000

// NewRoster returns an empty roster reading dir (nil: Attach one before
// use); call Run.
func NewRoster(dir presence.Directory, log *slog.Logger) *Roster {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var nonce [6]byte
	_, _ = rand.Read(nonce[:])
	r := &Roster{log: log, users: make(map[string]*rosterUser), prefix: hex.EncodeToString(nonce[:]) + ".",
		dirty: make(map[string]bool), kick: make(chan struct{}, 1)}
	for i := range r.view {
		r.view[i].m = make(map[uint64]*rosterGroup)
	}
	if dir != nil {
		r.Attach(dir)
	}
	return r
}

// Attach sets the directory of a roster made without one (before any
// other call).
func (r *Roster) Attach(dir presence.Directory) {
	r.dir = dir
	dir.Listen(r.notify)
}

func (r *Roster) notify(scope presence.Scope, users []string) {
	r.mu.Lock()
	switch scope {
	case presence.Users:
		for _, name := range users {
			if u := r.users[name]; u != nil {
				u.ver++
				r.dirty[name] = true
			}
		}
	case presence.OnlineOnes:
		for name, u := range r.users {
			if u.online {
				r.dirty[name] = true
			}
		}
	case presence.Everyone:
		for name := range r.users {
			r.dirty[name] = true
		}
	}
	n := len(r.dirty)
	r.mu.Unlock()
	if n > 0 {
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
}

// Run reads the users notifications marked until ctx ends.
func (r *Roster) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		}
		r.mu.Lock()
		batch := make([]string, 0, min(len(r.dirty), rosterBatch))
		for name := range r.dirty {
			delete(r.dirty, name)
			batch = append(batch, name)
			if len(batch) == rosterBatch {
				break
			}
		}
		more := len(r.dirty) > 0
		r.mu.Unlock()
		if err := r.read(ctx, batch); err != nil && ctx.Err() == nil {
			r.log.Warn("online index: presence read failed; retrying", "users", len(batch), "err", err)
			r.mu.Lock()
			for _, name := range batch {
				if r.users[name] != nil {
					r.dirty[name] = true
				}
			}
			r.mu.Unlock()
			more = true
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
		if more {
			select {
			case r.kick <- struct{}{}:
			default:
			}
		}
	}
}

// read reads users' states and applies those not notified meanwhile.
func (r *Roster) read(ctx context.Context, users []string) error {
	for len(users) > 0 {
		part := users[:min(len(users), rosterBatch)]
		users = users[len(part):]
		// The entry and its version: a read is applied only to the entry
		// it began for (one forgotten and made again meanwhile missed the
		// notifications in between) and only if no notification came.
		vers := make([]uint64, len(part))
		ents := make([]*rosterUser, len(part))
		r.mu.Lock()
		for i, name := range part {
			if u := r.users[name]; u != nil {
				vers[i], ents[i] = u.ver, u
			}
		}
		r.mu.Unlock()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var states map[string]presence.State
		var where map[string][]string
		var err error
		if p, ok := r.dir.(placer); ok {
			states, where, err = p.Placed(rctx, part)
		} else {
			states, err = r.dir.States(rctx, part)
		}
		cancel()
		if err != nil {
			return err
		}
		r.mu.Lock()
		var changes map[*rosterGroup][]onlineChange
		for i, name := range part {
			if u := r.users[name]; u != nil && u == ents[i] && u.ver == vers[i] {
				changes = r.setLocked(changes, name, u, states[name].Online, where[name])
			}
		}
		for g, cs := range changes {
			g.apply(cs)
		}
		r.mu.Unlock()
	}
	return nil
}

// placer is a directory that also tells the gateway nodes of online
// users' devices (relay.Relay in cluster mode).
type placer interface {
	Placed(ctx context.Context, users []string) (map[string]presence.State, map[string][]string, error)
}

// onlineChange is a member of a group going online (or moving between
// gateway nodes) or offline.
type onlineChange struct {
	user   string
	join   uint64
	online bool
	nodes  []string
}

// setLocked records user's online state and nodes and adds the changes of
// its groups' online members to changes (returned, made if nil), to apply
// per group at once.
func (r *Roster) setLocked(changes map[*rosterGroup][]onlineChange, name string, u *rosterUser, online bool, nodes []string) map[*rosterGroup][]onlineChange {
	if !online {
		nodes = nil
	}
	if u.online == online && slices.Equal(u.nodes, nodes) {
		return changes
	}
	u.online, u.nodes = online, nodes
	for conv, join := range u.groups {
		g := r.group(conv)
		if g == nil {
			continue
		}
		if changes == nil {
			changes = make(map[*rosterGroup][]onlineChange)
		}
		changes[g] = append(changes[g], onlineChange{user: name, join: join, online: online, nodes: nodes})
	}
	return changes
}

// apply changes g's online members at once; Roster.mu held.
func (g *rosterGroup) apply(cs []onlineChange) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range cs {
		if c.online {
			g.online[c.user] = c.join
			if len(c.nodes) > 0 {
				g.nodes[c.user] = c.nodes
			} else {
				delete(g.nodes, c.user)
			}
		} else {
			delete(g.online, c.user)
			delete(g.nodes, c.user)
		}
	}
	g.snap.Store(nil)
	if g.lists != nil {
		g.prev, g.lists = g.lists, nil
	}
}

// addLocked makes members members of g and returns the users new to the
// roster (to follow and read); the online ones join g's online members
// at once.
func (r *Roster) addLocked(conv uint64, g *rosterGroup, members []store.Member) []string {
	var fresh []string
	var online []onlineChange
	for _, m := range members {
		if m.LeaveSeq != 0 {
			continue
		}
		u := r.users[m.UserID]
		if u == nil {
			u = &rosterUser{groups: make(map[uint64]uint64)}
			r.users[m.UserID] = u
			fresh = append(fresh, m.UserID)
		}
		u.groups[conv] = m.JoinSeq
		g.members[m.UserID] = m.JoinSeq
		if u.online {
			online = append(online, onlineChange{user: m.UserID, join: m.JoinSeq, online: true, nodes: u.nodes})
		}
	}
	if len(online) > 0 {
		g.apply(online)
	}
	return fresh
}

// removeLocked forgets user as a member of conv (not as one of g's online
// members: the caller does that) and returns whether the roster no longer
// holds the user at all (to unfollow).
func (r *Roster) removeLocked(conv uint64, g *rosterGroup, name string) bool {
	delete(g.members, name)
	u := r.users[name]
	if u == nil {
		return false
	}
	delete(u.groups, conv)
	if len(u.groups) > 0 {
		return false
	}
	delete(r.users, name)
	delete(r.dirty, name)
	return true
}

// Tracked reports whether conv's online members are indexed.
func (r *Roster) Tracked(conv uint64) bool {
	return r.group(conv) != nil
}

// Track starts indexing conv given all its current members: their online
// state is read from the directory (pipelined, rosterBatch users per round
// trip) before Track returns. If that read fails the group is not tracked
// (its fan-out fails and is retried rather than missing online members).
func (r *Roster) Track(conv uint64, members []store.Member) {
	r.mu.Lock()
	var fresh []string
	if g := r.group(conv); g != nil {
		fresh = r.addLocked(conv, g, members)
	} else {
		// Built whole before the send path can see it.
		g = &rosterGroup{members: make(map[string]uint64, len(members)), online: make(map[string]uint64), nodes: make(map[string][]string)}
		fresh = r.addLocked(conv, g, members)
		sh := r.shard(conv)
		sh.mu.Lock()
		sh.m[conv] = g
		sh.mu.Unlock()
	}
	r.mu.Unlock()
	if !r.follow(fresh) {
		r.Untrack(conv)
	}
}

// follow follows users and reads their states; false if the read failed.
func (r *Roster) follow(users []string) bool {
	if len(users) == 0 {
		return true
	}
	r.dir.Follow(users) // before the read: a change after it is heard
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.read(ctx, users); err != nil {
		r.log.Warn("online index: presence read failed", "users", len(users), "err", err)
		return false
	}
	return true
}

// Untrack stops indexing conv.
func (r *Roster) Untrack(conv uint64) {
	r.mu.Lock()
	sh := r.shard(conv)
	sh.mu.Lock()
	g := sh.m[conv]
	delete(sh.m, conv)
	sh.mu.Unlock()
	var gone []string
	if g != nil {
		// Out of view: its online members stay as they were for a send
		// that found it just before.
		for name := range g.members {
			if r.removeLocked(conv, g, name) {
				gone = append(gone, name)
			}
		}
	}
	r.mu.Unlock()
	r.dir.Unfollow(gone)
}

// Joined indexes members that joined a tracked group.
func (r *Roster) Joined(conv uint64, members []store.Member) {
	r.mu.Lock()
	g := r.group(conv)
	if g == nil {
		r.mu.Unlock()
		return
	}
	fresh := r.addLocked(conv, g, members)
	r.mu.Unlock()
	if !r.follow(fresh) {
		r.Untrack(conv)
	}
}

// Left forgets users that left a tracked group.
func (r *Roster) Left(conv uint64, users []string) {
	r.mu.Lock()
	g := r.group(conv)
	var gone []string
	if g != nil {
		for _, name := range users {
			if r.removeLocked(conv, g, name) {
				gone = append(gone, name)
			}
		}
		// The online ones among them go at once (online is read here
		// under Roster.mu alone: it changes only under it).
		var cs []onlineChange
		for _, name := range users {
			if _, ok := g.online[name]; ok {
				cs = append(cs, onlineChange{user: name})
			}
		}
		if len(cs) > 0 {
			g.apply(cs)
		}
	}
	r.mu.Unlock()
	r.dir.Unfollow(gone)
}

// GroupOnline returns the online members of a tracked group with their
// join_seq, and true; false if conv is not tracked. The slice is shared
// with other callers until the group's online members change: callers
// must not modify it.
func (r *Roster) GroupOnline(conv uint64) ([]store.Member, bool) {
	g := r.group(conv)
	if g == nil {
		return nil, false
	}
	if snap := g.snap.Load(); snap != nil {
		return *snap, true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if snap := g.snap.Load(); snap != nil {
		return *snap, true
	}
	snap := make([]store.Member, 0, len(g.online))
	for u, join := range g.online {
		snap = append(snap, store.Member{ConvID: conv, UserID: u, JoinSeq: join})
	}
	g.snap.Store(&snap)
	return snap, true
}

// GroupNodes returns the online members of a tracked group by gateway
// node, and true; false if conv is not tracked, or if an online member's
// nodes are not known (the directory does not tell them): the caller then
// finds the nodes itself. A node's list keeps its version while its
// members stay the same; the map and lists are shared until the next
// change: callers must not modify them.
func (r *Roster) GroupNodes(conv uint64) (map[string]*NodeList, bool) {
	g := r.group(conv)
	if g == nil {
		return nil, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.nodes) != len(g.online) {
		return nil, false
	}
	if g.lists != nil {
		return g.lists, true
	}
	byNode := make(map[string][]bus.Member)
	for u, join := range g.online {
		for _, n := range g.nodes[u] {
			byNode[n] = append(byNode[n], bus.Member{User: u, JoinSeq: join})
		}
	}
	lists := make(map[string]*NodeList, len(byNode))
	for n, ms := range byNode {
		slices.SortFunc(ms, func(a, b bus.Member) int { return strings.Compare(a.User, b.User) })
		if p := g.prev[n]; p != nil && slices.Equal(p.Members, ms) {
			lists[n] = p
			continue
		}
		lists[n] = &NodeList{Version: r.prefix + strconv.FormatUint(r.lists.Add(1), 36), Members: ms}
	}
	g.lists, g.prev = lists, nil
	return lists, true
}

// Size returns how many users and groups the roster holds (tests,
// metrics).
func (r *Roster) Size() (users, groups int) {
	r.mu.Lock()
	users = len(r.users)
	r.mu.Unlock()
	for i := range r.view {
		sh := &r.view[i]
		sh.mu.RLock()
		groups += len(sh.m)
		sh.mu.RUnlock()
	}
	return users, groups
}
