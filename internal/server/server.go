// Package server assembles a Parley node: it opens the engines, builds the
// chat service and the gateway, and serves them with the HTTP endpoints on
// one event-loop listener. With no engine configured every role runs in this
// one process on embedded storage.
//
// Start returns a running Server; Shutdown drains and stops it (idempotent,
// bounded by its context).
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/lesismal/nbio/mempool"
	"github.com/lesismal/nbio/nbhttp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/internal/bus/local"
	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/gateway"
	"github.com/parley-im/parley/internal/ledger"
	"github.com/parley-im/parley/internal/metrics"
	"github.com/parley-im/parley/internal/presence"
	"github.com/parley-im/parley/internal/registry/memory"
	"github.com/parley-im/parley/internal/snowflake"
	"github.com/parley-im/parley/internal/store"
	pstore "github.com/parley-im/parley/internal/store/pebble"
	"github.com/parley-im/parley/protocol"
)

// Options configure a node.
type Options struct {
	Listen      string // host:port; port 0 picks a free one
	DataDir     string
	StoreFS     vfs.FS // nil: the disk under DataDir
	Node        string
	Auth        auth.Config
	Gateway     gateway.Config
	Chat        chat.Config
	BucketWidth time.Duration
	Presence    presence.Config
	// WrapStore, if set, wraps the store the chat service uses (tests
	// inject faults with it).
	WrapStore func(store.Store) store.Store
	Logger    *slog.Logger
}

// Server is a running node.
type Server struct {
	opts     Options
	now      func() time.Time
	log      *slog.Logger
	ln       net.Listener
	engine   *nbhttp.Engine
	store    store.Store
	gw       *gateway.Gateway
	chat     *chat.Service
	verifier *auth.Verifier
	reg      *prometheus.Registry
	metrics  *metrics.Metrics
	ledger   *ledger.Pebble
	presence *presence.Tracker

	bg       sync.WaitGroup // the ledger and presence loops
	bgCancel context.CancelFunc

	shutOnce sync.Once
	shutErr  error
}

// Start opens the store, builds the roles and starts listening.
func Start(ctx context.Context, o Options) (*Server, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Node == "" {
		return nil, errors.New("server: node is required")
	}
	setNBIOLogger(o.Logger)
	s := &Server{opts: o, log: o.Logger, now: time.Now}
	v, err := auth.NewVerifier(o.Auth)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	s.verifier = v
	s.reg = prometheus.NewRegistry()
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.metrics = metrics.New(s.reg)

	st, err := pstore.Open(ctx, pstore.Config{
		Dir: filepath.Join(o.DataDir, "store"), FS: o.StoreFS, BucketWidth: o.BucketWidth, Logger: o.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("server: open store: %w", err)
	}
	s.store = st
	led, err := ledger.Open(ledger.Config{Dir: filepath.Join(o.DataDir, "ledger"), FS: o.StoreFS, Logger: o.Logger})
	if err != nil {
		_ = st.Close()
		return nil, fmt.Errorf("server: open ledger: %w", err)
	}
	s.ledger = led
	s.presence = presence.New(o.Presence, st, nil)
	reg := memory.New()
	b := local.New()
	m := s.metrics
	var chatStore store.Store = st
	if o.WrapStore != nil {
		chatStore = o.WrapStore(st)
	}
	s.chat, err = chat.New(o.Chat, chat.Deps{
		Store: chatStore, Registry: reg, Bus: b, IDs: snowflake.New(snowflake.NodeNumber(o.Node), nil), Logger: o.Logger,
		Online: s.presence, Ledger: led,
		Observer: chat.Observer{
			Stored:      func(d time.Duration) { m.Stored.Inc(); m.SendAck.Observe(d.Seconds()) },
			StoreFailed: func(op string) { m.StoreErrors.WithLabelValues(op).Inc() },
			Pushed:      func(n int) { m.Pushes.Add(float64(n)) },
			Snapshot:    func(n int) { m.SnapshotConv.Observe(float64(n)) },
			Fanout: func(tier string, rows, pushes int) {
				m.FanoutMessages.WithLabelValues(tier).Inc()
				m.FanoutRows.WithLabelValues(tier).Add(float64(rows))
				m.FanoutPushes.WithLabelValues(tier).Add(float64(pushes))
			},
			Compensated: func(kind string) { m.Compensations.WithLabelValues(kind).Inc() },
		},
	})
	if err != nil {
		s.closeEngines()
		return nil, err
	}
	s.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "parley_compensation_backlog", Help: "Compensation tasks waiting for a successful retry.",
	}, func() float64 { return float64(led.Backlog()) }))
	gcfg := o.Gateway
	gcfg.Node = o.Node
	s.gw, err = gateway.New(gcfg, gateway.Deps{
		Backend: s.chat, Verifier: v, Registry: reg, Bus: b, Logger: o.Logger,
		Presence: s.presence, MayWatch: s.chat.SharesConversation,
		Observer: gateway.Observer{
			Connections: func(d int) { m.Connections.Add(float64(d)) },
			Handshake:   func(r string) { m.Handshakes.WithLabelValues(r).Inc() },
			FrameIn:     m.FrameIn,
			Error:       func(c protocol.Code) { m.Errors.WithLabelValues(string(c)).Inc() },
			Retransmit:  m.Retransmits.Inc,
			Drop:        func(r string) { m.QueueDrops.WithLabelValues(r).Inc() },
			Delivered:   func(d time.Duration) { m.Delivery.Observe(d.Seconds()) },
		},
	})
	if err != nil {
		s.closeEngines()
		return nil, err
	}
	if err := s.listen(o); err != nil {
		_ = s.gw.Shutdown(ctx)
		s.closeEngines()
		return nil, err
	}
	bgCtx, cancel := context.WithCancel(context.Background())
	s.bgCancel = cancel
	s.bg.Add(2)
	go func() { defer s.bg.Done(); _ = led.Run(bgCtx, s.chat.Compensate) }()
	go func() { defer s.bg.Done(); s.presence.Run(bgCtx) }()
	s.log.Info("parley node started", "node", o.Node, "addr", s.Addr(), "data_dir", o.DataDir)
	return s, nil
}

func (s *Server) listen(o Options) error {
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("server: listen: %w", err)
	}
	s.ln = ln
	mux := http.NewServeMux()
	mux.Handle("GET /v1/ws", s.gw)
	mux.HandleFunc("GET /v1/poll", s.gw.ServePoll)
	mux.HandleFunc("POST /v1/rpc", s.gw.ServeRPC)
	mux.HandleFunc("GET /v1/conversations/snapshot", s.handleSnapshot)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", s.handleReady)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	s.engine = nbhttp.NewEngine(nbhttp.Config{
		Network:                      "tcp",
		Addrs:                        []string{ln.Addr().String()},
		Listen:                       func(string, string) (net.Listener, error) { return ln, nil },
		Handler:                      mux,
		MaxLoad:                      o.Gateway.MaxConnections + 1024,
		ReleaseWebsocketPayload:      true,
		MaxWriteBufferSize:           o.Gateway.OutboundQueueBytes,
		MaxWebsocketFramePayloadSize: o.Gateway.Limits.MaxFrameBytes,
		ReadBufferSize:               4096,
		IOMod:                        ioMod,
		// Plain GC-managed buffers: nbio's pooled allocator corrupts frames
		// under concurrent connections in v1.6.7–1.6.8 (nbio issue #490;
		// reproduced here by internal/e2e). Idle connections hold no
		// buffers either way, so the per-connection cost is unchanged.
		BodyAllocator: mempool.NewSTD(),
	})
	if err := s.engine.Start(); err != nil {
		return fmt.Errorf("server: start engine: %w", err)
	}
	return nil
}

// Addr is the address the node listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Metrics exposes the node's collectors (for tests and benchmarks).
func (s *Server) Metrics() *metrics.Metrics { return s.metrics }

// Gateway exposes the node's gateway.
func (s *Server) Gateway() *gateway.Gateway { return s.gw }

func (s *Server) handleReady(w http.ResponseWriter, _ *http.Request) {
	if s.gw.Draining() {
		http.Error(w, "draining", http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write([]byte("ready\n"))
}

// Drain tells clients to move and waits for them, bounded by ctx and the
// gateway's drain timeout.
func (s *Server) Drain(ctx context.Context) { s.gw.Drain(ctx) }

// Shutdown stops the node: connections are closed, the listener and the
// event loop stop, and the store is closed. Call Drain first for a graceful
// stop. It is idempotent.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutOnce.Do(func() {
		errGW := s.gw.Shutdown(ctx)
		s.engine.Stop()
		s.bgCancel()
		s.bg.Wait()
		s.shutErr = errors.Join(errGW, s.closeEngines())
	})
	return s.shutErr
}

func (s *Server) closeEngines() error {
	return errors.Join(s.ledger.Close(), s.store.Close())
}
