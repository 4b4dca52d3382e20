package gateway

import (
	"encoding/json"
	"sync"
	"sync/atomic"

	"github.com/lesismal/nbio/nbhttp/websocket"

	"github.com/parley-im/parley/protocol"
)

// session is one authenticated connection. Its fields after creation are
// read-only except those guarded by mu or atomic.
type session struct {
	g      *Gateway
	id     string
	user   string
	device string
	tr     transport

	lastSeen atomic.Int64 // unix ms of the last frame received
	closed   atomic.Bool
	present  atomic.Bool // counted by the presence tracker
	greeted  atomic.Bool // the hello is out; pushes may follow
	// deadlineCleared: nbio arms its HTTP read deadline after registering
	// the connection, which can land after the upgrade cleared it; the
	// first frame clears it again (the sweeper owns idle timeouts).
	deadlineCleared atomic.Bool
	badFrames       atomic.Int32 // consecutive bad frames

	mu struct {
		sync.Mutex
		// inflight are pushes not yet acknowledged by delivered, oldest
		// first; allocated on the first push so idle connections carry none.
		inflight []pending
	}
}

// pending is a push waiting for the device's delivered ack.
type pending struct {
	conv, seq uint64
	key       string // coalesce key of a state update
	frame     []byte
	sentMS    int64
	tries     int
}

// push writes a delivery frame and, for messages, tracks it until acked.
func (s *session) push(frame []byte, conv, seq uint64, key string) {
	if s.closed.Load() || !s.greeted.Load() {
		return
	}
	if seq != 0 {
		s.mu.Lock()
		if key != "" {
			s.supersedeLocked(conv, seq, key)
		}
		if len(s.mu.inflight) >= s.g.cfg.MaxInflight {
			// The oldest unacked push is left to the client's gap fill and
			// sync; keeping the bound protects the node's memory.
			s.mu.inflight[0] = pending{}
			s.mu.inflight = s.mu.inflight[1:]
			if s.g.obs.Drop != nil {
				s.g.obs.Drop("inflight_overflow")
			}
		}
		s.mu.inflight = append(s.mu.inflight, pending{conv: conv, seq: seq, key: key, frame: frame, sentMS: s.g.now().UnixMilli()})
		s.mu.Unlock()
	}
	s.write(frame)
}

// supersedeLocked drops unacked older states of (conv, key): a lagging
// device is re-sent only the latest state; the seqs it skips come back
// through gap fill as superseded stubs without bodies.
func (s *session) supersedeLocked(conv, seq uint64, key string) {
	kept := s.mu.inflight[:0]
	for _, p := range s.mu.inflight {
		if p.conv == conv && p.key == key && p.seq < seq {
			continue
		}
		kept = append(kept, p)
	}
	clear(s.mu.inflight[len(kept):])
	s.mu.inflight = kept
}

// ack drops tracked pushes of conv up to seq (delivered is cumulative).
func (s *session) ack(conv, seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := s.mu.inflight[:0]
	for _, p := range s.mu.inflight {
		if p.conv == conv && p.seq <= seq {
			if s.g.obs.Delivered != nil {
				s.g.obs.Delivered(s.g.now().Sub(timeMS(p.sentMS)))
			}
			continue
		}
		kept = append(kept, p)
	}
	clear(s.mu.inflight[len(kept):])
	if len(kept) == 0 {
		kept = nil // give the memory back once everything is acked
	}
	s.mu.inflight = kept
}

// retransmit re-sends pushes sent before resendBefore and gives up on those
// re-sent RetransmitMax times (the device then catches up by sync).
func (s *session) retransmit(resendBefore, nowMS int64) {
	s.mu.Lock()
	if len(s.mu.inflight) == 0 {
		s.mu.Unlock()
		return
	}
	var resend [][]byte
	kept := s.mu.inflight[:0]
	for _, p := range s.mu.inflight {
		if p.sentMS >= resendBefore {
			kept = append(kept, p)
			continue
		}
		if p.tries >= s.g.cfg.RetransmitMax {
			if s.g.obs.Drop != nil {
				s.g.obs.Drop("retransmit_exhausted")
			}
			continue
		}
		p.tries++
		p.sentMS = nowMS
		resend = append(resend, p.frame)
		kept = append(kept, p)
	}
	clear(s.mu.inflight[len(kept):])
	s.mu.inflight = kept
	s.mu.Unlock()
	for _, f := range resend {
		if s.g.obs.Retransmit != nil {
			s.g.obs.Retransmit()
		}
		s.write(f)
	}
}

var jsonMarshal = json.Marshal

func (s *session) writeFrame(f *protocol.Frame) {
	data, err := jsonMarshal(f)
	if err != nil {
		s.g.log.Error("encode frame", "type", f.Type, "err", err)
		return
	}
	s.write(data)
}

// transport carries a session's frames: a WebSocket, or a long-poll
// mailbox for the HTTP fallback. Both never block the writer.
type transport interface {
	// write queues one frame; an error means the session is unusable.
	write(data []byte) error
	// close ends the transport with a close code (WebSocket) or marks
	// the mailbox gone (poll).
	close(code int, reason string)
}

// write never blocks (see transport); a failed write drops the session,
// which is the slow-consumer policy when the queue is full.
func (s *session) write(data []byte) {
	if err := s.tr.write(data); err != nil && !s.closed.Load() {
		s.g.log.Debug("write failed; dropping session", "session", s.id, "err", err)
		if s.g.obs.Drop != nil {
			s.g.obs.Drop("slow_consumer")
		}
		s.close(0, "")
	}
}

// close ends the session once; code 0 drops it without a close frame.
func (s *session) close(code int, reason string) {
	if s.closed.Swap(true) {
		return
	}
	s.tr.close(code, reason)
}

// wsTransport is a WebSocket connection. nbio buffers what the socket does
// not take, up to the engine's MaxWriteBufferSize, and closes the
// connection beyond it.
type wsTransport struct{ c *websocket.Conn }

func (w wsTransport) write(data []byte) error {
	return w.c.WriteMessage(websocket.TextMessage, data)
}

func (w wsTransport) close(code int, reason string) {
	if code != 0 {
		_ = w.c.WriteClose(code, reason)
	}
	_ = w.c.Close()
}

// Presence delivers a batch of presence changes (presence.Subscriber).
func (s *session) Presence(states []protocol.PresenceState) {
	s.writeFrame(&protocol.Frame{Type: protocol.TypePresence, States: states})
}
