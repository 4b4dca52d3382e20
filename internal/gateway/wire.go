package gateway

import (
	"encoding/binary"
	"net"

	"github.com/lesismal/nbio"
	"github.com/lesismal/nbio/nbhttp"
	"github.com/lesismal/nbio/nbhttp/websocket"
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
// underlying connection is a net.Conn that would block the pusher, so
// frames go through nbio's WriteMessage and its bounded asynchronous send
// queue instead, framed per connection.
type wsTransport struct {
	c   *websocket.Conn
	raw *nbio.Conn
}

func newWSTransport(c *websocket.Conn) wsTransport {
	return wsTransport{c: c, raw: eventLoopConn(c.UnderlayerConn())}
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
	return w.c.WriteMessage(websocket.TextMessage, f.payload())
}

// writeMany concatenates the frames into buf and writes them with one call
// on the event loop (nbio copies what the socket does not take, so buf can
// be reused at once); in blocking mode it queues them one by one.
func (w wsTransport) writeMany(ms []*message, buf []byte) ([]byte, error) {
	if w.raw == nil {
		for _, m := range ms {
			if err := w.c.WriteMessage(websocket.TextMessage, m.frame.payload()); err != nil {
				return buf, err
			}
		}
		return buf, nil
	}
	buf = buf[:0]
	for _, m := range ms {
		buf = append(buf, m.frame.b...)
	}
	_, err := w.raw.Write(buf)
	return buf, err
}

func (w wsTransport) close(code int, reason string) {
	if code != 0 {
		_ = w.c.WriteClose(code, reason)
	}
	_ = w.c.Close()
}
