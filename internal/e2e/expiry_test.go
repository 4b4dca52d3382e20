package e2e

import (
	"testing"
	"time"

	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// TestExpiredTokenClosesConnection: a connection does not outlive its
// token: once exp passes it is closed with 4001 (reconnect with a new
// token), within the sweeper's period.
func TestExpiredTokenClosesConnection(t *testing.T) {
	srv := servertest.Start(t)
	tok := servertest.MintToken(t, srv.Key(), "alice", 2*time.Second)
	ws, _, err := dialRawErr(srv.URL, tok, "d")
	if err != nil {
		t.Fatal(err)
	}
	c := startRaw(t, ws)
	if code := c.waitClose(); code != protocol.CloseTokenExpired {
		t.Fatalf("close code %d, want %d (token expired)", code, protocol.CloseTokenExpired)
	}
}
