package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	natsio "github.com/nats-io/nats.go"

	pnats "github.com/parley-im/parley/internal/bus/nats"
	"github.com/parley-im/parley/internal/store"
)

// Presence subjects: every node announces its local connects and
// disconnects; a node that starts asks the gateways for everyone online.
func subjectPresence(ns string) string     { return ns + ".presence" }
func subjectPresenceDump(ns string) string { return ns + ".presence.dump" }

// subjectMembers carries membership changes of tracked groups between
// chat processes, so every process's online index follows joins and
// leaves made by any of them.
func subjectMembers(ns string) string { return ns + ".members" }

// Tracker is what the relay feeds (the presence tracker and the
// online-member index, fanout.Online).
type Tracker interface {
	Connected(ctx context.Context, user string)
	Disconnected(user string)
	Joined(conv uint64, members []store.Member)
	Left(conv uint64, users []string)
}

type membersEvent struct {
	Node   string         `json:"n"`
	Conv   uint64         `json:"c"`
	Joined []store.Member `json:"j,omitempty"`
	Left   []string       `json:"l,omitempty"`
}

// Joined applies a join to this process's index and tells the others.
func (r *Relay) Joined(conv uint64, members []store.Member) {
	r.tracker.Joined(conv, members)
	r.announce(membersEvent{Node: r.node, Conv: conv, Joined: members})
}

// Left applies a leave to this process's index and tells the others.
func (r *Relay) Left(conv uint64, users []string) {
	r.tracker.Left(conv, users)
	r.announce(membersEvent{Node: r.node, Conv: conv, Left: users})
}

func (r *Relay) announce(ev membersEvent) {
	data, _ := json.Marshal(ev)
	if err := r.nc.Publish(subjectMembers(r.ns), data); err != nil {
		r.log.Warn("membership announce failed", "err", err)
	}
}

type presenceEvent struct {
	Node   string `json:"n"`
	User   string `json:"u"`
	Online bool   `json:"o"`
}

// Relay shares presence between processes over core NATS. A gateway calls
// Local for each connect and disconnect it sees (and feeds its own tracker
// directly); every process's tracker gets the other nodes' events. Events
// are at-most-once: a process that missed some resynchronises with Sync.
type Relay struct {
	nc      *natsio.Conn
	ns      string
	node    string
	tracker Tracker
	log     *slog.Logger
	resync  time.Duration
	shards  [relayShards]chan trackerOp

	mu struct {
		sync.Mutex
		local map[string]int // users with devices on this node (gateways)
		// remote counts devices per user announced by other nodes, per
		// node, so Sync can replace a node's view wholesale.
		remote map[string]map[string]int
		// events counts the events applied per node. Sync leaves alone a
		// node whose events arrived while it collected answers: its answer
		// (or its silence, for a node that just started) may predate them.
		events map[string]uint64
	}
}

// New returns a relay for node feeding tracker, resynchronising every
// resync.
func New(nc *natsio.Conn, ns, node string, tracker Tracker, resync time.Duration, log *slog.Logger) *Relay {
	r := &Relay{nc: nc, ns: ns, node: node, tracker: tracker, log: log, resync: resync}
	r.mu.local = make(map[string]int)
	r.mu.remote = make(map[string]map[string]int)
	r.mu.events = make(map[string]uint64)
	for i := range r.shards {
		r.shards[i] = make(chan trackerOp, 1024)
	}
	return r
}

// Local records a local device connecting (online) or leaving and
// announces it.
func (r *Relay) Local(user string, online bool) {
	r.mu.Lock()
	if online {
		r.mu.local[user]++
	} else if r.mu.local[user]--; r.mu.local[user] <= 0 {
		delete(r.mu.local, user)
	}
	r.mu.Unlock()
	data, _ := json.Marshal(presenceEvent{Node: r.node, User: user, Online: online})
	if err := r.nc.Publish(subjectPresence(r.ns), data); err != nil {
		r.log.Warn("presence announce failed", "err", err)
	}
}

// Run applies other nodes' events and answers dumps until ctx ends.
func (r *Relay) Run(ctx context.Context) error {
	var workers sync.WaitGroup
	defer workers.Wait()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	// The subscriptions' handlers: stopped and waited for after the
	// unsubscribes (deferred below), before the shard workers stop.
	var gate pnats.Gate
	defer gate.Close()
	for i := range r.shards {
		workers.Add(1)
		go func() { defer workers.Done(); r.work(wctx, r.shards[i]) }()
	}
	sub, err := r.nc.Subscribe(subjectPresence(r.ns), gate.Wrap(func(m *natsio.Msg) {
		var ev presenceEvent
		if json.Unmarshal(m.Data, &ev) != nil || ev.Node == r.node {
			return
		}
		r.apply(ctx, ev.Node, ev.User, ev.Online, true)
	}, nil))
	if err != nil {
		return fmt.Errorf("relay: presence: %w", err)
	}
	defer sub.Unsubscribe()
	members, err := r.nc.Subscribe(subjectMembers(r.ns), gate.Wrap(func(m *natsio.Msg) {
		var ev membersEvent
		if json.Unmarshal(m.Data, &ev) != nil || ev.Node == r.node {
			return
		}
		if len(ev.Joined) > 0 {
			r.tracker.Joined(ev.Conv, ev.Joined)
		}
		if len(ev.Left) > 0 {
			r.tracker.Left(ev.Conv, ev.Left)
		}
	}, nil))
	if err != nil {
		return fmt.Errorf("relay: presence: %w", err)
	}
	defer members.Unsubscribe()
	dump, err := r.nc.Subscribe(subjectPresenceDump(r.ns), gate.Wrap(func(m *natsio.Msg) {
		r.mu.Lock()
		users := make(map[string]int, len(r.mu.local))
		for u, n := range r.mu.local {
			users[u] = n
		}
		r.mu.Unlock()
		if len(users) == 0 {
			return
		}
		data, _ := json.Marshal(struct {
			Node  string         `json:"n"`
			Users map[string]int `json:"u"`
		}{r.node, users})
		_ = m.Respond(data)
	}, nil))
	if err != nil {
		return fmt.Errorf("relay: presence: %w", err)
	}
	defer dump.Unsubscribe()
	if err := r.nc.Flush(); err != nil {
		return fmt.Errorf("relay: presence: %w", err)
	}
	tick := time.NewTicker(r.resync)
	defer tick.Stop()
	for {
		r.Sync(ctx, 300*time.Millisecond)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func (r *Relay) apply(ctx context.Context, node, user string, online, event bool) {
	r.mu.Lock()
	if event {
		r.mu.events[node]++
	}
	devs := r.mu.remote[node]
	if devs == nil {
		devs = make(map[string]int)
		r.mu.remote[node] = devs
	}
	if online {
		devs[user]++
	} else if devs[user] > 0 {
		if devs[user]--; devs[user] == 0 {
			delete(devs, user)
		}
	} else {
		r.mu.Unlock()
		return // an offline event for a device we never saw
	}
	r.mu.Unlock()
	// The tracker may read the store on a connect (the user's groups):
	// hand it to the user's shard worker so one slow read does not hold up
	// every other user's presence, and one user's events stay in order.
	select {
	case r.shards[shardOf(user)] <- trackerOp{user: user, online: online}:
	case <-ctx.Done():
	}
}

// trackerOp is one presence change for a shard worker.
type trackerOp struct {
	user   string
	online bool
}

const relayShards = 16

func shardOf(user string) int {
	h := uint32(2166136261)
	for i := 0; i < len(user); i++ {
		h ^= uint32(user[i])
		h *= 16777619
	}
	return int(h % relayShards)
}

// work applies one shard's presence changes to the tracker in order.
func (r *Relay) work(ctx context.Context, ops <-chan trackerOp) {
	for {
		select {
		case <-ctx.Done():
			return
		case op := <-ops:
			if op.online {
				r.tracker.Connected(ctx, op.user)
			} else {
				r.tracker.Disconnected(op.user)
			}
		}
	}
}

// Sync asks every gateway for its online users (waiting up to wait for
// answers) and replaces the tracker's view of other nodes with theirs: a
// node that does not answer (it died without announcing its disconnects)
// loses its users; counts that drifted through lost events are corrected.
// A node whose events arrive while the answers are collected is left as
// its events made it: its answer, or its silence if it just started, may
// predate them.
func (r *Relay) Sync(ctx context.Context, wait time.Duration) {
	inbox := r.nc.NewRespInbox()
	answers := make(chan *natsio.Msg, 64)
	sub, err := r.nc.ChanSubscribe(inbox, answers)
	if err != nil {
		r.log.Warn("presence sync failed", "err", err)
		return
	}
	defer sub.Unsubscribe()
	r.mu.Lock()
	before := make(map[string]uint64, len(r.mu.events))
	for n, c := range r.mu.events {
		before[n] = c
	}
	r.mu.Unlock()
	if err := r.nc.PublishRequest(subjectPresenceDump(r.ns), inbox, nil); err != nil {
		r.log.Warn("presence sync failed", "err", err)
		return
	}
	views := make(map[string]map[string]int)
	timeout := time.After(wait)
collect:
	for {
		select {
		case <-ctx.Done():
			return
		case <-timeout:
			break collect
		case m := <-answers:
			var d struct {
				Node  string         `json:"n"`
				Users map[string]int `json:"u"`
			}
			if json.Unmarshal(m.Data, &d) == nil && d.Node != r.node {
				views[d.Node] = d.Users
			}
		}
	}
	r.mu.Lock()
	nodes := make(map[string]bool, len(r.mu.remote)+len(views))
	for n := range r.mu.remote {
		nodes[n] = true
	}
	for n := range views {
		nodes[n] = true
	}
	type change struct {
		node, user string
		delta      int
	}
	var changes []change
	for n := range nodes {
		if r.mu.events[n] != before[n] {
			continue // corrected by the next Sync
		}
		have, want := r.mu.remote[n], views[n]
		for u, c := range want {
			if d := c - have[u]; d != 0 {
				changes = append(changes, change{n, u, d})
			}
		}
		for u, c := range have {
			if _, ok := want[u]; !ok {
				changes = append(changes, change{n, u, -c})
			}
		}
	}
	r.mu.Unlock()
	for _, c := range changes {
		for i := 0; i < c.delta; i++ {
			r.apply(ctx, c.node, c.user, true, false)
		}
		for i := 0; i > c.delta; i-- {
			r.apply(ctx, c.node, c.user, false, false)
		}
	}
}
