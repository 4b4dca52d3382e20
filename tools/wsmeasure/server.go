//go:build linux

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	coder "github.com/coder/websocket"
	gorilla "github.com/gorilla/websocket"
	"github.com/parley-im/parley/third_party/nbio/nbhttp"
	nbws "github.com/parley-im/parley/third_party/nbio/nbhttp/websocket"
)

// session is the per-connection state a chat gateway keeps after auth.
type session struct {
	userID, device       string
	connID, seq          uint64
	lastSeen             int64
	flags, unread, limit int32
}

func (s *session) touch() { s.lastSeen, s.seq = time.Now().Unix(), s.seq+1 }

// registry indexes live sessions the way a gateway routes messages to them.
type registry struct {
	next, live atomic.Int64
	byID       sync.Map // connID -> *session
}

func (g *registry) open() *session {
	id := g.next.Add(1)
	s := &session{userID: "user-" + strconv.FormatInt(id, 10), device: "android", connID: uint64(id), limit: 64}
	s.touch()
	g.byID.Store(id, s)
	g.live.Add(1)
	return s
}

func (g *registry) close(s *session) {
	g.byID.Delete(int64(s.connID))
	g.live.Add(-1)
}

// memReport is what the debug endpoint returns; measure decodes the same type.
type memReport struct {
	Conns, Goroutines     int
	HeapInuse, StackInuse uint64
}

type serverConfig struct {
	impl, addr, debug      string
	idle                   time.Duration
	readBuf, pollers, pool int
	bufSize                int
	detach                 bool
}

func runServer(args []string) error {
	var c serverConfig
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.StringVar(&c.impl, "impl", "nbio", "nbio, gorilla or coder")
	fs.StringVar(&c.addr, "addr", "127.0.0.1:18080", "WebSocket listen address")
	fs.StringVar(&c.debug, "debug", "127.0.0.1:18081", "debug (MemStats) listen address")
	fs.DurationVar(&c.idle, "idle", 10*time.Minute, "idle timeout, armed as a per-connection read deadline; 0 disables")
	fs.IntVar(&c.readBuf, "readbuf", 4096, "nbio: engine ReadBufferSize (one buffer per poller)")
	fs.IntVar(&c.pollers, "pollers", 1, "nbio: NPoller")
	fs.IntVar(&c.pool, "pool", 0, "nbio: MessageHandlerPoolSize (0 = NumCPU*1024)")
	fs.IntVar(&c.bufSize, "bufsize", 512, "gorilla: ReadBufferSize and WriteBufferSize")
	fs.BoolVar(&c.detach, "detach", false, "gorilla: read loop in a new goroutine so the handler returns")
	if err := fs.Parse(args); err != nil {
		return err
	}
	reg := &registry{}
	go serveDebug(c.debug, reg)
	mux := http.NewServeMux()
	switch c.impl {
	case "nbio":
		return serveNbio(c, reg, mux)
	case "gorilla":
		mux.Handle("/ws", gorillaHandler(c, reg))
	case "coder":
		mux.Handle("/ws", coderHandler(c, reg))
	default:
		return fmt.Errorf("server: unknown impl %q", c.impl)
	}
	return (&http.Server{Addr: c.addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}).ListenAndServe()
}

// serveDebug reports MemStats; ?free=1 first returns freed memory to the OS so
// that a VmRSS read afterwards reflects live memory rather than GC timing.
func serveDebug(addr string, reg *registry) {
	panic(http.ListenAndServe(addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("free") == "1" {
			debug.FreeOSMemory()
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		_ = json.NewEncoder(w).Encode(memReport{int(reg.live.Load()), runtime.NumGoroutine(), ms.HeapInuse, ms.StackInuse})
	})))
}

func serveNbio(c serverConfig, reg *registry, mux *http.ServeMux) error {
	u := nbws.NewUpgrader()
	// The upgrader arms nbio's per-connection read deadline (a time.Timer) and
	// re-arms it after every message: it is the idle timeout.
	u.KeepaliveTime = c.idle
	u.OnMessage(func(wc *nbws.Conn, mt nbws.MessageType, data []byte) {
		if s, ok := wc.Session().(*session); ok {
			s.touch()
		}
		_ = wc.WriteMessage(mt, data)
	})
	u.OnClose(func(wc *nbws.Conn, _ error) {
		if s, ok := wc.Session().(*session); ok {
			reg.close(s)
		}
	})
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		if wc, err := u.Upgrade(w, r, nil); err == nil {
			wc.SetSession(reg.open())
		}
	})
	engine := nbhttp.NewEngine(nbhttp.Config{
		Network: "tcp", Addrs: []string{c.addr}, Handler: mux,
		IOMod: nbhttp.IOModNonBlocking, ReleaseWebsocketPayload: true,
		ReadBufferSize: c.readBuf, NPoller: c.pollers, MessageHandlerPoolSize: c.pool,
		// nbhttp arms this HTTP-phase deadline after registering the conn with
		// the poller (engine.go:721-729 in v1.6.8), so it can overwrite the
		// upgrader's deadline if the handshake wins the race; keep it >= idle.
		KeepaliveTime: max(c.idle, 10*time.Minute),
	})
	if err := engine.Start(); err != nil {
		return fmt.Errorf("server: nbio start: %w", err)
	}
	select {}
}

// echoLoop is the goroutine-per-connection reader shared by gorilla and coder.
func echoLoop(reg *registry, read func() (int, []byte, error), write func(int, []byte) error) {
	s := reg.open()
	defer reg.close(s)
	for {
		mt, data, err := read()
		if err != nil {
			return
		}
		s.touch()
		if write(mt, data) != nil {
			return
		}
	}
}

// gorillaHandler is the usual goroutine-per-connection reader; unless detach
// is set the handler goroutine itself stays parked in ReadMessage.
func gorillaHandler(c serverConfig, reg *registry) http.Handler {
	u := gorilla.Upgrader{ReadBufferSize: c.bufSize, WriteBufferSize: c.bufSize, WriteBufferPool: &sync.Pool{}}
	loop := func(conn *gorilla.Conn) {
		defer conn.Close()
		echoLoop(reg, func() (int, []byte, error) {
			if c.idle > 0 {
				_ = conn.SetReadDeadline(time.Now().Add(c.idle))
			}
			return conn.ReadMessage()
		}, conn.WriteMessage)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if conn, err := u.Upgrade(w, r, nil); err == nil && c.detach {
			go loop(conn)
		} else if err == nil {
			loop(conn)
		}
	})
}

// coderHandler is coder/websocket's standard Accept + read loop, the idle
// timeout carried by a per-read context.
func coderHandler(c serverConfig, reg *registry) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, err := coder.Accept(w, r, &coder.AcceptOptions{CompressionMode: coder.CompressionDisabled})
		if err != nil {
			return
		}
		defer conn.CloseNow()
		echoLoop(reg, func() (int, []byte, error) {
			ctx, cancel := r.Context(), context.CancelFunc(func() {})
			if c.idle > 0 {
				ctx, cancel = context.WithTimeout(ctx, c.idle)
			}
			defer cancel()
			mt, data, err := conn.Read(ctx)
			return int(mt), data, err
		}, func(mt int, data []byte) error { return conn.Write(r.Context(), coder.MessageType(mt), data) })
	})
}
