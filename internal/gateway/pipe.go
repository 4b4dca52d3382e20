package gateway

import (
	"context"
	"sync"

	"github.com/parley-im/parley/protocol"
)

// Batcher is a Backend that takes a connection's consecutive sends to one
// conversation as one request (the cluster's route.Remote, whose owner
// queues them in order into the conversation's next write). With one, a
// WebSocket connection's sends are pipelined: while a send is in flight
// the next ones to the same conversation wait on the gateway and go, in
// the order sent, as the next batch, so one sender is not held to one
// message per round trip to the owner and its durable write. Requests are
// still answered in the order sent: any other frame waits until the sends
// before it are answered.
type Batcher interface {
	// HandleBatch runs fs (sends to one conversation, in the order sent)
	// and answers each through reply, with its index, in that order.
	HandleBatch(ctx context.Context, c protocol.Caller, fs []*protocol.Frame, reply func(i int, f *protocol.Frame))
}

// maxPiped bounds the sends waiting on one connection behind the batch in
// flight; past it the connection's next frame waits (and TCP pushes back
// on the client).
const maxPiped = 64

// sendPipe holds one connection's pipelined sends; allocated on its first
// send, guarded by mu.
type sendPipe struct {
	mu   sync.Mutex
	busy bool   // a batch is in flight
	conv uint64 // the conversation of the batch in flight
	next []piped
	// idle is closed when the pipe empties (nil while it is empty).
	idle chan struct{}
}

type piped struct {
	f     *protocol.Frame
	reply func(*protocol.Frame)
}

// pipeOf returns s's pipe, creating it.
func (s *session) pipeOf() *sendPipe {
	if p := s.pipe.Load(); p != nil {
		return p
	}
	s.pipe.CompareAndSwap(nil, &sendPipe{})
	return s.pipe.Load()
}

// drained waits until s has no send in flight: every answer to a frame
// sent before is out.
func (s *session) drained() {
	p := s.pipe.Load()
	if p == nil {
		return
	}
	p.mu.Lock()
	idle := p.idle
	p.mu.Unlock()
	if idle != nil {
		<-idle
	}
}

// pipeSend queues send f of s behind the batch in flight, or starts a
// batch with it; a send to another conversation than the batch's, or past
// maxPiped, waits for the pipe to empty first.
func (g *Gateway) pipeSend(b Batcher, s *session, f *protocol.Frame, reply func(*protocol.Frame)) {
	p := s.pipeOf()
	for {
		p.mu.Lock()
		if !p.busy {
			p.busy, p.conv, p.idle = true, f.ConvID, make(chan struct{})
			p.mu.Unlock()
			g.pipes.Add(1)
			go g.runPipe(b, s, p, []piped{{f: f, reply: reply}})
			return
		}
		if p.conv == f.ConvID && len(p.next) < maxPiped {
			p.next = append(p.next, piped{f: f, reply: reply})
			p.mu.Unlock()
			return
		}
		idle := p.idle
		p.mu.Unlock()
		<-idle
	}
}

// runPipe sends batch, then each batch that queued meanwhile, until the
// pipe is empty.
func (g *Gateway) runPipe(b Batcher, s *session, p *sendPipe, batch []piped) {
	defer g.pipes.Done()
	c := protocol.Caller{User: s.user, Device: s.device}
	for {
		fs := make([]*protocol.Frame, len(batch))
		for i, q := range batch {
			fs[i] = q.f
		}
		b.HandleBatch(g.requestContext(), c, fs, func(i int, resp *protocol.Frame) {
			if resp.Type == protocol.TypeError && g.obs.Error != nil {
				g.obs.Error(resp.Code)
			}
			batch[i].reply(resp)
		})
		p.mu.Lock()
		if len(p.next) == 0 {
			p.busy = false
			close(p.idle)
			p.idle = nil
			p.mu.Unlock()
			return
		}
		batch, p.next = p.next, nil
		p.mu.Unlock()
	}
}
