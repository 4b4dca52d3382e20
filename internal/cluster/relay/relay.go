package relay

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	natsio "github.com/nats-io/nats.go"

	pnats "github.com/parley-im/parley/internal/bus/nats"
	"github.com/parley-im/parley/internal/store"
)

// Presence subjects. Every node announces its local connects and
// disconnects on <ns>.presence, numbered, and every resync interval a
// digest of its local users (count and hash) on the same subject, so a
// receiver sees a node's digest after every event it sums up. A receiver
// whose view of a node disagrees with the node's digest (it lost an event,
// or just started) asks that node for its list on <ns>.presence.list.<node>,
// which the node answers in chunks below the NATS max payload. So there are
// no periodic full dumps: a list crosses the network when a process starts
// or an event was lost, and never in one message that can exceed the
// payload limit.
func subjectPresence(ns string) string           { return ns + ".presence" }
func subjectPresenceList(ns, node string) string { return ns + ".presence.list." + node }

// subjectPresenceHello is sent by a starting process: every node answers
// with its digest at once instead of at its next interval.
func subjectPresenceHello(ns string) string { return ns + ".presence.hello" }

// subjectMembers carries membership changes of tracked groups between
// chat processes (best effort: a process trusts a group's entry only under
// the ownership epoch it built it in, fanout.Scoped).
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
	if len(data) > int(r.nc.MaxPayload()) {
		// A join of more users than one message holds: the other
		// processes rebuild the group from the store when they own it.
		r.log.Warn("membership announce too large; left to the owners' rebuild", "conv", ev.Conv, "bytes", len(data))
		return
	}
	if err := r.nc.Publish(subjectMembers(r.ns), data); err != nil {
		r.log.Warn("membership announce failed", "err", err)
	}
}

// presenceMsg is an event (User set) or a digest (Digest set) of a node.
type presenceMsg struct {
	Node string `json:"n"`
	// Inst tells a node's incarnations apart: a restarted node's numbers
	// start again.
	Inst uint64 `json:"i,string"`
	// Seq numbers the node's events: an event has the next number, a
	// digest the number of the last event it includes.
	Seq    uint64  `json:"s"`
	User   string  `json:"u,omitempty"`
	Online bool    `json:"o,omitempty"`
	Digest *digest `json:"d,omitempty"`
}

// digest sums up a set of users with their device counts: how many, and
// the XOR of a hash of each (user, count), kept up to date in O(1) per
// change.
type digest struct {
	Users int    `json:"c"`
	Hash  uint64 `json:"x,string"`
}

func entryHash(user string, devices int) uint64 {
	if devices <= 0 {
		return 0
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(user))
	x := h.Sum64() + uint64(devices)*0x9E3779B97F4A7C15
	// splitmix64 finaliser: spreads the count into every bit.
	x ^= x >> 30
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 27
	x *= 0x94D049BB133111EB
	return x ^ x>>31
}

// set changes user's count in m from its current value to n, keeping d.
func (d *digest) set(m map[string]int, user string, n int) {
	old := m[user]
	d.Hash ^= entryHash(user, old) ^ entryHash(user, n)
	switch {
	case old <= 0 && n > 0:
		d.Users++
	case old > 0 && n <= 0:
		d.Users--
	}
	if n > 0 {
		m[user] = n
	} else {
		delete(m, user)
	}
}

// listChunk is one message of a node's answer to a list request.
type listChunk struct {
	Node  string         `json:"n"`
	Inst  uint64         `json:"i,string"`
	Seq   uint64         `json:"s"` // the last event the list includes
	Index int            `json:"x"`
	Of    int            `json:"k"`
	Users map[string]int `json:"u"`
}

// view is what this process knows of another node's local users.
type view struct {
	inst    uint64
	seq     uint64 // the last event applied
	users   map[string]int
	dig     digest
	heard   time.Time // last message from the node
	fetchID uint64    // non-zero while a list request is out
	pending []presenceMsg
}

// Relay shares presence between processes over core NATS. A gateway calls
// Local for each connect and disconnect it sees (and feeds its own tracker
// directly); every process's tracker gets the other nodes' events. Events
// are at-most-once; digests reveal a lost one and the node's list repairs
// the view. A node silent for three resync intervals (it died without
// announcing its disconnects) loses its users.
type Relay struct {
	nc      *natsio.Conn
	ns      string
	node    string
	inst    uint64
	tracker Tracker
	log     *slog.Logger
	resync  time.Duration
	shards  [relayShards]chan trackerOp
	now     func() time.Time

	// local is this node's users; its publishes happen under the lock,
	// so events go out in Seq order.
	local struct {
		sync.Mutex
		users map[string]int
		dig   digest
		seq   uint64
	}
	// remote is the views of the other nodes. Tracker operations are
	// queued under it, so they reach the shard workers in the order the
	// views changed (workers never take it).
	remote struct {
		sync.Mutex
		nodes   map[string]*view
		fetches uint64
		closed  bool // Run is returning: no new fetches
	}
	fetchWG sync.WaitGroup
}

// New returns a relay for node feeding tracker, sending its digest every
// resync.
func New(nc *natsio.Conn, ns, node string, tracker Tracker, resync time.Duration, log *slog.Logger) *Relay {
	var b [8]byte
	_, _ = rand.Read(b[:])
	r := &Relay{nc: nc, ns: ns, node: node, inst: binary.LittleEndian.Uint64(b[:]) | 1, tracker: tracker, log: log,
		resync: resync, now: time.Now}
	r.local.users = make(map[string]int)
	r.remote.nodes = make(map[string]*view)
	for i := range r.shards {
		r.shards[i] = make(chan trackerOp, 1024)
	}
	return r
}

// Local records a local device connecting (online) or leaving and
// announces it.
func (r *Relay) Local(user string, online bool) {
	r.local.Lock()
	defer r.local.Unlock()
	n := r.local.users[user]
	if online {
		n++
	} else if n--; n < 0 {
		return // a disconnect without a connect
	}
	r.local.dig.set(r.local.users, user, n)
	r.local.seq++
	r.publishLocked(presenceMsg{User: user, Online: online})
}

// publishLocked sends m stamped with this node's identity and current
// seq; local held.
func (r *Relay) publishLocked(m presenceMsg) {
	m.Node, m.Inst, m.Seq = r.node, r.inst, r.local.seq
	data, _ := json.Marshal(m)
	if err := r.nc.Publish(subjectPresence(r.ns), data); err != nil {
		r.log.Warn("presence announce failed", "err", err)
	}
}

// Run applies other nodes' events, sends digests and answers list
// requests until ctx ends.
func (r *Relay) Run(ctx context.Context) error {
	var workers sync.WaitGroup
	defer workers.Wait()
	defer func() {
		r.remote.Lock()
		r.remote.closed = true
		r.remote.Unlock()
		r.fetchWG.Wait()
	}()
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
		var pm presenceMsg
		if json.Unmarshal(m.Data, &pm) != nil || pm.Node == r.node || pm.Node == "" {
			return
		}
		r.receive(wctx, pm)
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
	list, err := r.nc.Subscribe(subjectPresenceList(r.ns, r.node), gate.Wrap(func(m *natsio.Msg) { r.answerList(m.Reply) }, nil))
	if err != nil {
		return fmt.Errorf("relay: presence: %w", err)
	}
	defer list.Unsubscribe()
	hello, err := r.nc.Subscribe(subjectPresenceHello(r.ns), gate.Wrap(func(*natsio.Msg) { r.sendDigest() }, nil))
	if err != nil {
		return fmt.Errorf("relay: presence: %w", err)
	}
	defer hello.Unsubscribe()
	if err := r.nc.Publish(subjectPresenceHello(r.ns), nil); err != nil {
		return fmt.Errorf("relay: presence: %w", err)
	}
	if err := r.nc.Flush(); err != nil {
		return fmt.Errorf("relay: presence: %w", err)
	}
	tick := time.NewTicker(r.resync)
	defer tick.Stop()
	for {
		r.sendDigest()
		r.dropSilent(wctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// sendDigest announces this node's digest, if it ever had local users.
func (r *Relay) sendDigest() {
	r.local.Lock()
	defer r.local.Unlock()
	if r.local.seq == 0 {
		return
	}
	d := r.local.dig
	r.publishLocked(presenceMsg{Digest: &d})
}

// receive applies an event or checks a digest of another node.
func (r *Relay) receive(ctx context.Context, pm presenceMsg) {
	r.remote.Lock()
	defer r.remote.Unlock()
	v := r.remote.nodes[pm.Node]
	if v != nil && v.inst != pm.Inst {
		// The node restarted: its former devices are gone.
		r.dropLocked(ctx, pm.Node, v)
		v = nil
	}
	if v == nil {
		v = &view{inst: pm.Inst, users: make(map[string]int)}
		r.remote.nodes[pm.Node] = v
	}
	v.heard = r.now()
	if pm.Digest != nil {
		if (pm.Seq != v.seq || *pm.Digest != v.dig) && v.fetchID == 0 {
			r.fetchLocked(ctx, pm.Node, v)
		}
		return
	}
	v.seq = pm.Seq
	if v.fetchID != 0 {
		v.pending = append(v.pending, pm)
	}
	n := v.users[pm.User]
	if pm.Online {
		n++
	} else if n--; n < 0 {
		return // an offline event for a device never seen
	}
	v.dig.set(v.users, pm.User, n)
	r.queueLocked(ctx, pm.User, pm.Online)
}

// queueLocked hands a change to the user's shard worker (the tracker may
// read the store on a connect, so one slow read does not hold up other
// users); remote held, so changes reach a shard in order.
func (r *Relay) queueLocked(ctx context.Context, user string, online bool) {
	select {
	case r.shards[shardOf(user)] <- trackerOp{user: user, online: online}:
	case <-ctx.Done():
	}
}

// dropLocked forgets node's users; remote held.
func (r *Relay) dropLocked(ctx context.Context, node string, v *view) {
	for u, n := range v.users {
		for range n {
			r.queueLocked(ctx, u, false)
		}
	}
	delete(r.remote.nodes, node)
}

// dropSilent forgets the nodes not heard from for three resync intervals.
func (r *Relay) dropSilent(ctx context.Context) {
	r.remote.Lock()
	defer r.remote.Unlock()
	for node, v := range r.remote.nodes {
		if r.now().Sub(v.heard) > 3*r.resync {
			r.log.Info("presence: node silent; its users are offline", "node", node, "users", len(v.users))
			r.dropLocked(ctx, node, v)
		}
	}
}

// fetchLocked asks node for its list; remote held.
func (r *Relay) fetchLocked(ctx context.Context, node string, v *view) {
	if r.remote.closed {
		return
	}
	r.remote.fetches++
	id := r.remote.fetches
	v.fetchID, v.pending = id, nil
	r.fetchWG.Go(func() {
		chunks, err := r.requestList(ctx, node)
		r.remote.Lock()
		defer r.remote.Unlock()
		cur := r.remote.nodes[node]
		if cur == nil || cur.fetchID != id {
			return
		}
		cur.fetchID = 0
		pending := cur.pending
		cur.pending = nil
		if err != nil {
			r.log.Warn("presence: list of a node failed; retried on its next digest", "node", node, "err", err)
			return
		}
		if chunks[0].Inst != cur.inst {
			return // a restart: its events rebuild the view
		}
		r.replaceLocked(ctx, cur, chunks, pending)
	})
}

// requestList sends a list request to node and collects every chunk of
// the answer.
func (r *Relay) requestList(ctx context.Context, node string) ([]listChunk, error) {
	inbox := r.nc.NewRespInbox()
	msgs := make(chan *natsio.Msg, 64)
	sub, err := r.nc.ChanSubscribe(inbox, msgs)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := r.nc.PublishRequest(subjectPresenceList(r.ns, node), inbox, nil); err != nil {
		return nil, err
	}
	timeout := time.NewTimer(max(r.resync, 2*time.Second))
	defer timeout.Stop()
	var chunks []listChunk
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timeout.C:
			return nil, fmt.Errorf("%d of the list's chunks arrived in time", len(chunks))
		case m := <-msgs:
			var c listChunk
			if err := json.Unmarshal(m.Data, &c); err != nil {
				return nil, fmt.Errorf("list chunk: %w", err)
			}
			if len(chunks) > 0 && (c.Inst != chunks[0].Inst || c.Seq != chunks[0].Seq || c.Of != chunks[0].Of) {
				return nil, fmt.Errorf("list chunks of two answers")
			}
			chunks = append(chunks, c)
			if len(chunks) == c.Of {
				return chunks, nil
			}
		}
	}
}

// answerList sends this node's users to reply, in chunks that each fit
// in one NATS message.
func (r *Relay) answerList(reply string) {
	if reply == "" {
		return
	}
	r.local.Lock()
	users := make(map[string]int, len(r.local.users))
	for u, n := range r.local.users {
		users[u] = n
	}
	seq := r.local.seq
	r.local.Unlock()
	for _, c := range chunk(users, int(r.nc.MaxPayload())-1024) {
		c.Node, c.Inst, c.Seq = r.node, r.inst, seq
		data, _ := json.Marshal(c)
		if err := r.nc.Publish(reply, data); err != nil {
			r.log.Warn("presence: list answer failed", "err", err)
			return
		}
	}
}

// chunk splits users into chunks whose encoding stays under limit bytes
// (an entry costs its user id, its count and quoting; user ids are at
// most 64 bytes). Index and Of are set; an empty list is one chunk.
func chunk(users map[string]int, limit int) []listChunk {
	var out []listChunk
	cur := listChunk{Users: map[string]int{}}
	size := 200
	for u, n := range users {
		cost := len(u) + 16
		if size+cost > limit && len(cur.Users) > 0 {
			out = append(out, cur)
			cur, size = listChunk{Users: map[string]int{}}, 200
		}
		cur.Users[u] = n
		size += cost
	}
	out = append(out, cur)
	for i := range out {
		out[i].Index, out[i].Of = i, len(out)
	}
	return out
}

// replaceLocked makes v the node's list as of its seq plus the events
// that arrived after it, and hands the differences to the tracker;
// remote held.
func (r *Relay) replaceLocked(ctx context.Context, v *view, chunks []listChunk, pending []presenceMsg) {
	target := make(map[string]int)
	var dig digest
	for _, c := range chunks {
		for u, n := range c.Users {
			dig.set(target, u, n)
		}
	}
	snap := chunks[0].Seq
	for _, pm := range pending {
		if pm.Seq <= snap {
			continue // in the list already
		}
		n := target[pm.User]
		if pm.Online {
			n++
		} else if n--; n < 0 {
			continue
		}
		dig.set(target, pm.User, n)
	}
	changed := 0
	for u, want := range target {
		for have := v.users[u]; have < want; have++ {
			r.queueLocked(ctx, u, true)
			changed++
		}
		for have := v.users[u]; have > want; have-- {
			r.queueLocked(ctx, u, false)
			changed++
		}
	}
	for u, have := range v.users {
		if _, ok := target[u]; !ok {
			for range have {
				r.queueLocked(ctx, u, false)
				changed++
			}
		}
	}
	v.users, v.dig = target, dig
	v.seq = max(v.seq, snap)
	if changed > 0 {
		r.log.Debug("presence: view of a node repaired from its list", "users", len(target), "changes", changed)
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

// Views returns, per other node, how many users this process believes
// it has (tests).
func (r *Relay) Views() map[string]int {
	r.remote.Lock()
	defer r.remote.Unlock()
	out := make(map[string]int, len(r.remote.nodes))
	for n, v := range r.remote.nodes {
		out[n] = len(v.users)
	}
	return out
}
