package fanout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/parley-im/parley/internal/bus"
	"github.com/parley-im/parley/internal/ledger"
	"github.com/parley-im/parley/internal/registry"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// Push sends frame to every online device of users, one bus delivery per
// gateway node, and returns the number of users handed off. It is for
// frames without a seq (receipts, typing, notices): those are best effort,
// and a failure is only logged.
func (f *Fanout) Push(ctx context.Context, users []string, frame *protocol.Frame) int {
	n, err := f.push(ctx, users, frame, delivery{conv: frame.ConvID})
	if err != nil {
		f.log.Warn("push failed", "type", frame.Type, "conv", frame.ConvID, "err", err)
	}
	return n
}

// pushMessage pushes stored message m of a conversation in tier to
// recipients; rc, if not nil, collects the users whose node took it.
func (f *Fanout) pushMessage(ctx context.Context, recipients []string, m store.Message, tier uint8, rc *reached) (int, error) {
	wm := Wire(m)
	ack := AckPolicy(tier)
	return f.push(ctx, recipients, &protocol.Frame{Type: protocol.TypeMsg, Message: &wm, Ack: ack},
		delivery{conv: m.ConvID, seq: m.Seq, key: m.CoalesceKey, untracked: ack == protocol.AckNone, rc: rc})
}

// AckPolicy is the acknowledgement policy of a push in tier (the msg
// frame's ack): a large group's pushes are untracked (its devices fill
// gaps by seq and sync: online push only), a medium group's
// acknowledged in batches, the others promptly (delivered receipts).
func AckPolicy(tier uint8) string {
	switch tier {
	case TierLarge:
		return protocol.AckNone
	case TierMedium:
		return protocol.AckBatch
	}
	return ""
}

// delivery is what a push carries besides its frame: a message's
// conversation, seq and coalesce key (seq 0: no message), and the
// collector of the users reached.
type delivery struct {
	conv, seq uint64
	key       string
	untracked bool
	rc        *reached
}

// push encodes frame once and hands it to every gateway node that holds a
// device of users, the nodes concurrently. For a message (seq ≠ 0), a
// node that cannot be reached right now gets a compensation task, and an
// error is returned when the registry cannot be read or a task cannot be
// recorded, so the outbox retries; a node with no subscriber has gone, and
// its users resync on whichever node they reconnect to.
func (f *Fanout) push(ctx context.Context, users []string, frame *protocol.Frame, d delivery) (int, error) {
	if len(users) == 0 {
		return 0, nil
	}
	online, err := f.reg.Lookup(ctx, users)
	if err != nil {
		f.pushFailed()
		return 0, fmt.Errorf("registry lookup: %w", err)
	}
	if len(online) == 0 {
		return 0, nil
	}
	byNode := byNode(users, online)
	data, err := json.Marshal(frame)
	if err != nil {
		return 0, fmt.Errorf("encode push: %w", err)
	}
	var (
		n    int
		errs []error
	)
	if len(byNode) == 1 {
		for node, us := range byNode {
			n, err = f.publish(ctx, node, us, data, d)
			errs = append(errs, err)
		}
	} else {
		var (
			mu sync.Mutex
			wg sync.WaitGroup
		)
		for node, us := range byNode {
			wg.Go(func() {
				k, err := f.publish(ctx, node, us, data, d)
				mu.Lock()
				n += k
				errs = append(errs, err)
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	if f.obs.Pushed != nil {
		f.obs.Pushed(n)
	}
	return n, errors.Join(errs...)
}

// byNode groups users by the nodes of their devices, in the order of
// users, not of the map: a group's consecutive messages then reach a
// gateway with the same recipient list, which lets it write a backlog of
// them to each connection at once (gateway.writeBatch).
func byNode(users []string, online map[string][]registry.Entry) map[string][]string {
	out := make(map[string][]string, 1)
	for _, u := range users {
		for _, e := range online[u] {
			if l := out[e.Node]; len(l) == 0 || l[len(l)-1] != u {
				out[e.Node] = append(l, u)
			}
		}
	}
	return out
}

// groupLists are the node lists of a tracked group's online members, when
// the online index keeps them (cluster mode's roster).
func (f *Fanout) groupLists(cv store.Conversation, tier uint8) (map[string]*NodeList, bool) {
	if cv.Kind != store.Group || tier == TierSmall {
		return nil, false
	}
	ni, ok := f.online.(NodeIndex)
	if !ok {
		return nil, false
	}
	return ni.GroupNodes(cv.ID)
}

// pushGroup pushes stored message m of a tracked group as one delivery per
// gateway node with online members, each naming the node's list of them
// (bus.Group): no registry read, and a delivery's size does not grow with
// the members once the node holds its list. A node gets the list itself
// with the first delivery of each version, and again when it answers that
// it does not hold it (bus.ErrStale: it restarted or evicted it). A node
// that cannot take the delivery gets a compensation task with its users,
// as any push.
func (f *Fanout) pushGroup(ctx context.Context, lists map[string]*NodeList, m store.Message, tier uint8, rc *reached) (int, error) {
	if len(lists) == 0 {
		return 0, nil
	}
	wm := Wire(m)
	ack := AckPolicy(tier)
	data, err := json.Marshal(&protocol.Frame{Type: protocol.TypeMsg, Message: &wm, Ack: ack})
	if err != nil {
		return 0, fmt.Errorf("encode push: %w", err)
	}
	return f.pushGroupData(ctx, lists, data, delivery{conv: m.ConvID, seq: m.Seq, key: m.CoalesceKey, untracked: ack == protocol.AckNone, rc: rc})
}

// pushGroupData hands an encoded push to every node of lists (pushGroup).
func (f *Fanout) pushGroupData(ctx context.Context, lists map[string]*NodeList, data []byte, d delivery) (int, error) {
	if len(lists) == 0 {
		return 0, nil
	}
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		n    int
		errs []error
	)
	one := func(node string, l *NodeList) {
		k, err := f.publishGroup(ctx, node, l, data, d)
		mu.Lock()
		n += k
		errs = append(errs, err)
		mu.Unlock()
	}
	if len(lists) == 1 {
		for node, l := range lists {
			one(node, l)
		}
	} else {
		for node, l := range lists {
			wg.Go(func() { one(node, l) })
		}
		wg.Wait()
	}
	if f.obs.Pushed != nil {
		f.obs.Pushed(n)
	}
	return n, errors.Join(errs...)
}

// publishGroup hands data to node for its list l and returns how many
// users may see it there.
func (f *Fanout) publishGroup(ctx context.Context, node string, l *NodeList, data []byte, d delivery) (int, error) {
	g := &bus.Group{List: l.Version}
	if !l.Sent.Load() {
		g.Full, g.Members = true, l.Members
	}
	bd := bus.Delivery{Frame: data, ConvID: d.conv, Seq: d.seq, CoalesceKey: d.key, Untracked: d.untracked, Group: g}
	err := f.bus.Publish(ctx, node, bd)
	if errors.Is(err, bus.ErrStale) && !g.Full {
		l.Sent.Store(false)
		bd.Group = &bus.Group{List: l.Version, Full: true, Members: l.Members}
		err = f.bus.Publish(ctx, node, bd)
	}
	us := make([]string, 0, len(l.Members))
	for _, m := range l.Members {
		if m.JoinSeq <= d.seq {
			us = append(us, m.User)
		}
	}
	if err == nil {
		l.Sent.Store(true)
		d.rc.add(us)
		return len(us), nil
	}
	return 0, f.handoffFailed(ctx, node, us, d, err)
}

// publish hands data to node for us and returns how many users it took.
func (f *Fanout) publish(ctx context.Context, node string, us []string, data []byte, d delivery) (int, error) {
	err := f.bus.Publish(ctx, node, bus.Delivery{Users: us, Frame: data, ConvID: d.conv, Seq: d.seq, CoalesceKey: d.key, Untracked: d.untracked})
	if err == nil {
		d.rc.add(us)
		return len(us), nil
	}
	return 0, f.handoffFailed(ctx, node, us, d, err)
}

// handoffFailed handles a node that did not take a push for us: for a
// message, a compensation task (the ledger re-sends it with us), unless
// the node has gone.
func (f *Fanout) handoffFailed(ctx context.Context, node string, us []string, d delivery, err error) error {
	f.pushFailed()
	if d.seq == 0 || errors.Is(err, bus.ErrNoSubscriber) || len(us) == 0 {
		return nil
	}
	f.log.Warn("push hand-off failed; recorded for retry", "node", node, "err", err)
	if rerr := f.record(ctx, ledger.Task{Kind: ledger.KindPush, Conv: d.conv, Seq: d.seq, Users: us, Node: node}); rerr != nil {
		return fmt.Errorf("push to %s: %w; and the ledger: %w", node, err, rerr)
	}
	return nil
}

func (f *Fanout) pushFailed() {
	if f.obs.PushFailed != nil {
		f.obs.PushFailed()
	}
}
