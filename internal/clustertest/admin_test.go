package clustertest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-im/parley/protocol"
)

// startWith starts one more process of the cluster with extra flags.
func (c *Cluster) startWith(name, role string, extra ...string) *Proc {
	c.t.Helper()
	p := &Proc{Name: name, Addr: freeAddr(c.t)}
	p.args = append(append([]string{"serve", "--roles", role, "--node-id", name, "--listen", p.Addr,
		"--data-dir", filepath.Join(c.dir, name)}, c.common...), extra...)
	c.run(p)
	c.mu.Lock()
	c.procs[name] = p
	c.mu.Unlock()
	return p
}

// adminPost calls the server API of the process at addr.
func adminPost(t *testing.T, addr, key, path, body string) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+addr+path, bytes.NewReader([]byte(body)))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: %d %s", path, resp.StatusCode, data)
	}
}

// closeCode waits (at most a generous minute) for the server to close ws
// and returns the close code and how long it took from start.
func closeCode(t *testing.T, ws *websocket.Conn, start time.Time) (int, time.Duration) {
	t.Helper()
	_ = ws.SetReadDeadline(time.Now().Add(time.Minute))
	for {
		_, _, err := ws.ReadMessage()
		if err == nil {
			continue
		}
		var ce *websocket.CloseError
		if errors.As(err, &ce) {
			return ce.Code, time.Since(start)
		}
		t.Fatalf("connection ended without a close frame: %v", err)
	}
}

// handshakeStatus is the HTTP status of a handshake with tok on g (101 on
// success, the connection then closed).
func handshakeStatus(g *Proc, tok, device string) int {
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
	ws, resp, err := d.Dial(g.URL()+"/v1/ws?device="+device, http.Header{"Authorization": {"Bearer " + tok}})
	if err == nil {
		ws.Close()
		return http.StatusSwitchingProtocols
	}
	if resp == nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestAdminBanAcrossProcesses: the server API on a chat process bans,
// revokes and disconnects users whose connections are on other gateway
// processes: the access list travels through Redis (each gateway polls
// it), disconnects through the registry and NATS. Open connections close
// with the documented codes; new handshakes on any gateway are refused;
// a gateway started after the ban refuses from its first handshake.
func TestAdminBanAcrossProcesses(t *testing.T) {
	c := Start(t, Options{})
	keyb := make([]byte, 32)
	_, _ = rand.Read(keyb)
	key := hex.EncodeToString(keyb)
	adminAddr := freeAddr(t)
	c.Chats = append(c.Chats, c.startWith("c1-"+c.keyspace, "chat", "--admin.listen", adminAddr, "--admin.key", key))
	g1 := c.startWith("g1-"+c.keyspace, "gateway")
	g2 := c.startWith("g2-"+c.keyspace, "gateway")
	c.Gateways = append(c.Gateways, g1, g2)

	alice, err := dialRaw(c, g2, "alice", "phone")
	if err != nil {
		t.Fatal(err)
	}
	bob, err := dialRaw(c, g1, "bob", "phone")
	if err != nil {
		t.Fatal(err)
	}
	carol, err := dialRaw(c, g2, "carol", "phone")
	if err != nil {
		t.Fatal(err)
	}
	// The chat tier answers through both gateways.
	if f, err := bob.call(protocol.Frame{Type: protocol.TypePing}, 10*time.Second); err != nil || f.Type != protocol.TypePong {
		t.Fatalf("ping through g1: %v %v", f, err)
	}

	start := time.Now()
	adminPost(t, adminAddr, key, "/v1/admin/users/alice/ban", `{"reason":"test"}`)
	code, took := closeCode(t, alice.ws, start)
	if code != protocol.CloseBanned {
		t.Fatalf("alice's connection on g2 closed with %d, want %d", code, protocol.CloseBanned)
	}
	t.Logf("ban → close on another gateway process: %v (documented bound 2 s)", took)
	for _, g := range []*Proc{g1, g2} {
		if st := handshakeStatus(g, c.Token("alice"), "tablet"); st != http.StatusForbidden {
			t.Fatalf("alice's handshake on %s after the ban: %d, want 403", g.Name, st)
		}
	}

	start = time.Now()
	adminPost(t, adminAddr, key, "/v1/admin/users/carol/revoke", `{}`)
	code, took = closeCode(t, carol.ws, start)
	if code != protocol.CloseTokenRevoked {
		t.Fatalf("carol's connection closed with %d, want %d", code, protocol.CloseTokenRevoked)
	}
	t.Logf("revoke → close on another gateway process: %v", took)

	start = time.Now()
	adminPost(t, adminAddr, key, "/v1/admin/users/bob/disconnect", `{"device":"phone"}`)
	code, took = closeCode(t, bob.ws, start)
	if code != protocol.CloseDisconnected {
		t.Fatalf("bob's connection on g1 closed with %d, want %d", code, protocol.CloseDisconnected)
	}
	t.Logf("disconnect → close on another gateway process: %v", took)
	if _, err := dialRaw(c, g1, "bob", "phone"); err != nil {
		t.Fatalf("bob may reconnect after a disconnect: %v", err)
	}

	// A gateway that starts now loads the ban from Redis.
	g3 := c.startWith("g3-"+c.keyspace, "gateway")
	c.Gateways = append(c.Gateways, g3)
	if st := handshakeStatus(g3, c.Token("alice"), "phone"); st != http.StatusForbidden {
		t.Fatalf("alice's handshake on a gateway started after the ban: %d, want 403", st)
	}
	if st := handshakeStatus(g3, c.Token("dave"), "phone"); st != http.StatusSwitchingProtocols {
		t.Fatalf("dave's handshake on g3: %d, want 101", st)
	}
}
