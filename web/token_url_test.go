package web_test

import (
	"strings"
	"testing"
	"time"
)

// TestWebTokenNeverInURL: the page's WebSocket dials carry the token as a
// subprotocol, not in the URL, so a failed dial's console message (and a
// proxy's access log) shows no token: with the node down, the page's
// console names /v1/ws and never token=.
func TestWebTokenNeverInURL(t *testing.T) {
	n := startNode(t)
	b := newBrowser(t)
	alice := b.user("alice")
	alice.login(n, "alice")
	b.mu.Lock()
	b.allowNetErrors = true // failed handshakes while the node is down
	b.mu.Unlock()
	n.srv.Close()
	alice.until("reconnecting", `/Reconnecting|Disconnected/.test(document.getElementById("status").textContent)`)
	deadline := time.Now().Add(20 * time.Second)
	for {
		b.mu.Lock()
		logs := append([]string(nil), b.logs...)
		b.mu.Unlock()
		dials := 0
		for _, l := range logs {
			if strings.Contains(l, "token=") || strings.Contains(l, "eyJ") {
				t.Fatalf("the console shows the token: %s", l)
			}
			if strings.Contains(l, "/v1/ws") {
				dials++
			}
		}
		if dials > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no failed WebSocket dial in the console within 20 s; console:\n%s", strings.Join(logs, "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	n.start()
	alice.connected()
}
