package e2e

import (
	"os/exec"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// TestConnectionsSurviveAChildProcess: a child process started by the
// node's process (here a sleep) must not inherit the node's sockets. When
// it did (nbio duplicated accepted sockets without close-on-exec), a
// connection closed by the node stayed registered with the event loop, and
// every later connection given the same descriptor number was closed at
// once: clients saw EOF instead of an answer (third_party/nbio patch H6).
func TestConnectionsSurviveAChildProcess(t *testing.T) {
	srv := servertest.Start(t)
	held := make([]*rawConn, 0, 8)
	for i := range 8 {
		held = append(held, dialRaw(t, srv, "u", "d"+itoa(i)))
	}
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		t.Skipf("no sleep binary: %v", err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	for _, c := range held {
		_ = c.ws.Close()
	}
	time.Sleep(200 * time.Millisecond) // the node closes its side
	for i := range 20 {
		ws, _, err := dialRawErr(srv.URL, srv.Token("v"), "v"+itoa(i))
		if err != nil {
			t.Fatalf("connection %d after the child started: %v", i, err)
		}
		c := startRaw(t, ws)
		mustOK(t, c.call(protocol.Frame{Type: protocol.TypePing}), protocol.TypePong)
		_ = ws.Close()
	}
}
