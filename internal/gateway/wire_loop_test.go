//go:build !race

package gateway

import (
	"bytes"
	"net"
	"net/http"
	"testing"
	"time"

	gorilla "github.com/gorilla/websocket"
	"github.com/parley-im/parley/third_party/nbio/nbhttp"
	"github.com/parley-im/parley/third_party/nbio/nbhttp/websocket"
)

// TestEventLoopTransportWritesRawFrames: on nbio's event loop (the build
// without the race detector) the transport finds the nbio connection
// under the WebSocket and writes pre-framed bytes to it; a standard client
// reads them as the same messages, in order, including one larger than
// nbio's own fragmentation size.
func TestEventLoopTransportWritesRawFrames(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := websocket.NewUpgrader()
	got := make(chan wsTransport, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			t.Error(err)
			return
		}
		got <- newWSTransport(c, 1<<20)
	})
	engine := nbhttp.NewEngine(nbhttp.Config{
		Network: "tcp", Addrs: []string{ln.Addr().String()},
		Listen:  func(string, string) (net.Listener, error) { return ln, nil },
		Handler: mux, IOMod: nbhttp.IOModNonBlocking, MaxWebsocketFramePayloadSize: 64 << 10,
	})
	if err := engine.Start(); err != nil {
		t.Fatal(err)
	}
	defer engine.Stop()
	client, _, err := gorilla.DefaultDialer.Dial("ws://"+ln.Addr().String()+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	var tr wsTransport
	select {
	case tr = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no upgrade")
	}
	if tr.raw == nil {
		t.Fatalf("the transport did not find the event loop's connection under %T", tr.c.UnderlayerConn())
	}
	want := [][]byte{[]byte(`{"type":"msg"}`), bytes.Repeat([]byte("x"), 200<<10), []byte(`{"type":"receipt"}`)}
	shared := newWireFrame(want[0])
	for _, p := range want {
		f := newWireFrame(p)
		if len(p) == len(want[0]) {
			f = shared
		}
		if err := tr.write(f); err != nil {
			t.Fatal(err)
		}
	}
	_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
	for i, w := range want {
		mt, p, err := client.ReadMessage()
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if mt != gorilla.TextMessage || !bytes.Equal(p, w) {
			t.Fatalf("message %d: type %d, %d bytes; want text of %d bytes", i, mt, len(p), len(w))
		}
	}
}
