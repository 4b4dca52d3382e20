package fanout

import (
	"context"
	"log/slog"
	"sync"
	"time"

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
type Roster struct {
	dir presence.Directory
	log *slog.Logger

	mu     sync.Mutex
	users  map[string]*rosterUser
	groups map[uint64]*rosterGroup
	dirty  map[string]bool // users to read again
	kick   chan struct{}
}

type rosterUser struct {
	online bool
	ver    uint64            // bumped by every notification of the user
	groups map[uint64]uint64 // tracked group → join_seq
}

type rosterGroup struct {
	members map[string]uint64 // every current member → join_seq
	online  map[string]uint64 // the online ones
	snap    []store.Member    // online as a slice, shared until a change
}

// rosterBatch bounds the users read in one pipelined directory call.
const rosterBatch = 1000

// NewRoster returns an empty roster reading dir (nil: Attach one before
// use); call Run.
func NewRoster(dir presence.Directory, log *slog.Logger) *Roster {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Roster{log: log, users: make(map[string]*rosterUser), groups: make(map[uint64]*rosterGroup),
		dirty: make(map[string]bool), kick: make(chan struct{}, 1)}
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
		states, err := r.dir.States(rctx, part)
		cancel()
		if err != nil {
			return err
		}
		r.mu.Lock()
		for i, name := range part {
			if u := r.users[name]; u != nil && u == ents[i] && u.ver == vers[i] {
				r.setLocked(name, u, states[name].Online)
			}
		}
		r.mu.Unlock()
	}
	return nil
}

// setLocked records user's online state in each of its groups.
func (r *Roster) setLocked(name string, u *rosterUser, online bool) {
	if u.online == online {
		return
	}
	u.online = online
	for conv, join := range u.groups {
		g := r.groups[conv]
		if g == nil {
			continue
		}
		if online {
			g.online[name] = join
		} else {
			delete(g.online, name)
		}
		g.snap = nil
	}
}

// addLocked makes members members of g and returns the users new to the
// roster (to follow and read).
func (r *Roster) addLocked(conv uint64, g *rosterGroup, members []store.Member) []string {
	var fresh []string
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
			g.online[m.UserID] = m.JoinSeq
			g.snap = nil
		}
	}
	return fresh
}

// removeLocked forgets user as a member of conv and returns whether the
// roster no longer holds the user at all (to unfollow).
func (r *Roster) removeLocked(conv uint64, g *rosterGroup, name string) bool {
	delete(g.members, name)
	if _, ok := g.online[name]; ok {
		delete(g.online, name)
		g.snap = nil
	}
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
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.groups[conv] != nil
}

// Track starts indexing conv given all its current members: their online
// state is read from the directory (pipelined, rosterBatch users per round
// trip) before Track returns. If that read fails the group is not tracked
// (its fan-out fails and is retried rather than missing online members).
func (r *Roster) Track(conv uint64, members []store.Member) {
	r.mu.Lock()
	g := r.groups[conv]
	if g == nil {
		g = &rosterGroup{members: make(map[string]uint64), online: make(map[string]uint64)}
		r.groups[conv] = g
	}
	fresh := r.addLocked(conv, g, members)
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
	g := r.groups[conv]
	delete(r.groups, conv)
	var gone []string
	if g != nil {
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
	g := r.groups[conv]
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
	g := r.groups[conv]
	var gone []string
	if g != nil {
		for _, name := range users {
			if r.removeLocked(conv, g, name) {
				gone = append(gone, name)
			}
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
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.groups[conv]
	if g == nil {
		return nil, false
	}
	if g.snap == nil {
		snap := make([]store.Member, 0, len(g.online))
		for u, join := range g.online {
			snap = append(snap, store.Member{ConvID: conv, UserID: u, JoinSeq: join})
		}
		g.snap = snap
	}
	return g.snap, true
}

// Size returns how many users and groups the roster holds (tests,
// metrics).
func (r *Roster) Size() (users, groups int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.users), len(r.groups)
}
