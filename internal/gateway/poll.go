package gateway

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/protocol"
)

// The HTTP fallback for clients that cannot hold a WebSocket: a
// long-poll session is a session whose transport is a mailbox. GET /v1/poll
// opens one (answering the hello) or waits on it for frames; POST /v1/rpc
// runs one request frame and answers its response. Semantics are the
// WebSocket's: same frames, pushes, re-sends, idle timeout and slow-consumer
// bound. Polls of one session must reach the node that holds it.

var (
	errMailboxClosed = errors.New("gateway: poll session closed")
	errMailboxFull   = errors.New("gateway: poll mailbox full")
)

// mailbox holds a poll session's frames until the next poll takes them.
type mailbox struct {
	g     *Gateway
	s     *session
	ready chan struct{} // signalled (cap 1) when frames arrive or on close

	mu struct {
		sync.Mutex
		frames [][]byte
		size   int
		closed bool
	}
}

func (m *mailbox) write(f *wireFrame) error {
	data := f.payload()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mu.closed {
		return errMailboxClosed
	}
	if m.mu.size+len(data) > m.g.cfg.OutboundQueueBytes {
		return errMailboxFull
	}
	m.mu.frames = append(m.mu.frames, data)
	m.mu.size += len(data)
	m.signal()
	return nil
}

func (m *mailbox) writeMany(ms []*message, buf []byte) ([]byte, error) {
	for _, msg := range ms {
		if err := m.write(msg.frame); err != nil {
			return buf, err
		}
	}
	return buf, nil
}

// backlog is the size of the frames waiting for the next poll.
func (m *mailbox) backlog() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.size
}

func (m *mailbox) signal() {
	select {
	case m.ready <- struct{}{}:
	default:
	}
}

func (m *mailbox) close(int, string) {
	m.mu.Lock()
	m.mu.closed = true
	m.signal()
	m.mu.Unlock()
	m.g.polls.Delete(m.s.id)
	m.g.gone(m.s)
}

// take waits up to wait for frames and returns those queued, oldest first,
// up to budget bytes (at least one frame); the rest wait for the next poll.
func (m *mailbox) take(wait time.Duration, budget int) ([][]byte, bool) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		m.mu.Lock()
		if len(m.mu.frames) > 0 || m.mu.closed {
			n, size := 0, 0
			for n < len(m.mu.frames) && (n == 0 || size+len(m.mu.frames[n]) <= budget) {
				size += len(m.mu.frames[n])
				n++
			}
			out, closed := m.mu.frames[:n:n], m.mu.closed
			if n == len(m.mu.frames) {
				m.mu.frames, m.mu.size = nil, 0
			} else {
				m.mu.frames, m.mu.size = m.mu.frames[n:], m.mu.size-size
				m.signal() // more is ready for the next poll
			}
			m.mu.Unlock()
			return out, closed && n == 0
		}
		m.mu.Unlock()
		select {
		case <-m.ready:
		case <-deadline.C:
			return nil, false
		}
	}
}

// pollSession finds the live poll session named in the request.
func (g *Gateway) pollSession(id auth.Identity, r *http.Request) (*session, *mailbox) {
	sid := r.URL.Query().Get("session")
	v, ok := g.polls.Load(sid)
	if !ok {
		return nil, nil
	}
	m := v.(*mailbox)
	if m.s.user != id.User || m.s.device != r.URL.Query().Get("device") {
		return nil, nil
	}
	return m.s, m
}

// ServePoll serves GET /v1/poll?device=D[&session=S][&wait_ms=N].
func (g *Gateway) ServePoll(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("session") == "" {
		id, device, ok := g.admitRequest(w, r, true)
		if !ok {
			return
		}
		s := g.newSession(id.User, device, nil)
		s.expiresMS = expiresMS(id)
		s.iatMS = issuedMS(id)
		m := &mailbox{g: g, s: s, ready: make(chan struct{}, 1)}
		s.tr = m
		g.polls.Store(s.id, m)
		g.open(s)
		frames, _ := m.take(0, g.MaxHTTPAnswer())
		writeFrames(w, frames)
		return
	}
	id, reason := g.authenticate(w, r, g.now())
	if reason != "" || !g.Authorize(w, r, id, r.URL.Query().Get("device")) {
		return
	}
	s, m := g.pollSession(id, r)
	if s == nil {
		httpError(w, http.StatusNotFound, protocol.CodeNotFound, "poll session gone: open a new one and sync", 0)
		return
	}
	wait := g.cfg.HeartbeatInterval
	if v := r.URL.Query().Get("wait_ms"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 0 {
			httpError(w, http.StatusBadRequest, protocol.CodeInvalidArgument, "wait_ms must be a non-negative integer", 0)
			return
		}
		wait = min(time.Duration(ms)*time.Millisecond, wait)
	}
	s.lastSeen.Store(g.now().UnixMilli())
	frames, closed := m.take(wait, g.MaxHTTPAnswer())
	s.lastSeen.Store(g.now().UnixMilli())
	if closed && len(frames) == 0 {
		if r := g.refusal(s); r != nil {
			// Closed by a ban or revocation while waiting: say so, as the
			// WebSocket's close code does.
			refuse(w, r)
			return
		}
		httpError(w, http.StatusNotFound, protocol.CodeNotFound, "poll session gone: open a new one and sync", 0)
		return
	}
	writeFrames(w, frames)
}

func writeFrames(w http.ResponseWriter, frames [][]byte) {
	var b bytes.Buffer
	b.WriteString(`{"frames":[`)
	for i, f := range frames {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(f)
	}
	b.WriteString("]}\n")
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b.Bytes())
}

// discard is the transport of a one-off RPC caller without a poll session.
type discard struct{}

func (discard) write(*wireFrame) error                             { return nil }
func (discard) writeMany(_ []*message, buf []byte) ([]byte, error) { return buf, nil }
func (discard) close(int, string)                                  {}

// ServeRPC serves POST /v1/rpc?device=D[&session=S]: the body is one client
// frame, the answer its response frame (an ok frame when the request needs
// no answer).
func (g *Gateway) ServeRPC(w http.ResponseWriter, r *http.Request) {
	id, reason := g.authenticate(w, r, g.now())
	if reason != "" {
		return
	}
	device := r.URL.Query().Get("device")
	if !protocol.ValidID(device) || id.CheckDevice(device) != nil {
		httpError(w, http.StatusBadRequest, protocol.CodeInvalidArgument, "device missing, invalid, or not the token's", 0)
		return
	}
	if !g.Authorize(w, r, id, device) {
		return
	}
	if r.ContentLength > int64(g.cfg.Limits.MaxFrameBytes) {
		httpError(w, http.StatusRequestEntityTooLarge, protocol.CodeTooLarge, "frame over max_frame_bytes", 0)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, int64(g.cfg.Limits.MaxFrameBytes)+1))
	if err != nil {
		httpError(w, http.StatusBadRequest, protocol.CodeBadFrame, "cannot read body", 0)
		return
	}
	if len(body) > g.cfg.Limits.MaxFrameBytes {
		httpError(w, http.StatusRequestEntityTooLarge, protocol.CodeTooLarge, "frame over max_frame_bytes", 0)
		return
	}
	s, _ := g.pollSession(id, r)
	if s == nil {
		s = g.newSession(id.User, device, discard{})
		s.iatMS = issuedMS(id)
	} else {
		s.lastSeen.Store(g.now().UnixMilli())
	}
	var resp *protocol.Frame
	g.handleFrame(s, body, func(f *protocol.Frame) { resp = f }, false)
	if resp == nil {
		resp = &protocol.Frame{Type: protocol.TypeOK}
	}
	// History and sync answers come paged to the write buffer
	// (handleFrame, page.go).
	data, err := jsonMarshal(resp)
	if err != nil {
		httpError(w, http.StatusInternalServerError, protocol.CodeInternal, "encode", 0)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(data)
}
