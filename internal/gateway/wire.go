package gateway

import (
	"encoding/binary"
	"net"

	"github.com/parley-im/parley/third_party/nbio"
	"github.com/parley-im/parley/third_party/nbio/nbhttp"
	"github.com/parley-im/parley/third_party/nbio/nbhttp/websocket"
)

// wireFrame is one server frame ready for the wire: the JSON payload framed
// as a single unfragmented, unmasked WebSocket text frame. Server frames
// carry no mask and no per-connection state, so the same bytes serve every
// recipient: a push is framed once per delivery and the bytes are shared by
// every local connection that receives it, re-sends included. Nothing
// writes to b after newWireFrame returns.
type wireFrame struct {
	b   []byte // header + payload
	hdr int    // header length: payload is b[hdr:]
}

func (f *wireFrame) payload() []byte { return f.b[f.hdr:] }

// wsHeaderLen is the header length of an unmasked frame of n payload bytes
// (RFC 6455 §5.2).
func wsHeaderLen(n int) int {
	switch {
	case n < 126:
		return 2
	case n <= 0xFFFF:
		return 4
	}
	return 10
}

// newWireFrame frames payload as a FIN text frame, copying it once.
func newWireFrame(payload []byte) *wireFrame {
	n := len(payload)
	h := wsHeaderLen(n)
	b := make([]byte, h+n)
	b[0] = 0x80 | byte(websocket.TextMessage) // FIN, no RSV bits, opcode 1
	switch h {
	case 2:
		b[1] = byte(n)
	case 4:
		b[1] = 126
		binary.BigEndian.PutUint16(b[2:], uint16(n))
	default:
		b[1] = 127
		binary.BigEndian.PutUint64(b[2:], uint64(n))
	}
	copy(b[h:], payload)
	return &wireFrame{b: b, hdr: h}
}

// wsTransport is a WebSocket connection.
//
// On the event loop (raw != nil) every data frame the session sends is one
// wireFrame written whole with one nbio.Conn.Write: that call holds the
// connection's lock, writes what the socket takes and copies the rest into
// the connection's pending buffer, in call order, and closes the connection
// once more than the engine's MaxWriteBufferSize is pending (the
// slow-consumer bound). Because each frame goes down in one call, frames
// never interleave; nbio's own control frames (pong, close) are single
// frames too. Bytes queued behind a slow reader are flushed together, so a
// backlog is coalesced into few writes.
//
// In blocking mode (race-detector builds serve with net/http) the
// underlying connection is a net.Conn whose Write would block the pusher,
// so the same shared frames go through a blockingWriter instead: a queue
// bounded by maxBytes (gateway.outbound_queue_bytes) and written by a
// goroutine of the connection.
type wsTransport struct {
	c   *websocket.Conn
	raw *nbio.Conn
	bw  *blockingWriter // blocking mode: raw == nil
}

func newWSTransport(c *websocket.Conn, maxBytes int) wsTransport {
	w := wsTransport{c: c, raw: eventLoopConn(c.UnderlayerConn())}
	if w.raw == nil {
		w.bw = newBlockingWriter(c.UnderlayerConn(), maxBytes)
	}
	return w
}

// eventLoopConn returns the event loop's connection under a WebSocket's
// transport (nbhttp wraps it while it parses HTTP), or nil when the
// connection is not on the event loop.
func eventLoopConn(c net.Conn) *nbio.Conn {
	switch v := c.(type) {
	case *nbio.Conn:
		return v
	case *nbhttp.Conn:
		raw, _ := v.Conn.(*nbio.Conn)
		return raw
	}
	return nil
}

func (w wsTransport) write(f *wireFrame) error {
	if w.raw != nil {
		_, err := w.raw.Write(f.b)
		return err
	}
	return w.bw.write(f)
}

// backlog is what waits to be written in blocking mode; on the event loop
// the gateway does not see nbio's pending buffer and reports 0.
func (w wsTransport) backlog() int {
	if w.bw == nil {
		return 0
	}
	return w.bw.backlog()
}

// writeMany concatenates the frames into buf and writes them with one call
// on the event loop (nbio copies what the socket does not take, so buf can
// be reused at once); in blocking mode it queues the shared frames.
func (w wsTransport) writeMany(ms []*message, buf []byte) ([]byte, error) {
	if w.raw == nil {
		return buf, w.bw.writeMany(ms)
	}
	buf = buf[:0]
	for _, m := range ms {
		buf = append(buf, m.frame.b...)
	}
	_, err := w.raw.Write(buf)
	return buf, err
}

func (w wsTransport) close(code int, reason string) {
	if w.bw != nil {
		// The close frame follows the queued frames; the read side ends
		// when the connection closes, which runs the gateway's onClose.
		w.bw.close(code, reason)
		return
	}
	if code != 0 {
		_ = w.c.WriteClose(code, reason)
	}
	_ = w.c.Close()
}
