package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
	"github.com/parley-im/parley/protocol/schema"
)

// rawConn is a minimal protocol client over a real WebSocket, used to test
// the server byte for byte without the SDK's retries and ordering.
type rawConn struct {
	t     testing.TB
	ws    *websocket.Conn
	hello protocol.Hello
	rid   atomic.Int64
	in    chan *protocol.Frame
	held  []*protocol.Frame // read while waiting for something else
	done  chan struct{}
	close *websocket.CloseError
	stop  chan struct{} // closed by pause: the reader stops reading the socket
}

func dialRaw(t testing.TB, srv *servertest.Server, user, device string) *rawConn {
	t.Helper()
	c, resp, err := dialRawErr(srv.URL, srv.Token(user), device)
	if err != nil {
		t.Fatalf("dial %s/%s: %v (resp %v)", user, device, err, resp)
	}
	return startRaw(t, c)
}

func dialRawErr(base, token, device string) (*websocket.Conn, *http.Response, error) {
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return websocket.DefaultDialer.DialContext(ctx, base+"/v1/ws?device="+device, h)
}

func startRaw(t testing.TB, ws *websocket.Conn) *rawConn {
	c := &rawConn{t: t, ws: ws, in: make(chan *protocol.Frame, 4096), done: make(chan struct{}), stop: make(chan struct{})}
	// Every frame is checked against the schema, and decoded, on
	// goroutines of their own: the reader only takes frames off the
	// socket, so that checking and decoding (slow under -race for large
	// bodies) never make this client a slow consumer the server would drop.
	check, checked := make(chan []byte, 1<<14), make(chan struct{})
	go func() {
		defer close(checked)
		for data := range check {
			if err := schema.ServerFrame(data); err != nil {
				t.Errorf("server frame %s does not match protocol/schema/frames.json: %v", data, err)
			}
		}
	}()
	raw := make(chan []byte, 1<<14)
	// quit is closed by the cleanup: frames nobody will read are dropped
	// then, so a test that left many unread never blocks its own cleanup.
	quit := make(chan struct{})
	paused := false // set by the reader before it closes raw
	go func() {
		defer close(c.done)
		defer close(check)
		defer func() {
			if !paused { // a paused client's channel stays open, empty
				close(c.in)
			}
		}()
		for data := range raw {
			check <- data
			var f protocol.Frame
			if err := json.Unmarshal(data, &f); err != nil {
				t.Errorf("server sent undecodable frame %q: %v", data, err)
				continue
			}
			select {
			case c.in <- &f:
			case <-quit:
			}
		}
	}()
	go func() {
		defer close(raw)
		for {
			select {
			case <-c.stop:
				paused = true
				return
			default:
			}
			_, data, err := ws.ReadMessage()
			if err != nil {
				if ce, ok := err.(*websocket.CloseError); ok {
					c.close = ce
				}
				return
			}
			raw <- data
		}
	}()
	f := c.next(protocol.TypeHello)
	c.hello = *f.Hello
	t.Cleanup(func() { _ = ws.Close(); close(quit); <-c.done; <-checked })
	return c
}

// pause stops reading from the socket (a client that hangs).
func (c *rawConn) pause() { close(c.stop) }

// next returns the next frame of type typ, skipping others.
func (c *rawConn) next(typ string) *protocol.Frame {
	c.t.Helper()
	for i, f := range c.held {
		if f.Type == typ {
			c.held = append(c.held[:i:i], c.held[i+1:]...)
			return f
		}
	}
	timeout := time.After(10 * time.Second)
	for {
		select {
		case f, ok := <-c.in:
			if !ok {
				c.t.Fatalf("connection closed (%v) while waiting for %s", c.close, typ)
			}
			if f.Type == typ {
				return f
			}
		case <-timeout:
			c.t.Fatalf("no %s frame within 10s", typ)
		}
	}
}

// nextTimeout is next with a caller-chosen timeout; nil when it passes.
func (c *rawConn) nextTimeout(typ string, d time.Duration) *protocol.Frame {
	for i, f := range c.held {
		if f.Type == typ {
			c.held = append(c.held[:i:i], c.held[i+1:]...)
			return f
		}
	}
	timeout := time.After(d)
	for {
		select {
		case f, ok := <-c.in:
			if !ok {
				return nil
			}
			if f.Type == typ {
				return f
			}
		case <-timeout:
			return nil
		}
	}
}

// callTimeout bounds the wait for one answer: longer than the server's own
// 10 s request timeout, so a slow request shows as the server's answer.
const callTimeout = 30 * time.Second

// call sends f with a fresh rid and returns the response with that rid.
func (c *rawConn) call(f protocol.Frame) *protocol.Frame {
	c.t.Helper()
	f.RID = strconv.FormatInt(c.rid.Add(1), 10)
	c.send(f)
	timeout := time.After(callTimeout)
	for {
		select {
		case r, ok := <-c.in:
			if !ok {
				c.t.Fatalf("connection closed (%v) while waiting for rid %s", c.close, f.RID)
			}
			if r.RID == f.RID {
				return r
			}
			c.held = append(c.held, r)
		case <-timeout:
			c.t.Fatalf("no response to %s rid %s within %v", f.Type, f.RID, callTimeout)
		}
	}
}

func (c *rawConn) send(f protocol.Frame) {
	c.t.Helper()
	data, err := json.Marshal(f)
	if err != nil {
		c.t.Fatal(err)
	}
	c.sendRaw(websocket.TextMessage, data)
}

func (c *rawConn) sendRaw(mt int, data []byte) {
	c.t.Helper()
	if err := c.ws.WriteMessage(mt, data); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// waitClose waits for the server to close the connection and returns the
// close code (0 if the TCP connection ended without a close frame).
func (c *rawConn) waitClose() int {
	c.t.Helper()
	for {
		select {
		case _, ok := <-c.in:
			if !ok {
				if c.close == nil {
					return 0
				}
				return c.close.Code
			}
		case <-time.After(10 * time.Second):
			c.t.Fatal("server did not close within 10s")
		}
	}
}

func mustOK(t testing.TB, f *protocol.Frame, want string) *protocol.Frame {
	t.Helper()
	if f.Type != want {
		t.Fatalf("got %s frame (code %s: %s), want %s", f.Type, f.Code, f.Error, want)
	}
	return f
}

func (c *rawConn) openDirect(peer string) uint64 {
	c.t.Helper()
	return mustOK(c.t, c.call(protocol.Frame{Type: protocol.TypeOpenDirect, Peer: peer}), protocol.TypeConv).Conv.ConvID
}

func (c *rawConn) sendText(conv uint64, cmid, body string) *protocol.Frame {
	c.t.Helper()
	return c.call(protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: cmid, Body: body})
}

func cmid(i int) string { return fmt.Sprintf("m-%d", i) }
