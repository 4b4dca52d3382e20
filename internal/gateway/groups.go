package gateway

import (
	"sync"
	"time"

	"github.com/parley-im/parley/internal/bus"
)

// The node's group lists: for each group whose messages reach this node
// as one delivery per node (bus.Delivery.Group), the list of its members
// online here that the conversation's owner last sent, with their
// join_seq. A delivery names the version of the list it is for; the node
// writes it to the listed users whose join_seq is at or below its seq, or,
// holding another version (or none: the node restarted, evicted the list,
// or never received it), refuses it with bus.ErrStale and the owner sends
// it again with the list. So the node never guesses a group's members: a
// removal, a join or a member moving between nodes is a new version, and
// a version is either held whole or not used.
//
// A list unused for groupListIdle is dropped by the sweeper (a group that
// went quiet, or whose members left this node): memory follows the
// groups with recent traffic here.

const (
	groupShards   = 64
	groupListIdle = 10 * time.Minute
)

type groupShard struct {
	mu sync.Mutex
	m  map[uint64]*groupList
}

// groupList is one version of a group's members on this node; read-only
// once installed (a new version replaces the pointer).
type groupList struct {
	version string
	users   []string // the listed users
	joins   []uint64 // their join_seq, parallel to users
	maxJoin uint64
	usedMS  int64 // unix ms of the last delivery, under the shard's lock
}

func (g *Gateway) groupShard(conv uint64) *groupShard {
	x := conv * 0x9E3779B97F4A7C15 // Snowflake ids: mix before taking a shard
	return &g.groups[(x>>32)%groupShards]
}

// groupRecipients installs the list d carries, if any, and returns the
// users of d's group list that may see d's seq; bus.ErrStale if the node
// does not hold the version d names.
func (g *Gateway) groupRecipients(d bus.Delivery, nowMS int64) ([]string, error) {
	gr := d.Group
	sh := g.groupShard(d.ConvID)
	var l *groupList
	if gr.Full {
		l = &groupList{version: gr.List, users: make([]string, len(gr.Members)), joins: make([]uint64, len(gr.Members))}
		for i, m := range gr.Members {
			l.users[i], l.joins[i] = m.User, m.JoinSeq
			l.maxJoin = max(l.maxJoin, m.JoinSeq)
		}
	}
	sh.mu.Lock()
	if l != nil {
		sh.m[d.ConvID] = l
	} else if l = sh.m[d.ConvID]; l == nil || l.version != gr.List {
		sh.mu.Unlock()
		return nil, bus.ErrStale
	}
	l.usedMS = nowMS
	sh.mu.Unlock()
	if l.maxJoin <= d.Seq || d.Seq == 0 {
		return l.users, nil // shared: never modified
	}
	out := make([]string, 0, len(l.users))
	for i, u := range l.users {
		if l.joins[i] <= d.Seq {
			out = append(out, u)
		}
	}
	return out, nil
}

// sweepGroups drops the lists unused since beforeMS.
func (g *Gateway) sweepGroups(beforeMS int64) {
	for i := range g.groups {
		sh := &g.groups[i]
		sh.mu.Lock()
		for conv, l := range sh.m {
			if l.usedMS < beforeMS {
				delete(sh.m, conv)
			}
		}
		sh.mu.Unlock()
	}
}

// GroupLists returns how many group lists the node holds (metrics, tests).
func (g *Gateway) GroupLists() int {
	n := 0
	for i := range g.groups {
		sh := &g.groups[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}
