package gateway

import (
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

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

	opened   time.Time    // for the close log
	lastSeen atomic.Int64 // unix ms of the last frame received
	// expiresMS is the token's exp (unix ms, 0: none), set before the
	// session is indexed; the sweeper closes the session once it passes.
	expiresMS int64
	// iatMS is the token's iat (unix ms, 0: none), which revocations
	// compare with (access.go).
	iatMS     int64
	closed    atomic.Bool
	closeCode atomic.Int32 // the code the server closed with, 0: not the server
	present   atomic.Bool  // counted by the presence tracker
	greeted   atomic.Bool  // the hello is out; pushes may follow
	// deadlineCleared: nbio arms its HTTP read deadline after registering
	// the connection, which can land after the upgrade cleared it; the
	// first frame clears it again (the sweeper owns idle timeouts).
	deadlineCleared atomic.Bool
	badFrames       atomic.Int32 // consecutive bad frames
	limitedRun      atomic.Int32 // consecutive requests refused rate_limited
	// requests is the connection's request budget (fair.go), allocated
	// on its first counted request.
	requests atomic.Pointer[bucket]
	// pipe holds the connection's pipelined sends (pipe.go), allocated
	// on its first send through a Batcher.
	pipe atomic.Pointer[sendPipe]

	mu struct {
		sync.Mutex
		// inflight are pushes not yet acknowledged by delivered, oldest
		// first; allocated on the first push so idle connections carry none.
		inflight []pending
	}
}

// message is a push encoded once for all its local recipients: the
// delivery's frame and what identifies it for acks and supersession.
type message struct {
	frame     *wireFrame
	conv, seq uint64
	key       string // coalesce key of a state update
	// untracked: written and forgotten (a large group's push), never
	// re-sent and never waiting for an ack.
	untracked bool
}

// pending is a push waiting for the device's delivered ack.
type pending struct {
	m      *message
	sentMS int64
	tries  int
}

// keepInflight is the capacity of an emptied inflight list that is kept
// for the next pushes instead of being given back: a connection receiving
// a steady stream would otherwise reallocate it after every ack.
const keepInflight = 8

// push writes the frames of ms (one write when the transport can take
// them together) and, for tracked messages (seq ≠ 0), tracks each until
// acked.
// nowMS is the delivery's time, read once per batch; buf is scratch space
// for concatenating frames, returned for reuse.
func (s *session) push(ms []*message, nowMS int64, buf []byte) []byte {
	if s.closed.Load() || !s.greeted.Load() {
		return buf
	}
	if len(ms) == 1 && (ms[0].seq == 0 || ms[0].untracked) {
		s.write(ms[0].frame)
		return buf
	}
	s.mu.Lock()
	for _, m := range ms {
		if m.seq == 0 || m.untracked {
			continue
		}
		if m.key != "" {
			s.supersedeLocked(m.conv, m.seq, m.key)
		}
		if len(s.mu.inflight) >= s.g.cfg.MaxInflight {
			// The oldest unacked push is left to the client's gap fill and
			// sync; keeping the bound protects the node's memory.
			copy(s.mu.inflight, s.mu.inflight[1:])
			s.mu.inflight[len(s.mu.inflight)-1] = pending{}
			s.mu.inflight = s.mu.inflight[:len(s.mu.inflight)-1]
			if s.g.obs.Drop != nil {
				s.g.obs.Drop("inflight_overflow")
			}
		}
		if s.mu.inflight == nil {
			s.mu.inflight = make([]pending, 0, keepInflight)
		}
		s.mu.inflight = append(s.mu.inflight, pending{m: m, sentMS: nowMS})
	}
	s.mu.Unlock()
	if len(ms) == 1 {
		s.write(ms[0].frame)
		return buf
	}
	buf, err := s.tr.writeMany(ms, buf)
	s.failed(err)
	return buf
}

// supersedeLocked drops unacked older states of (conv, key): a lagging
// device is re-sent only the latest state; the seqs it skips come back
// through gap fill as superseded stubs without bodies.
func (s *session) supersedeLocked(conv, seq uint64, key string) {
	kept := s.mu.inflight[:0]
	for _, p := range s.mu.inflight {
		if p.m.conv == conv && p.m.key == key && p.m.seq < seq {
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
	s.ackLocked(conv, seq)
}

// ackMany drops the tracked pushes every position covers.
func (s *session) ackMany(ps []protocol.Position) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range ps {
		s.ackLocked(p.ConvID, p.Seq)
	}
}

func (s *session) ackLocked(conv, seq uint64) {
	if len(s.mu.inflight) == 0 {
		return
	}
	var now time.Time
	if s.g.obs.Delivered != nil {
		now = s.g.now()
	}
	kept := s.mu.inflight[:0]
	for _, p := range s.mu.inflight {
		if p.m.conv == conv && p.m.seq <= seq {
			if s.g.obs.Delivered != nil {
				s.g.obs.Delivered(now.Sub(timeMS(p.sentMS)))
			}
			continue
		}
		kept = append(kept, p)
	}
	clear(s.mu.inflight[len(kept):])
	if len(kept) == 0 && cap(kept) > keepInflight {
		kept = nil // give a grown list back once everything is acked
	}
	s.mu.inflight = kept
}

// retransmit re-sends pushes sent before resendBefore and gives up on those
// re-sent RetransmitMax times (the device then catches up by sync).
//
// One sweep re-sends, oldest first, at most half of OutboundQueueBytes less
// what already waits in the transport (at least one frame when nothing
// waits); the others keep their time and tries and are due at the next
// sweep. Re-sending every unacked push at once (up to MaxInflight frames
// of up to max_body_bytes) would by itself pass the slow-consumer bound of
// a device that reads but has not acked yet, and drop it.
func (s *session) retransmit(resendBefore, nowMS int64) {
	s.mu.Lock()
	if len(s.mu.inflight) == 0 {
		s.mu.Unlock()
		return
	}
	waiting := 0
	if q, ok := s.tr.(interface{ backlog() int }); ok {
		waiting = q.backlog()
	}
	budget := s.g.cfg.OutboundQueueBytes/2 - waiting
	var resend []*wireFrame
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
		n := len(p.m.frame.b)
		if n > budget && (len(resend) > 0 || waiting > 0) {
			kept = append(kept, p) // due at the next sweep
			continue
		}
		budget -= n
		p.tries++
		p.sentMS = nowMS
		resend = append(resend, p.m.frame)
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
	s.write(newWireFrame(data))
}

// transport carries a session's frames: a WebSocket, or a long-poll
// mailbox for the HTTP fallback. Both never block the writer.
type transport interface {
	// write queues one frame; an error means the session is unusable.
	// The frame is shared: the transport must not modify it.
	write(f *wireFrame) error
	// writeMany queues the frames of ms in order, with one write when it
	// can; buf is scratch space it may use and returns.
	writeMany(ms []*message, buf []byte) ([]byte, error)
	// close ends the transport with a close code (WebSocket) or marks
	// the mailbox gone (poll).
	close(code int, reason string)
}

// write never blocks (see transport); a failed write drops the session,
// which is the slow-consumer policy when the queue is full.
func (s *session) write(f *wireFrame) { s.failed(s.tr.write(f)) }

func (s *session) failed(err error) {
	if err != nil && !s.closed.Load() {
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
	s.closeCode.Store(int32(code))
	s.tr.close(code, reason)
}

// Presence delivers a batch of presence changes (presence.Subscriber).
func (s *session) Presence(states []protocol.PresenceState) {
	s.writeFrame(&protocol.Frame{Type: protocol.TypePresence, States: states})
}
