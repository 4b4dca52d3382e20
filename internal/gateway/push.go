package gateway

import (
	"runtime"
	"slices"
	"sync"
)

// Pushes go from the bus to the connections through one dispatcher
// goroutine. deliver frames the message once and queues it (blocking when
// pushQueueLen deliveries wait: backpressure on the bus, bounded memory);
// the dispatcher takes every delivery queued at that moment, up to
// maxBatch deliveries or a quarter of OutboundQueueBytes, and writes them.
// With no backlog that is one delivery and one write per connection, the
// lowest latency. When deliveries arrive faster than the
// node writes them, each connection gets all of its queued frames in one
// write: the cost per delivery falls as the load rises, instead of the
// backlog growing (what Centrifugo's writer does per connection; here it
// is per batch of deliveries, so nothing waits for a timer).
//
// Order: one dispatcher, and a batch is written completely before the
// next is taken, so a connection receives deliveries in the order the bus
// brought them; within a batch its frames are concatenated in that order.

const (
	pushQueueLen = 256
	maxBatch     = 64
)

// queued is one delivery waiting for the dispatcher.
type queued struct {
	m     *message
	users []string
}

// deliverChunk is the fewest recipients worth a goroutine of their own.
const deliverChunk = 1024

func (g *Gateway) dispatch() {
	defer g.sweeper.Done()
	var batch []queued
	// A batch also stops at a quarter of the outbound queue: it lands on
	// each connection in one write, and a backlog of the node's own (large
	// frames queued here while it was busy) must not count, all at once,
	// against a reader's slow-consumer bound.
	size, maxBytes := 0, g.cfg.OutboundQueueBytes/4
	for {
		select {
		case <-g.ctx.Done():
			return
		case q := <-g.pushes:
			batch = append(batch[:0], q)
			size = len(q.m.frame.b)
		}
	more:
		for len(batch) < maxBatch && size < maxBytes {
			select {
			case q := <-g.pushes:
				batch = append(batch, q)
				size += len(q.m.frame.b)
			default:
				break more
			}
		}
		g.writeBatch(batch)
		clear(batch)
	}
}

// writeBatch writes a batch of deliveries to their local recipients. When
// every delivery goes to the same users (a group's messages) the users are
// walked once with all the frames; otherwise frames are grouped per user
// first.
func (g *Gateway) writeBatch(batch []queued) {
	nowMS := g.now().UnixMilli()
	if len(batch) == 1 {
		ms := []*message{batch[0].m}
		g.spread(batch[0].users, func(us []string, buf []byte) []byte { return g.pushAll(us, ms, nowMS, buf) })
		return
	}
	same := true
	for _, q := range batch[1:] {
		if !slices.Equal(q.users, batch[0].users) {
			same = false
			break
		}
	}
	if same {
		ms := make([]*message, len(batch))
		for i, q := range batch {
			ms[i] = q.m
		}
		g.spread(batch[0].users, func(us []string, buf []byte) []byte { return g.pushAll(us, ms, nowMS, buf) })
		return
	}
	byUser := make(map[string][]*message)
	var users []string
	for _, q := range batch {
		for _, u := range q.users {
			l, ok := byUser[u]
			if !ok {
				users = append(users, u)
			}
			byUser[u] = append(l, q.m)
		}
	}
	g.spread(users, func(us []string, buf []byte) []byte {
		for _, u := range us {
			buf = g.pushUser(u, byUser[u], nowMS, buf)
		}
		return buf
	})
}

// spread runs f over users, split over the cores for a large delivery;
// each part has its own scratch buffer. It returns when all are done.
func (g *Gateway) spread(users []string, f func(us []string, buf []byte) []byte) {
	parts := min(runtime.GOMAXPROCS(0), len(users)/deliverChunk)
	if parts <= 1 {
		f(users, nil)
		return
	}
	var wg sync.WaitGroup
	per := (len(users) + parts - 1) / parts
	for len(users) > per {
		wg.Add(1)
		go func(us []string) {
			defer wg.Done()
			f(us, nil)
		}(users[:per])
		users = users[per:]
	}
	f(users, nil)
	wg.Wait()
}

// pushAll writes ms to every local session of users.
func (g *Gateway) pushAll(users []string, ms []*message, nowMS int64, buf []byte) []byte {
	for _, u := range users {
		buf = g.pushUser(u, ms, nowMS, buf)
	}
	return buf
}

// pushUser writes ms to every local session of user; buf is scratch space
// for concatenating frames, returned for reuse.
func (g *Gateway) pushUser(user string, ms []*message, nowMS int64, buf []byte) []byte {
	var arr [4]*session
	sh := g.shardOf(user)
	sh.mu.Lock()
	list := append(arr[:0], sh.users[user]...)
	sh.mu.Unlock()
	for i, s := range list {
		buf = s.push(ms, nowMS, buf)
		list[i] = nil
	}
	return buf
}
