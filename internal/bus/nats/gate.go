package nats

import (
	"sync"

	natsio "github.com/nats-io/nats.go"
)

// Gate owns the message handlers of core NATS subscriptions, so that
// their owner can stop them: after Close no handler starts (a message
// that arrives late, already queued in the client, goes to the closed
// function instead, or nowhere), and Close returns once the running
// handlers have. NATS runs the handlers of one subscription on one
// goroutine, one message at a time, so the handlers a Gate owns run on
// at most one goroutine per subscription. The zero Gate is open.
type Gate struct {
	mu      sync.Mutex
	closed  bool // guarded by mu
	running sync.WaitGroup
}

// Wrap returns h run under the gate; closed (if not nil) answers the
// messages that arrive after Close.
func (g *Gate) Wrap(h natsio.MsgHandler, closed func(*natsio.Msg)) natsio.MsgHandler {
	return func(m *natsio.Msg) {
		g.mu.Lock()
		if g.closed {
			g.mu.Unlock()
			if closed != nil {
				closed(m)
			}
			return
		}
		g.running.Add(1)
		g.mu.Unlock()
		defer g.running.Done()
		h(m)
	}
}

// Close stops the gate and waits for the running handlers. It must not be
// called from a handler; calling it again waits again.
func (g *Gate) Close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.running.Wait()
}
