package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/protocol"
)

// dialer opens authenticated connections to one node, minting each user's
// token itself from the node's HS256 key.
type dialer struct {
	ws  websocket.Dialer
	url string
	key []byte
}

// writePool lends a write buffer only while a frame is being written, so an
// idle client connection keeps none (gorilla's WriteBufferPool).
var writePool = &sync.Pool{}

// newDialer prepares connections to addr. local, if set, is the source
// address: many connections from one host exhaust the ephemeral ports of a
// single source IP (about 28k on Linux), so the idle benchmark spreads them
// over 127.0.0.x.
func newDialer(addr string, key []byte, local net.IP, readBuf int) *dialer {
	nd := &net.Dialer{Timeout: 10 * time.Second}
	if local != nil {
		nd.LocalAddr = &net.TCPAddr{IP: local}
	}
	return &dialer{
		ws: websocket.Dialer{
			NetDialContext:   nd.DialContext,
			HandshakeTimeout: 15 * time.Second,
			ReadBufferSize:   readBuf,
			WriteBufferSize:  256,
			WriteBufferPool:  writePool,
		},
		url: "ws://" + addr + "/v1/ws?device=",
		key: key,
	}
}

// maxDialAttempts bounds retries of a refused (503) handshake.
const maxDialAttempts = 30

// dial connects as user on device and reads the hello frame. A 503 refusal
// (handshake rate limit, node full) is retried after the server's
// Retry-After, because the benchmark opens connections faster than a
// default-configured node admits them.
func (d *dialer) dial(ctx context.Context, user, device string) (*websocket.Conn, *protocol.Hello, error) {
	now := time.Now()
	tok, err := auth.MintHS256(d.key, auth.Claims{User: user, IssuedAt: now, Expires: now.Add(24 * time.Hour)})
	if err != nil {
		return nil, nil, err
	}
	h := http.Header{"Authorization": {"Bearer " + tok}}
	for attempt := 1; ; attempt++ {
		conn, resp, err := d.ws.DialContext(ctx, d.url+device, h)
		if err == nil {
			hello, err := readHello(conn)
			if err != nil {
				conn.Close()
				return nil, nil, fmt.Errorf("dial %s: %w", user, err)
			}
			return conn, hello, nil
		}
		if resp == nil || resp.StatusCode != http.StatusServiceUnavailable || attempt == maxDialAttempts {
			if resp != nil {
				return nil, nil, fmt.Errorf("dial %s: %w (HTTP %s)", user, err, resp.Status)
			}
			return nil, nil, fmt.Errorf("dial %s: %w", user, err)
		}
		wait := time.Second
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			wait = time.Duration(s) * time.Second
		}
		wait = min(wait, 3*time.Second) + rand.N(500*time.Millisecond)
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("dial %s: %w", user, ctx.Err())
		case <-time.After(wait):
		}
	}
}

var errNoHello = errors.New("first frame is not hello")

func readHello(conn *websocket.Conn) (*protocol.Hello, error) {
	if err := conn.SetReadDeadline(time.Now().Add(15 * time.Second)); err != nil {
		return nil, err
	}
	_, data, err := conn.ReadMessage()
	if err != nil {
		return nil, fmt.Errorf("read hello: %w", err)
	}
	var f protocol.Frame
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("read hello: %w", err)
	}
	if f.Type != protocol.TypeHello || f.Hello == nil {
		return nil, fmt.Errorf("read hello: %w (got %q)", errNoHello, f.Type)
	}
	return f.Hello, conn.SetReadDeadline(time.Time{})
}
