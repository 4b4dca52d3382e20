package gateway

import (
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/parley-im/parley/third_party/nbio/nbhttp/websocket"
)

// blockingWriter is the write side of a WebSocket served in blocking mode
// (race-detector builds serve with net/http, a goroutine per connection;
// see internal/server). It is the counterpart of the event loop's pending
// buffer: write never blocks the caller (a fan-out worker, a delivery); it
// writes what the socket takes at once (writeNowLocked), queues the rest of
// the shared pre-framed bytes, and a goroutine of the connection,
// started only while there is something to write, writes them to the
// socket, coalescing a backlog into one writev. The queue is bounded in
// bytes by gateway.outbound_queue_bytes, counting the batch being written
// until the socket has taken it, as MaxWriteBufferSize does on the event
// loop: a write that would pass the bound fails, and the session drops the
// connection (slow-consumer policy).
//
// nbio's own queue for this mode (Upgrader.BlockingModAsyncWrite) is not
// used: it is bounded in frames, not bytes, and its length only goes back
// to zero once the writer has caught up completely, so a busy but healthy
// reader that never quite catches up reaches the bound and is dropped while
// a slow reader of large frames stays under it. With that queue off, nbio
// writes its own control frames (close replies, protocol errors, pongs)
// synchronously on the connection's read goroutine. Each frame, nbio's or
// ours, goes down in one Write (or one writev of whole frames) of the
// socket, which the runtime serialises, so frames never interleave.
type blockingWriter struct {
	conn net.Conn
	rc   syscall.RawConn // nil: every write goes through the goroutine
	max  int

	mu struct {
		sync.Mutex
		frames  []*wireFrame
		bytes   int  // of frames plus the batch being written
		writing bool // a flush goroutine runs
		closed  bool // nothing more is written or queued
		// closing: a close frame is queued; the connection is closed once
		// it is written (or after closeFlushTimeout).
		closing bool
	}
}

// errSlowConsumer is the write error of a connection whose queue is full.
var errSlowConsumer = errors.New("gateway: outbound queue over gateway.outbound_queue_bytes")

// closeFlushTimeout bounds how long a connection closed with a close frame
// stays open for the frames queued before it to drain.
const closeFlushTimeout = time.Second

func newBlockingWriter(conn net.Conn, maxBytes int) *blockingWriter {
	w := &blockingWriter{conn: conn, max: maxBytes}
	if sc, ok := conn.(syscall.Conn); ok {
		w.rc, _ = sc.SyscallConn()
	}
	return w
}

// writeNowLocked writes what the socket takes of frames at once, without
// waiting, when nothing is queued or being written (as nbio.Conn.Write does
// on the event loop), and returns how many frames went whole and how many
// bytes of the next one. So only what the socket refuses counts toward the
// bound, not what merely waits for the writer goroutine to be scheduled.
// The remainder of a partly written frame is queued first; every other
// frame on this socket (pongs included, see control) goes through w.
func (w *blockingWriter) writeNowLocked(frames []*wireFrame) (whole, part int) {
	if w.rc == nil || w.mu.writing || len(w.mu.frames) > 0 {
		return 0, 0
	}
	_ = w.rc.Write(func(fd uintptr) bool {
		for whole < len(frames) {
			b := frames[whole].b[part:]
			n, err := syscall.Write(int(fd), b)
			if n > 0 {
				part += n
			}
			if err != nil || n < len(b) {
				return true // socket full (EAGAIN) or failed: the goroutine takes over
			}
			whole, part = whole+1, 0
		}
		return true
	})
	return whole, part
}

// queueLocked queues frames[whole:], the first of them from byte part on.
func (w *blockingWriter) queueLocked(frames []*wireFrame, whole, part int) {
	for i := whole; i < len(frames); i++ {
		f := frames[i]
		if i == whole && part > 0 {
			f = &wireFrame{b: f.b[part:]}
		}
		w.enqueueLocked(f)
	}
}

// control queues a control frame (a pong) behind the data, outside the
// bound: it is small and answers the client.
func (w *blockingWriter) control(f *wireFrame) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.mu.closed || w.mu.closing {
		return
	}
	whole, part := w.writeNowLocked([]*wireFrame{f})
	w.queueLocked([]*wireFrame{f}, whole, part)
}

func (w *blockingWriter) write(f *wireFrame) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.mu.closed || w.mu.closing {
		return net.ErrClosed
	}
	one := []*wireFrame{f}
	whole, part := w.writeNowLocked(one)
	if whole == 1 {
		return nil
	}
	if w.mu.bytes+len(f.b)-part > w.max {
		return errSlowConsumer
	}
	w.queueLocked(one, whole, part)
	return nil
}

// writeMany queues the frames of ms in order, all or none.
func (w *blockingWriter) writeMany(ms []*message) error {
	frames := make([]*wireFrame, len(ms))
	for i, m := range ms {
		frames[i] = m.frame
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.mu.closed || w.mu.closing {
		return net.ErrClosed
	}
	whole, part := w.writeNowLocked(frames)
	n := -part
	for _, f := range frames[whole:] {
		n += len(f.b)
	}
	if n > 0 && w.mu.bytes+n > w.max {
		return errSlowConsumer
	}
	w.queueLocked(frames, whole, part)
	return nil
}

func (w *blockingWriter) enqueueLocked(f *wireFrame) {
	w.mu.frames = append(w.mu.frames, f)
	w.mu.bytes += len(f.b)
	if !w.mu.writing {
		w.mu.writing = true
		go w.flush()
	}
}

// flush writes queued frames until the queue is empty or the writer is
// closed; a write error closes the connection.
func (w *blockingWriter) flush() {
	var batch []*wireFrame
	var backing net.Buffers
	for {
		w.mu.Lock()
		if w.mu.closed || len(w.mu.frames) == 0 {
			w.mu.writing = false
			done := w.mu.closing && !w.mu.closed
			if done {
				w.mu.closed = true
			}
			w.mu.Unlock()
			if done {
				_ = w.conn.Close()
			}
			return
		}
		batch, w.mu.frames = w.mu.frames, batch[:0]
		w.mu.Unlock()

		bufs, n := backing[:0], 0
		for i, f := range batch {
			bufs = append(bufs, f.b)
			n += len(f.b)
			batch[i] = nil
		}
		backing = bufs
		_, err := bufs.WriteTo(w.conn)
		clear(backing)

		w.mu.Lock()
		w.mu.bytes -= n
		if err != nil {
			w.mu.closed, w.mu.writing = true, false
			w.mu.frames, w.mu.bytes = nil, 0
			w.mu.Unlock()
			_ = w.conn.Close()
			return
		}
		w.mu.Unlock()
	}
}

// backlog is the number of bytes waiting to be written.
func (w *blockingWriter) backlog() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mu.bytes
}

// close ends the connection. With code 0 it drops what is queued and
// closes at once (this also ends a write blocked on a reader that stopped
// reading). Otherwise a close frame follows the queued frames, and the
// connection is closed once it is written, or after closeFlushTimeout.
func (w *blockingWriter) close(code int, reason string) {
	w.mu.Lock()
	if w.mu.closed || w.mu.closing {
		w.mu.Unlock()
		return
	}
	if code == 0 {
		w.mu.closed = true
		w.mu.frames, w.mu.bytes = nil, 0
		w.mu.Unlock()
		_ = w.conn.Close()
		return
	}
	w.mu.closing = true
	w.enqueueLocked(newCloseFrame(code, reason))
	w.mu.Unlock()
	time.AfterFunc(closeFlushTimeout, func() {
		w.mu.Lock()
		w.mu.closed = true
		w.mu.frames, w.mu.bytes = nil, 0
		w.mu.Unlock()
		_ = w.conn.Close()
	})
}

// maxCloseReason is the longest close reason a control frame carries
// (RFC 6455 §5.5: 125 payload bytes, 2 of them the code).
const maxCloseReason = 123

// newCloseFrame frames a close control frame with code and reason (cut to
// maxCloseReason bytes).
func newCloseFrame(code int, reason string) *wireFrame {
	if len(reason) > maxCloseReason {
		reason = reason[:maxCloseReason]
	}
	b := make([]byte, 4+len(reason))
	b[0] = 0x80 | 0x8 // FIN, opcode close
	b[1] = byte(2 + len(reason))
	binary.BigEndian.PutUint16(b[2:], uint16(code))
	copy(b[4:], reason)
	return &wireFrame{b: b, hdr: 2}
}

// newControlFrame frames a control frame (payload at most 125 bytes, as a
// ping's is).
func newControlFrame(op websocket.MessageType, payload []byte) *wireFrame {
	payload = payload[:min(len(payload), 125)]
	b := make([]byte, 2+len(payload))
	b[0] = 0x80 | byte(op)
	b[1] = byte(len(payload))
	copy(b[2:], payload)
	return &wireFrame{b: b, hdr: 2}
}
