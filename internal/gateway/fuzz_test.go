package gateway

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/parley-im/parley/third_party/nbio/logging"
	"github.com/parley-im/parley/third_party/nbio/mempool"
	"github.com/parley-im/parley/third_party/nbio/nbhttp"
	"github.com/parley-im/parley/third_party/nbio/nbhttp/websocket"
)

// The frame and request parsers the gateway runs are nbio's, patched in
// third_party/nbio; these fuzz tests hold them to the bounds and checks the
// gateway relies on, whatever bytes a client sends.

// panicLog turns nbio's recovered parser panics (which it only logs) into
// test failures.
type panicLog struct{ panics atomic.Int64 }

func (l *panicLog) Debug(string, ...any) {}
func (l *panicLog) Info(string, ...any)  {}
func (l *panicLog) Warn(string, ...any)  {}
func (l *panicLog) Error(f string, v ...any) {
	if strings.Contains(f, "failed") {
		l.panics.Add(1)
		fmt.Printf(f, v...)
	}
}

// sink is a connection that takes every write.
type sink struct {
	net.Conn
	wrote bytes.Buffer
}

func (s *sink) Write(b []byte) (int, error) { return s.wrote.Write(b) }
func (s *sink) Close() error                { return nil }

func (s *sink) SetReadDeadline(time.Time) error  { return nil }
func (s *sink) SetWriteDeadline(time.Time) error { return nil }
func (s *sink) SetDeadline(time.Time) error      { return nil }

func maskedFrame(b0 byte, payload []byte) []byte {
	out := []byte{b0}
	switch n := len(payload); {
	case n < 126:
		out = append(out, 0x80|byte(n))
	case n < 65536:
		out = append(out, 0x80|126, byte(n>>8), byte(n))
	default:
		out = append(out, 0x80|127)
		out = binary.BigEndian.AppendUint64(out, uint64(n))
	}
	key := []byte{9, 8, 7, 6}
	out = append(out, key...)
	for i, b := range payload {
		out = append(out, b^key[i%4])
	}
	return out
}

// FuzzFrameParse feeds arbitrary bytes to a server-side WebSocket
// connection configured as the gateway's: every message that reaches the
// handler is within the message bound, and every text message is valid
// UTF-8; nothing panics.
func FuzzFrameParse(f *testing.F) {
	log := &panicLog{}
	logging.SetLogger(log)
	cfg := DefaultConfig()
	cfg.Limits.MaxFrameBytes = 1024
	engine := nbhttp.NewEngine(nbhttp.Config{BodyAllocator: mempool.NewSTD(), ReadLimit: 4096})
	seeds := [][]byte{
		maskedFrame(0x81, []byte(`{"type":"ping"}`)),
		maskedFrame(0x81, nil),
		append(maskedFrame(0x01, []byte("ab")), maskedFrame(0x80, []byte("cd"))...),
		maskedFrame(0x81, []byte{0xCE, 0xBA, 0xE1}),
		append(maskedFrame(0x01, []byte{0xCE}), maskedFrame(0x80, []byte{0xBA})...),
		maskedFrame(0x89, []byte("p")),
		maskedFrame(0x88, []byte{3, 232}),
		{0x81, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4},
		{0x81, 0x05, 'h', 'e', 'l', 'l', 'o'},
		maskedFrame(0xC1, []byte("x")),
		maskedFrame(0x80, []byte("x")),
		maskedFrame(0x81, bytes.Repeat([]byte("a"), 2000)),
	}
	for _, s := range seeds {
		f.Add(s, uint8(0))
		f.Add(s, uint8(3))
	}
	f.Fuzz(func(t *testing.T, data []byte, split uint8) {
		u := websocket.NewUpgrader()
		configureUpgrader(u, cfg)
		var bad error
		u.OnMessage(func(c *websocket.Conn, mt websocket.MessageType, msg []byte) {
			switch {
			case len(msg) > cfg.Limits.MaxFrameBytes:
				bad = fmt.Errorf("a %d-byte message passed the %d-byte bound", len(msg), cfg.Limits.MaxFrameBytes)
			case mt == websocket.TextMessage && !utf8.Valid(msg):
				bad = errors.New("an invalid UTF-8 text message reached the handler")
			}
		})
		c := websocket.NewServerConn(u, &sink{}, "", false, false)
		c.Engine = engine
		c.Execute = func(f func()) bool { f(); return true }
		// Deliver in two reads, as TCP may.
		cut := 0
		if len(data) > 0 {
			cut = int(split) % (len(data) + 1)
		}
		_ = c.Parse(data[:cut])
		_ = c.Parse(data[cut:])
		if bad != nil {
			t.Fatal(bad)
		}
		if n := log.panics.Load(); n > 0 {
			t.Fatalf("the parser panicked %d times", n)
		}
	})
}

// FuzzRequestHead feeds arbitrary bytes to the HTTP parser with the
// gateway's head bound: a head that grows past the bound without ending is
// refused, whatever it holds, and nothing panics.
func FuzzRequestHead(f *testing.F) {
	log := &panicLog{}
	logging.SetLogger(log)
	const maxHead = 1024
	engine := nbhttp.NewEngine(nbhttp.Config{MaxHeaderBytes: maxHead, MaxHTTPBodySize: 512, ReadLimit: 8192})
	f.Add([]byte("GET /v1/ws?device=d HTTP/1.1\r\nHost: x\r\n\r\n"))
	f.Add([]byte("POST /v1/rpc HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"))
	f.Add([]byte("POST /v1/rpc HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"))
	f.Add([]byte("GET / HTTP/1.1\r\nX: " + strings.Repeat("a", 2000)))
	f.Add([]byte("POST / HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p := nbhttp.NewParser(&sink{}, engine, nil, false, nil)
		err := p.Parse(data)
		if n := log.panics.Load(); n > 0 {
			t.Fatalf("the parser panicked %d times", n)
		}
		// No request head ends within the first maxHead+1 bytes: the
		// parser must have refused the data (for its size or its syntax).
		if len(data) > maxHead && !bytes.Contains(data[:maxHead+1], []byte("\r\n\r\n")) && err == nil {
			t.Fatalf("a %d-byte head with no end was accepted", len(data))
		}
	})
}
