package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// TestTokenInSubprotocol: a browser cannot set Authorization on a
// WebSocket, and a token in the URL lands in consoles and access logs; so
// the token may travel as the subprotocol bearer.<token> beside parley,
// and the node selects parley — never echoing the token.
func TestTokenInSubprotocol(t *testing.T) {
	srv := servertest.Start(t)
	dial := func(protocols ...string) (*websocket.Conn, *http.Response, error) {
		d := *websocket.DefaultDialer
		d.Subprotocols = protocols
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return d.DialContext(ctx, srv.URL+"/v1/ws?device=web", nil)
	}
	ws, resp, err := dial(protocol.Subprotocol, protocol.BearerSubprotocolPrefix+srv.Token("alice"))
	if err != nil {
		t.Fatalf("dial with the token as a subprotocol: %v (%v)", err, resp)
	}
	if got := ws.Subprotocol(); got != protocol.Subprotocol {
		t.Fatalf("selected subprotocol %q, want %q", got, protocol.Subprotocol)
	}
	c := startRaw(t, ws)
	if c.hello.UserID != "alice" {
		t.Fatalf("hello for %q", c.hello.UserID)
	}
	if _, resp, err := dial(protocol.Subprotocol, protocol.BearerSubprotocolPrefix+"not.a.token"); err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a forged token as a subprotocol: %v %v, want 401", err, resp)
	}
	if _, resp, err := dial(protocol.Subprotocol); err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no token at all: %v %v, want 401", err, resp)
	}
}
