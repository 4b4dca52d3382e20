package fanout

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/bus"
	"github.com/parley-im/parley/internal/ledger"
	"github.com/parley-im/parley/internal/presence"
	"github.com/parley-im/parley/internal/registry"
	"github.com/parley-im/parley/internal/store"
)

// placedDir is an in-memory presence directory that also tells the
// gateway nodes of each online user's devices, as cluster mode's relay
// does.
type placedDir struct {
	*presence.Local
	mu    sync.Mutex
	nodes map[string][]string
}

func newPlacedDir() *placedDir {
	return &placedDir{Local: presence.NewLocal(time.Hour, nil), nodes: make(map[string][]string)}
}

func (d *placedDir) connect(user, node string) {
	d.mu.Lock()
	d.nodes[user] = append(d.nodes[user], node)
	slices.Sort(d.nodes[user])
	d.mu.Unlock()
	d.Changed(context.Background(), user, true)
}

func (d *placedDir) disconnect(user, node string) {
	d.mu.Lock()
	if i := slices.Index(d.nodes[user], node); i >= 0 {
		d.nodes[user] = slices.Delete(d.nodes[user], i, i+1)
	}
	d.mu.Unlock()
	d.Changed(context.Background(), user, false)
}

func (d *placedDir) Placed(ctx context.Context, users []string) (map[string]presence.State, map[string][]string, error) {
	states, err := d.States(ctx, users)
	if err != nil {
		return nil, nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	where := make(map[string][]string)
	for _, u := range users {
		if states[u].Online && len(d.nodes[u]) > 0 {
			where[u] = slices.Clone(slices.Compact(slices.Clone(d.nodes[u])))
		}
	}
	return states, where, nil
}

// listNode is a gateway node's side of group deliveries, as the gateway
// keeps it: the last list per group, a delivery naming another refused
// with bus.ErrStale.
type listNode struct {
	mu    sync.Mutex
	lists map[uint64]bus.Group
	got   map[uint64][]string // seq → users written
	fulls int                 // deliveries that carried a list
}

func (n *listNode) handle(d bus.Delivery) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	users := d.Users
	if d.Group != nil {
		if d.Group.Full {
			n.lists[d.ConvID] = *d.Group
			n.fulls++
		}
		l, ok := n.lists[d.ConvID]
		if !ok || l.List != d.Group.List {
			return bus.ErrStale
		}
		users = nil
		for _, m := range l.Members {
			if m.JoinSeq <= d.Seq {
				users = append(users, m.User)
			}
		}
	}
	n.got[d.Seq] = append(n.got[d.Seq], users...)
	slices.Sort(n.got[d.Seq])
	return nil
}

func (n *listNode) users(seq uint64) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.got[seq])
}

func (n *listNode) restart() {
	n.mu.Lock()
	n.lists = make(map[uint64]bus.Group)
	n.mu.Unlock()
}

// countingRegistry counts the users looked up.
type countingRegistry struct {
	registry.Registry
	users atomic.Int64
}

func (c *countingRegistry) Lookup(ctx context.Context, users []string) (map[string][]registry.Entry, error) {
	c.users.Add(int64(len(users)))
	return c.Registry.Lookup(ctx, users)
}

// byNodeRig is a fan-out over a roster (cluster mode's online index) and
// three gateway nodes keeping group lists.
type byNodeRig struct {
	*fanRig
	dir   *placedDir
	ros   *Roster
	reg   *countingRegistry
	nodes map[string]*listNode
	f     *Fanout
}

var byNodeTiers = Tiers{SmallBelow: 3, LargeAbove: 100, Hysteresis: 0.1}

func newByNodeRig(t *testing.T) *byNodeRig {
	r := &byNodeRig{fanRig: newFanRig(t), dir: newPlacedDir(), nodes: make(map[string]*listNode)}
	r.ros = startRoster(t, r.dir)
	r.reg = &countingRegistry{Registry: r.fanRig.reg}
	for _, n := range []string{"n1", "n2", "n3"} {
		ln := &listNode{lists: make(map[uint64]bus.Group), got: make(map[uint64][]string)}
		r.nodes[n] = ln
		cancel, err := r.b.Subscribe(context.Background(), n, ln.handle)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cancel)
	}
	f, err := New(Config{}, Deps{Store: r.st, Registry: r.reg, Bus: r.b, Ledger: r.led, Online: r.ros, Tiers: byNodeTiers})
	if err != nil {
		t.Fatal(err)
	}
	r.f = f
	return r
}

func (r *byNodeRig) send(t *testing.T, conv uint64, leavers ...string) store.Message {
	t.Helper()
	m := r.append(t, conv, "a")
	if err := r.f.FanOut(context.Background(), Job{Msg: m, Leavers: leavers}); err != nil {
		t.Fatal(err)
	}
	return m
}

func (r *byNodeRig) want(t *testing.T, seq uint64, want map[string][]string) {
	t.Helper()
	for n, ln := range r.nodes {
		if got := ln.users(seq); !slices.Equal(got, want[n]) {
			t.Errorf("seq %d: node %s wrote to %v, want %v", seq, n, got, want[n])
		}
	}
}

// TestGroupPushByNode: a tracked group's message leaves as one delivery
// per gateway node with online members, with no registry read; a node
// gets its list with the first delivery of each version and only the
// version's name after it, so its deliveries do not grow with members.
func TestGroupPushByNode(t *testing.T) {
	r := newByNodeRig(t)
	r.conv(t, 1, store.Group, "a", "b", "c", "d", "e", "f")
	for u, n := range map[string]string{"a": "n1", "b": "n1", "c": "n2", "d": "n2", "e": "n3"} {
		r.dir.connect(u, n)
	}
	m1 := r.send(t, 1)
	r.want(t, m1.Seq, map[string][]string{"n1": {"a", "b"}, "n2": {"c", "d"}, "n3": {"e"}})
	m2 := r.send(t, 1)
	r.want(t, m2.Seq, map[string][]string{"n1": {"a", "b"}, "n2": {"c", "d"}, "n3": {"e"}})
	for n, ln := range r.nodes {
		if ln.fulls != 1 {
			t.Errorf("node %s got its list %d times, want once", n, ln.fulls)
		}
	}
	if n := r.reg.users.Load(); n != 0 {
		t.Fatalf("the group's messages looked up %d users in the registry, want none", n)
	}

	// f comes online on n3 and b's second device on n3: only n3's list
	// changes.
	r.dir.connect("f", "n3")
	r.dir.connect("b", "n3")
	waitFor(t, "f and b on n3", func() bool {
		lists, _ := r.ros.GroupNodes(1)
		return lists["n3"] != nil && len(lists["n3"].Members) == 3
	})
	m3 := r.send(t, 1)
	r.want(t, m3.Seq, map[string][]string{"n1": {"a", "b"}, "n2": {"c", "d"}, "n3": {"b", "e", "f"}})
	if r.nodes["n1"].fulls != 1 || r.nodes["n3"].fulls != 2 {
		t.Fatalf("lists sent: n1 %d, n3 %d times; want 1 and 2", r.nodes["n1"].fulls, r.nodes["n3"].fulls)
	}
	// A node that lost its lists (it restarted) refuses the next delivery
	// and gets it again with the list.
	r.nodes["n2"].restart()
	m4 := r.send(t, 1)
	r.want(t, m4.Seq, map[string][]string{"n1": {"a", "b"}, "n2": {"c", "d"}, "n3": {"b", "e", "f"}})
	if r.nodes["n2"].fulls != 2 {
		t.Fatalf("n2 got its list %d times after its restart, want 2", r.nodes["n2"].fulls)
	}
	// Every node gone from a group's online members gets nothing.
	r.dir.disconnect("c", "n2")
	r.dir.disconnect("d", "n2")
	waitFor(t, "n2 empty", func() bool { lists, _ := r.ros.GroupNodes(1); return lists["n2"] == nil })
	m5 := r.send(t, 1)
	r.want(t, m5.Seq, map[string][]string{"n1": {"a", "b"}, "n3": {"b", "e", "f"}})
	if n := r.reg.users.Load(); n != 0 {
		t.Fatalf("the group's messages looked up %d users in the registry, want none", n)
	}
}

// TestGroupPushHonoursMembership: a member who joins is written from its
// join_seq on, never before; members who leave receive the event of
// their leave and nothing after it, even when the next message is fanned
// out before the chat service tells the index (Job.Leavers).
func TestGroupPushHonoursMembership(t *testing.T) {
	r := newByNodeRig(t)
	r.conv(t, 2, store.Group, "a", "b", "c", "d")
	for u, n := range map[string]string{"a": "n1", "b": "n1", "c": "n2", "d": "n3"} {
		r.dir.connect(u, n)
	}
	m1 := r.send(t, 2)
	r.want(t, m1.Seq, map[string][]string{"n1": {"a", "b"}, "n2": {"c"}, "n3": {"d"}})

	// z joins at a seq above the message in flight: that message, fanned
	// out after the join reached the index, is not written to z.
	r.dir.connect("z", "n2")
	r.ros.Joined(2, []store.Member{{ConvID: 2, UserID: "z", JoinSeq: m1.Seq + 2}})
	waitFor(t, "z indexed", func() bool { lists, _ := r.ros.GroupNodes(2); return len(lists["n2"].Members) == 2 })
	m2 := r.send(t, 2)
	r.want(t, m2.Seq, map[string][]string{"n1": {"a", "b"}, "n2": {"c"}, "n3": {"d"}})
	m3 := r.send(t, 2)
	r.want(t, m3.Seq, map[string][]string{"n1": {"a", "b"}, "n2": {"c", "z"}, "n3": {"d"}})

	// b and d are removed: the event reaches them, the next message not.
	ev := r.send(t, 2, "b", "d")
	r.want(t, ev.Seq, map[string][]string{"n1": {"a", "b"}, "n2": {"c", "z"}, "n3": {"d"}})
	m4 := r.send(t, 2)
	r.want(t, m4.Seq, map[string][]string{"n1": {"a"}, "n2": {"c", "z"}})

	// A removed member's new session is not indexed again.
	r.dir.connect("b", "n2")
	r.dir.connect("d", "n3")
	time.Sleep(50 * time.Millisecond) // the roster's reads of b and d, if any
	m5 := r.send(t, 2)
	r.want(t, m5.Seq, map[string][]string{"n1": {"a"}, "n2": {"c", "z"}})
}

// TestGroupPushFailedNode: a node that fails a group delivery (not a
// refusal of its list) gets a compensation task naming its users, and the
// ledger's retry writes the message to them.
func TestGroupPushFailedNode(t *testing.T) {
	r := newByNodeRig(t)
	r.conv(t, 3, store.Group, "a", "b", "c")
	r.dir.connect("a", "n1")
	r.dir.connect("b", "n1")
	r.dir.connect("c", "n2")
	failing := &failingBus{Bus: r.b, node: "n2"}
	led := &recordingLedger{}
	f, err := New(Config{}, Deps{Store: r.st, Registry: r.reg, Bus: failing, Ledger: led, Online: r.ros, Tiers: byNodeTiers})
	if err != nil {
		t.Fatal(err)
	}
	m := r.append(t, 3, "a")
	if err := f.FanOut(context.Background(), Job{Msg: m}); err != nil {
		t.Fatal(err)
	}
	r.want(t, m.Seq, map[string][]string{"n1": {"a", "b"}})
	if len(led.tasks) != 1 || led.tasks[0].Node != "n2" || !slices.Equal(led.tasks[0].Users, []string{"c"}) || led.tasks[0].Seq != m.Seq {
		t.Fatalf("tasks %+v, want one push of seq %d to n2 for c", led.tasks, m.Seq)
	}
	failing.node = ""
	if err := f.Compensate(context.Background(), led.tasks[0]); err != nil {
		t.Fatal(err)
	}
	r.want(t, m.Seq, map[string][]string{"n1": {"a", "b"}, "n2": {"c"}})
}

type failingBus struct {
	bus.Bus
	node string
}

func (b *failingBus) Publish(ctx context.Context, node string, d bus.Delivery) error {
	if node == b.node {
		return errors.New("no ack")
	}
	return b.Bus.Publish(ctx, node, d)
}

type recordingLedger struct {
	mu    sync.Mutex
	tasks []ledger.Task
}

func (l *recordingLedger) Record(_ context.Context, t ledger.Task) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tasks = append(l.tasks, t)
	return nil
}
