package e2e

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/gateway"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// Tests of the edge (docs/protocol.md, "Before authentication"): what a
// client without credentials can make a node hold, and how a node answers
// when it is full. The exact answers (408, JSON bodies) come from the
// event loop's parser; race builds serve on net/http, so those checks run
// in the non-race pass of scripts/test.sh.

func nbioOnly(t *testing.T) {
	t.Helper()
	if raceBuild {
		t.Skip("the event loop's HTTP parser only runs without -race; scripts/test.sh runs e2e again without it")
	}
}

// rawHTTP opens a TCP connection to the node.
func rawHTTP(t *testing.T, srv *servertest.Server) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", srv.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// readAnswer reads one HTTP response from c, allowing wait for it.
func readAnswer(t *testing.T, c net.Conn, wait time.Duration) (*http.Response, map[string]any) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(wait))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no HTTP answer: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var m map[string]any
	_ = json.Unmarshal(body, &m)
	return resp, m
}

func TestEdgeHeadOverLimitAnswers431(t *testing.T) {
	nbioOnly(t)
	srv := servertest.Start(t)
	t.Run("endless header", func(t *testing.T) {
		c := rawHTTP(t, srv)
		_, _ = io.WriteString(c, "GET /v1/ws?device=d HTTP/1.1\r\nHost: x\r\nX-Long: ")
		chunk := bytes.Repeat([]byte("a"), 4096)
		// Keep streaming until the node answers; it must not wait for more
		// than its 16 KiB bound (plus one read).
		go func() {
			for i := 0; i < 64; i++ {
				if _, err := c.Write(chunk); err != nil {
					return
				}
			}
		}()
		resp, body := readAnswer(t, c, 10*time.Second)
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || body["code"] != string(protocol.CodeTooLarge) {
			t.Fatalf("got %d %v, want 431 too_large", resp.StatusCode, body)
		}
	})
	t.Run("request line", func(t *testing.T) {
		c := rawHTTP(t, srv)
		_, _ = fmt.Fprintf(c, "GET /v1/ws?device=%s HTTP/1.1\r\nHost: x\r\n\r\n", strings.Repeat("d", 20<<10))
		resp, _ := readAnswer(t, c, 10*time.Second)
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("got %d, want 431", resp.StatusCode)
		}
	})
}

func TestEdgeBodyOverLimitAnswers413BeforeReadingIt(t *testing.T) {
	nbioOnly(t)
	srv := servertest.Start(t)
	c := rawHTTP(t, srv)
	// No token, a 60 MiB body announced and not sent: the answer must come
	// from the Content-Length alone.
	_, _ = io.WriteString(c, "POST /v1/rpc?device=d HTTP/1.1\r\nHost: x\r\nContent-Length: 62914560\r\n\r\n")
	resp, body := readAnswer(t, c, 10*time.Second)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || body["code"] != string(protocol.CodeTooLarge) {
		t.Fatalf("got %d %v, want 413 too_large", resp.StatusCode, body)
	}
	t.Run("chunked", func(t *testing.T) {
		c := rawHTTP(t, srv)
		_, _ = io.WriteString(c, "POST /v1/rpc?device=d HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3c00000\r\n")
		resp, _ := readAnswer(t, c, 10*time.Second)
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("got %d, want 413", resp.StatusCode)
		}
	})
}

func TestEdgeSlowRequestsAnswer408(t *testing.T) {
	nbioOnly(t)
	srv := servertest.Start(t, servertest.WithGateway(func(c *gateway.Config) {
		c.HeaderTimeout = time.Second
		c.BodyTimeout = time.Second
	}))
	for _, tc := range []struct{ name, partial string }{
		{"head", "GET /v1/ws?device=d HTTP/1.1\r\nHost: x\r\nX-Slow: a"},
		{"body", "POST /v1/rpc?device=d HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"type\":"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := rawHTTP(t, srv)
			start := time.Now()
			_, _ = io.WriteString(c, tc.partial)
			resp, body := readAnswer(t, c, 30*time.Second)
			if resp.StatusCode != http.StatusRequestTimeout || body["code"] != string(protocol.CodeTimeout) {
				t.Fatalf("got %d %v, want 408 timeout", resp.StatusCode, body)
			}
			if el := time.Since(start); el < 900*time.Millisecond {
				t.Fatalf("answered after %v, before the 1s timeout", el)
			}
		})
	}
	t.Run("idle connection closes silently", func(t *testing.T) {
		c := rawHTTP(t, srv)
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		n, err := c.Read(make([]byte, 1))
		if err == nil || n != 0 {
			t.Fatalf("read %d bytes, err %v; want EOF", n, err)
		}
	})
}

// TestEdgePartialHandshakesCountTowardCap holds more partial handshakes
// than the node's cap: a real client then gets 503 + Retry-After (an HTTP
// answer, not a refused or reset connection), and is admitted once they
// are gone.
func TestEdgePartialHandshakesCountTowardCap(t *testing.T) {
	nbioOnly(t)
	srv := servertest.Start(t, servertest.WithGateway(func(c *gateway.Config) {
		c.MaxConnections = 50
		c.HeaderTimeout = time.Minute
	}))
	var partials []net.Conn
	for i := 0; i < 120; i++ {
		c := rawHTTP(t, srv)
		_, _ = io.WriteString(c, "GET /v1/ws?device=d HTTP/1.1\r\nHost: x\r\n")
		partials = append(partials, c)
	}
	waitFor(t, func() bool { return srv.Gateway().Pending() >= 120 })
	_, resp, err := dialRawErr(srv.URL, srv.Token("alice"), "phone")
	if err == nil || resp == nil {
		t.Fatalf("dial over the cap: err %v, resp %v; want a 503 answer", err, resp)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("over the cap: %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	for _, c := range partials {
		_ = c.Close()
	}
	waitFor(t, func() bool { return srv.Gateway().Pending() == 0 })
	c := dialRaw(t, srv, "alice", "phone")
	c.ws.Close()
}

// TestEdgeBadTokensSpendNoBudget: with a handshake budget of 2, a flood of
// handshakes without a valid token gets 401 each and leaves the budget to
// the valid client.
func TestEdgeBadTokensSpendNoBudget(t *testing.T) {
	srv := servertest.Start(t, servertest.WithGateway(func(c *gateway.Config) {
		c.HandshakeRate = 0.01
		c.HandshakeBurst = 2
	}))
	for i := 0; i < 50; i++ {
		tok := ""
		if i%2 == 1 {
			tok = "not.a.token"
		}
		_, resp, err := dialRawErr(srv.URL, tok, "phone")
		if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("handshake %d without a valid token: %v, want 401", i, resp)
		}
	}
	c := dialRaw(t, srv, "alice", "phone")
	c.ws.Close()
}

// wsRaw is a WebSocket spoken byte by byte, to send what no library
// would: unmasked frames, reserved bits and opcodes, lengths with the top
// bit set.
type wsRaw struct {
	c net.Conn
	r *bufio.Reader
}

func dialWSRaw(t *testing.T, srv *servertest.Server, user string) *wsRaw {
	t.Helper()
	c := rawHTTP(t, srv)
	_, _ = fmt.Fprintf(c, "GET /v1/ws?device=raw&token=%s HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", srv.Token(user))
	w := &wsRaw{c: c, r: bufio.NewReader(c)}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(w.r, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	if op, _ := w.next(t); op != 1 {
		t.Fatalf("first frame opcode %d, want the hello (text)", op)
	}
	return w
}

// frame encodes one client frame: masked unless unmasked is set.
func frame(b0 byte, payload []byte, unmasked bool) []byte {
	var out []byte
	maskBit := byte(0x80)
	if unmasked {
		maskBit = 0
	}
	switch n := len(payload); {
	case n < 126:
		out = []byte{b0, maskBit | byte(n)}
	case n < 65536:
		out = []byte{b0, maskBit | 126, byte(n >> 8), byte(n)}
	default:
		out = []byte{b0, maskBit | 127}
		out = binary.BigEndian.AppendUint64(out, uint64(n))
	}
	if unmasked {
		return append(out, payload...)
	}
	key := []byte{1, 2, 3, 4}
	out = append(out, key...)
	for i, b := range payload {
		out = append(out, b^key[i%4])
	}
	return out
}

// next reads one server frame.
func (w *wsRaw) next(t *testing.T) (byte, []byte) {
	t.Helper()
	_ = w.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var h [2]byte
	if _, err := io.ReadFull(w.r, h[:]); err != nil {
		return 0, nil
	}
	n := int(h[1] & 0x7F)
	switch n {
	case 126:
		var b [2]byte
		_, _ = io.ReadFull(w.r, b[:])
		n = int(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		_, _ = io.ReadFull(w.r, b[:])
		n = int(binary.BigEndian.Uint64(b[:]))
	}
	p := make([]byte, n)
	_, _ = io.ReadFull(w.r, p)
	return h[0] & 0x0F, p
}

// closeCode reads frames until the server's close frame and returns its
// code (0 if the connection ended without one), skipping text frames.
func (w *wsRaw) closeCode(t *testing.T) (int, []string) {
	t.Helper()
	var texts []string
	for {
		op, p := w.next(t)
		switch op {
		case 0:
			return 0, texts
		case 8:
			if len(p) < 2 {
				return 1005, texts
			}
			return int(binary.BigEndian.Uint16(p)), texts
		case 1:
			texts = append(texts, string(p))
		}
	}
}

// TestEdgeWebSocketFailures sends the frames RFC 6455 says must fail the
// connection to the real endpoint (Autobahn's must-fail cases, which an
// echo-less endpoint can answer): each gets a close frame with the right
// code, never a silent TCP drop.
func TestEdgeWebSocketFailures(t *testing.T) {
	nbioOnly(t)
	srv := servertest.Start(t)
	ping := frame(0x89, nil, false)
	huge := []byte{0x81, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4}
	for _, tc := range []struct {
		name string
		send []byte
		code int
	}{
		{"unmasked text", frame(0x81, []byte(`{"type":"ping"}`), true), 1002},
		{"RSV1 set", frame(0xC1, []byte(`{"type":"ping"}`), false), 1002},
		{"RSV2 set", frame(0xA1, []byte(`{"type":"ping"}`), false), 1002},
		{"reserved data opcode 3", frame(0x83, nil, false), 1002},
		{"reserved control opcode 11", frame(0x8B, nil, false), 1002},
		{"fragmented ping", frame(0x09, []byte("a"), false), 1002},
		{"orphan continuation", frame(0x80, []byte("a"), false), 1002},
		{"text inside a fragmented message", append(frame(0x01, []byte(`{"type"`), false), frame(0x81, []byte("x"), false)...), 1002},
		{"ping over 125 bytes", frame(0x89, bytes.Repeat([]byte("a"), 126), false), 1002},
		{"invalid UTF-8", frame(0x81, []byte{'"', 0xC0, 0xAF, '"'}, false), 1007},
		{"invalid UTF-8 in a first fragment", frame(0x01, []byte{'"', 0xED, 0xA0, 0x80}, false), 1007},
		{"length with the top bit set", huge, 1002},
		{"message over max_frame_bytes", frame(0x81, bytes.Repeat([]byte("a"), 70000), false), 1009},
		{"binary", frame(0x82, []byte("a"), false), 1003},
		{"close with code 1005", frame(0x88, []byte{0x03, 0xED}, false), 1002},
		{"close with a 1-byte payload", frame(0x88, []byte{0x03}, false), 1002},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := dialWSRaw(t, srv, "alice")
			_, _ = w.c.Write(append(tc.send, ping...))
			if code, _ := w.closeCode(t); code != tc.code {
				t.Fatalf("close code %d, want %d", code, tc.code)
			}
		})
	}
	t.Run("empty text frame is answered", func(t *testing.T) {
		w := dialWSRaw(t, srv, "alice")
		_, _ = w.c.Write(frame(0x81, nil, false))
		op, p := w.next(t)
		var f protocol.Frame
		if op != 1 || json.Unmarshal(p, &f) != nil || f.Type != protocol.TypeError || f.Code != protocol.CodeBadFrame {
			t.Fatalf("got opcode %d %s, want an error frame bad_frame", op, p)
		}
	})
	t.Run("close is echoed", func(t *testing.T) {
		w := dialWSRaw(t, srv, "alice")
		_, _ = w.c.Write(frame(0x88, []byte{0x03, 0xE8, 'b', 'y', 'e'}, false))
		if code, _ := w.closeCode(t); code != 1000 {
			t.Fatalf("close code %d, want 1000 echoed", code)
		}
	})
	t.Run("fragmented message reaches the handler", func(t *testing.T) {
		w := dialWSRaw(t, srv, "alice")
		_, _ = w.c.Write(append(frame(0x01, []byte(`{"type":`), false), frame(0x80, []byte(`"ping","rid":"f"}`), false)...))
		op, p := w.next(t)
		var f protocol.Frame
		if op != 1 || json.Unmarshal(p, &f) != nil || f.Type != protocol.TypePong || f.RID != "f" {
			t.Fatalf("got opcode %d %s, want pong f", op, p)
		}
	})
}
