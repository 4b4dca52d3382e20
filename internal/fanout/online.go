package fanout

import (
	"context"
	"hash/maphash"
	"sync"

	"github.com/parley-im/parley/internal/store"
)

// The online-member index: for each tracked group (medium and large
// tiers), which members are online on the node (or, in cluster mode, on
// any gateway) and their join_seq, so a send costs work proportional to
// the members online, not to the group's size, and needs no membership
// read per recipient.
//
// It has no global lock. Groups and users live in hash-sharded maps. A
// group's online members are a map under the group's own lock, and
// GroupOnline returns a snapshot slice that is built once after a change
// and then shared (copy-on-write): sends to a group whose online members
// did not change take one read lock and one group lock, and copy nothing.
// Every online user records the tracked groups it is indexed in, so a
// disconnect touches only that user's groups, never all groups.
//
// Lock order: a user's shard, then a group's lock; GroupOnline takes only
// the latter. A user is added to a group only under its user shard's lock
// after checking it is online, so a disconnect racing a Track or a Joined
// never leaves an offline user indexed.

// RowLister lists a user's conversations (the store).
type RowLister interface {
	UserConversations(ctx context.Context, user string) ([]store.ConvRow, error)
}

const onlineShards = 64

// Online is the online-member index. It is safe for concurrent use.
type Online struct {
	rows   RowLister
	seed   maphash.Seed
	users  [onlineShards]userShard
	groups [onlineShards]groupShard
}

type userShard struct {
	mu sync.Mutex
	m  map[string]*onlineUser
}

// onlineUser is a user with at least one connected device.
type onlineUser struct {
	devices int
	groups  map[uint64]struct{} // tracked groups the user is indexed in
}

type groupShard struct {
	mu sync.RWMutex
	m  map[uint64]*onlineGroup
}

type onlineGroup struct {
	conv uint64
	mu   sync.Mutex
	// members are the online members and their join_seq; snap, when not
	// nil, is the same as a slice, shared by every GroupOnline until the
	// next change.
	members map[string]uint64
	snap    []store.Member
}

// NewOnline returns an empty index; rows finds a connecting user's groups.
func NewOnline(rows RowLister) *Online {
	o := &Online{rows: rows, seed: maphash.MakeSeed()}
	for i := range o.users {
		o.users[i].m = make(map[string]*onlineUser)
	}
	for i := range o.groups {
		o.groups[i].m = make(map[uint64]*onlineGroup)
	}
	return o
}

func (o *Online) userShard(user string) *userShard {
	return &o.users[maphash.String(o.seed, user)%onlineShards]
}

func (o *Online) groupShard(conv uint64) *groupShard {
	// Conversation ids are Snowflake ids: mix the bits before taking a
	// shard so that consecutive ids spread.
	x := conv * 0x9E3779B97F4A7C15
	return &o.groups[(x>>32)%onlineShards]
}

func (o *Online) group(conv uint64) *onlineGroup {
	sh := o.groupShard(conv)
	sh.mu.RLock()
	g := sh.m[conv]
	sh.mu.RUnlock()
	return g
}

// Connected counts a device of user; the first one makes the user online
// and indexes it in the tracked groups it belongs to (one read of its
// conversation list, only when some group is tracked).
func (o *Online) Connected(ctx context.Context, user string) {
	us := o.userShard(user)
	us.mu.Lock()
	u := us.m[user]
	if u == nil {
		u = &onlineUser{}
		us.m[user] = u
	}
	u.devices++
	first := u.devices == 1
	us.mu.Unlock()
	if !first || !o.anyTracked() {
		return
	}
	rows, err := o.rows.UserConversations(ctx, user)
	if err != nil {
		return // the group index catches up when the group is next tracked
	}
	for _, r := range rows {
		if r.LeaveSeq != 0 {
			continue
		}
		if g := o.group(r.ConvID); g != nil {
			o.add(g, user, r.JoinSeq)
		}
	}
}

func (o *Online) anyTracked() bool {
	for i := range o.groups {
		sh := &o.groups[i]
		sh.mu.RLock()
		n := len(sh.m)
		sh.mu.RUnlock()
		if n > 0 {
			return true
		}
	}
	return false
}

// add indexes user in g if it is online.
func (o *Online) add(g *onlineGroup, user string, joinSeq uint64) {
	us := o.userShard(user)
	us.mu.Lock()
	defer us.mu.Unlock()
	u := us.m[user]
	if u == nil || u.devices == 0 {
		return
	}
	g.mu.Lock()
	if j, ok := g.members[user]; !ok || j != joinSeq {
		g.members[user] = joinSeq
		g.snap = nil
	}
	g.mu.Unlock()
	if u.groups == nil {
		u.groups = make(map[uint64]struct{})
	}
	u.groups[g.conv] = struct{}{}
}

// Disconnected counts a device gone; the last one makes the user offline
// and removes it from the groups it is indexed in (its own, not all).
func (o *Online) Disconnected(user string) {
	us := o.userShard(user)
	us.mu.Lock()
	defer us.mu.Unlock()
	u := us.m[user]
	if u == nil {
		return
	}
	if u.devices--; u.devices > 0 {
		return
	}
	delete(us.m, user)
	for conv := range u.groups {
		if g := o.group(conv); g != nil {
			g.remove(user)
		}
	}
}

func (g *onlineGroup) remove(user string) {
	g.mu.Lock()
	if _, ok := g.members[user]; ok {
		delete(g.members, user)
		g.snap = nil
	}
	g.mu.Unlock()
}

// Online reports whether user has a connected device.
func (o *Online) Online(user string) bool {
	us := o.userShard(user)
	us.mu.Lock()
	defer us.mu.Unlock()
	u := us.m[user]
	return u != nil && u.devices > 0
}

// Tracked reports whether conv's online members are indexed.
func (o *Online) Tracked(conv uint64) bool { return o.group(conv) != nil }

// Track starts indexing conv's online members, given all its current
// members: a one-time cost proportional to the group, paid when it enters
// the medium tier or after a restart.
func (o *Online) Track(conv uint64, members []store.Member) {
	sh := o.groupShard(conv)
	sh.mu.Lock()
	g := sh.m[conv]
	if g == nil {
		g = &onlineGroup{conv: conv, members: make(map[string]uint64)}
		sh.m[conv] = g
	}
	sh.mu.Unlock()
	for _, m := range members {
		if m.LeaveSeq == 0 {
			o.add(g, m.UserID, m.JoinSeq)
		}
	}
}

// Untrack stops indexing conv (it went back to the small tier).
func (o *Online) Untrack(conv uint64) {
	sh := o.groupShard(conv)
	sh.mu.Lock()
	g := sh.m[conv]
	delete(sh.m, conv)
	sh.mu.Unlock()
	if g == nil {
		return
	}
	g.mu.Lock()
	users := make([]string, 0, len(g.members))
	for u := range g.members {
		users = append(users, u)
	}
	g.mu.Unlock()
	for _, user := range users {
		us := o.userShard(user)
		us.mu.Lock()
		if u := us.m[user]; u != nil && o.group(conv) == nil {
			delete(u.groups, conv)
		}
		us.mu.Unlock()
	}
}

// Joined indexes the online ones of members that joined a tracked group.
func (o *Online) Joined(conv uint64, members []store.Member) {
	g := o.group(conv)
	if g == nil {
		return
	}
	for _, m := range members {
		o.add(g, m.UserID, m.JoinSeq)
	}
}

// Left forgets users that left a tracked group.
func (o *Online) Left(conv uint64, users []string) {
	g := o.group(conv)
	if g == nil {
		return
	}
	for _, user := range users {
		us := o.userShard(user)
		us.mu.Lock()
		g.remove(user)
		if u := us.m[user]; u != nil {
			delete(u.groups, conv)
		}
		us.mu.Unlock()
	}
}

// GroupOnline returns the online members of a tracked group with their
// join_seq, and true; false if conv is not tracked. The slice is shared
// with other callers until the group's online members change: callers
// must not modify it.
func (o *Online) GroupOnline(conv uint64) ([]store.Member, bool) {
	g := o.group(conv)
	if g == nil {
		return nil, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.snap == nil {
		snap := make([]store.Member, 0, len(g.members))
		for u, join := range g.members {
			snap = append(snap, store.Member{ConvID: conv, UserID: u, JoinSeq: join})
		}
		g.snap = snap
	}
	return g.snap, true
}
