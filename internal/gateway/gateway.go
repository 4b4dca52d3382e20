// Package gateway holds clients' long-lived WebSocket connections and
// only moves bytes: it authenticates the handshake, registers the device in
// the session registry, hands each frame to the chat backend, and writes
// the pushes the bus brings for its local users.
//
// Connections run on an event loop (lesismal/nbio over epoll): an idle
// connection has no goroutine and no buffers of its own, which keeps its fixed
// cost low. Per connection, frames are handled one at a time in arrival
// order on a shared worker pool, except that with a Batcher backend a
// connection's sends to one conversation are pipelined (pipe.go); writes
// never block (bytes waiting for a slow reader are buffered up to a bound,
// past which the connection is dropped).
//
// Two goroutines, owned by the Gateway and stopped by Shutdown: the
// sweeper enforces the idle timeout and re-sends unacknowledged pushes; the
// dispatcher writes the pushes the bus brings, in batches (push.go). A
// connection's pipelined sends run on a goroutine of their own while any
// are in flight, also waited for by Shutdown.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parley-im/parley/third_party/nbio/nbhttp/websocket"

	"github.com/parley-im/parley/internal/access"
	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/internal/bus"
	"github.com/parley-im/parley/internal/presence"
	"github.com/parley-im/parley/internal/registry"
	"github.com/parley-im/parley/internal/settings"
	"github.com/parley-im/parley/protocol"
)

// Backend runs client requests; the chat service in-process, or a remote
// chat tier.
type Backend interface {
	Handle(ctx context.Context, c protocol.Caller, f *protocol.Frame, reply func(*protocol.Frame))
}

// Presence is the node's presence tracker (presence.Tracker).
type Presence interface {
	Connected(ctx context.Context, user string)
	Disconnected(user string)
	Watch(ctx context.Context, s presence.Subscriber, users []string) ([]protocol.PresenceState, error)
	Unwatch(s presence.Subscriber)
}

// MayWatch reports whether user a may see b's presence (they share a
// conversation).
type MayWatch func(ctx context.Context, a, b string) (bool, error)

// Access is the operator's access list (access.List): banned users and
// revoked tokens.
type Access interface {
	Check(user, device string, iatMS int64) *access.Refusal
}

// Verifier checks handshake tokens.
type Verifier interface {
	Verify(token string, now time.Time) (auth.Identity, error)
}

// Config tunes a gateway. Each field with a yaml tag is a server setting
// under gateway. (package settings): its key, help and, from DefaultConfig,
// its default are declared here and nowhere else.
type Config struct {
	Node   string          `yaml:"-"` // the node id (cmd/parley: node_id)
	Limits protocol.Limits `yaml:"-"` // the protocol limits (cmd/parley: limits.*)
	// MaxFileBytes and PartBytes are the attachment sizes hello announces
	// (cmd/parley: attach.*; 0: attachments off).
	MaxFileBytes int64 `yaml:"-"`
	PartBytes    int64 `yaml:"-"`
	// WebPushKey is the VAPID public key hello announces (cmd/parley:
	// from push.webpush.vapid_key_file; empty: no Web Push).
	WebPushKey string `yaml:"-"`
	// Reactions and ReactionsPerUser are the reactions hello announces
	// (cmd/parley: chat.reactions, chat.reactions_per_user).
	Reactions        []string `yaml:"-"`
	ReactionsPerUser int      `yaml:"-"`

	HeartbeatInterval time.Duration `yaml:"heartbeat_interval" help:"client ping interval announced in hello"`
	IdleTimeout       time.Duration `yaml:"idle_timeout" help:"close a connection silent for this long"`
	// OutboundQueueBytes bounds the bytes waiting for one slow reader;
	// past it the connection is dropped (the slow-consumer policy).
	OutboundQueueBytes int           `yaml:"outbound_queue_bytes" help:"unsent bytes per connection before it is dropped as a slow consumer"`
	RetransmitAfter    time.Duration `yaml:"retransmit_after" help:"re-send a push not acknowledged within this time"`
	RetransmitMax      int           `yaml:"retransmit_max" help:"re-sends of one push before leaving the message to sync"`
	MaxInflight        int           `yaml:"max_inflight" help:"unacknowledged pushes tracked per connection"`
	DrainTimeout       time.Duration `yaml:"drain_timeout" help:"time given to connections to leave on shutdown"`
	// HandshakeRate and HandshakeBurst are the node's token bucket for new
	// connections, so a reconnect storm queues instead of toppling the
	// node; SyncRate and SyncBurst the one for sync requests (offline
	// pulls), the other half of reconnect-storm protection.
	HandshakeRate  float64 `yaml:"handshake_rate" help:"handshakes per second admitted by this node"`
	HandshakeBurst int     `yaml:"handshake_burst" help:"handshakes admitted at once above the rate"`
	SyncRate       float64 `yaml:"sync_rate" help:"sync requests (offline pulls) admitted per second"`
	SyncBurst      int     `yaml:"sync_burst" help:"sync requests admitted at once above the rate"`
	MaxConnections int     `yaml:"max_connections" help:"connections open at once on this node"`
	// RequestTimeout bounds one client request to the backend (the chat
	// service, in process or on another node).
	RequestTimeout time.Duration `yaml:"request_timeout" help:"bound on one client request to the chat service; past it the request answers timeout (cluster mode) or store_unavailable"`
	// SessionPrefix starts every session id (default: Node). Make it unique
	// per process so ids never repeat across restarts of a node.
	SessionPrefix string `yaml:"-"`

	// The edge (edge.go): bounds on a connection before its request is
	// authenticated. MaxHeaderBytes bounds a request line and headers
	// (431 over it); a request head must arrive within HeaderTimeout of
	// the connection opening or of the previous response, and its body
	// within BodyTimeout of the head (408). MaxPendingConnections is how
	// many TCP connections beyond MaxConnections the event loop accepts,
	// so that partial handshakes meet Parley's 503, not a refused accept.
	MaxHeaderBytes        int           `yaml:"max_header_bytes" help:"largest request line plus headers (431 over it)"`
	HeaderTimeout         time.Duration `yaml:"header_timeout" help:"time for a request head to arrive (408 after it)"`
	BodyTimeout           time.Duration `yaml:"body_timeout" help:"time for a request body to arrive after its head (408 after it)"`
	MaxPendingConnections int           `yaml:"max_pending_connections" help:"TCP connections accepted beyond max_connections (partial handshakes)"`

	// Fair sharing (fair.go): sends (send, edit, recall) per second and
	// burst per user on this node; requests (all but ping and delivered)
	// per second and burst per connection; sessions per user on this node,
	// and long-poll sessions among them.
	UserSendRate           float64 `yaml:"user_send_rate" help:"messages (send, edit, recall) per second per user on this node"`
	UserSendBurst          int     `yaml:"user_send_burst" help:"messages one user may send at once above the rate"`
	ConnRequestRate        float64 `yaml:"conn_request_rate" help:"requests per second per connection (ping and delivered not counted)"`
	ConnRequestBurst       int     `yaml:"conn_request_burst" help:"requests one connection may send at once above the rate"`
	MaxSessionsPerUser     int     `yaml:"max_sessions_per_user" help:"sessions (devices) one user may hold on this node"`
	MaxPollSessionsPerUser int     `yaml:"max_poll_sessions_per_user" help:"long-poll sessions one user may hold on this node"`
	// UserHandshakeRate and UserHandshakeBurst bound one user's new
	// sessions per second on this node.
	UserHandshakeRate  float64 `yaml:"user_handshake_rate" help:"new sessions per second per user on this node"`
	UserHandshakeBurst int     `yaml:"user_handshake_burst" help:"new sessions one user may open at once above the rate"`
	// SourceAcceptRate and SourceAcceptBurst pace the TCP connections
	// one source address opens (pace.go): over them a connection waits
	// before the node reads it. 0 turns the pacing off (behind a proxy
	// that hides client addresses).
	SourceAcceptRate  float64 `yaml:"source_accept_rate" help:"TCP connections per second one source address may open before they are paced (0: off; set 0 behind a proxy that hides client addresses)"`
	SourceAcceptBurst int     `yaml:"source_accept_burst" help:"TCP connections one source address may open at once above the rate (as many more wait their turn; past that they are reset)"`
}

// DefaultConfig returns the defaults documented in docs/protocol.md.
func DefaultConfig() Config {
	return Config{
		Node:               "node1",
		Limits:             protocol.DefaultLimits,
		HeartbeatInterval:  25 * time.Second,
		IdleTimeout:        75 * time.Second,
		RetransmitAfter:    5 * time.Second,
		RetransmitMax:      3,
		MaxInflight:        256,
		DrainTimeout:       10 * time.Second,
		MaxConnections:     100000,
		HandshakeRate:      1000,
		HandshakeBurst:     2000,
		SyncRate:           500,
		SyncBurst:          1000,
		RequestTimeout:     10 * time.Second,
		OutboundQueueBytes: 1 << 20,

		MaxHeaderBytes:        16 << 10,
		HeaderTimeout:         10 * time.Second,
		BodyTimeout:           10 * time.Second,
		MaxPendingConnections: 10000,

		UserSendRate:           50,
		UserSendBurst:          100,
		ConnRequestRate:        100,
		ConnRequestBurst:       200,
		MaxSessionsPerUser:     16,
		MaxPollSessionsPerUser: 4,
		UserHandshakeRate:      5,
		UserHandshakeBurst:     20,
		SourceAcceptRate:       200,
		SourceAcceptBurst:      1000,
	}
}

// Validate reports every setting the gateway cannot run with, by key (a
// *settings.Error).
func (c Config) Validate() error {
	var p settings.Problems
	p.Check(c.Node != "", "node", "is required")
	p.Check(c.HeartbeatInterval > 0, "heartbeat_interval", "must be positive, got %v", c.HeartbeatInterval)
	// Clients ping every heartbeat interval; closing sooner than that would
	// cut healthy idle connections.
	p.Check(c.IdleTimeout > c.HeartbeatInterval, "idle_timeout", "must exceed heartbeat_interval (%v), got %v", c.HeartbeatInterval, c.IdleTimeout)
	p.Check(c.OutboundQueueBytes >= c.Limits.MaxFrameBytes, "outbound_queue_bytes", "must hold one frame of limits.max_frame_bytes (%d), got %d", c.Limits.MaxFrameBytes, c.OutboundQueueBytes)
	p.Check(c.RetransmitAfter > 0, "retransmit_after", "must be positive, got %v", c.RetransmitAfter)
	p.Check(c.RetransmitMax >= 0, "retransmit_max", "must not be negative, got %d", c.RetransmitMax)
	p.Check(c.MaxInflight > 0, "max_inflight", "must be positive, got %d", c.MaxInflight)
	p.Check(c.DrainTimeout > 0, "drain_timeout", "must be positive, got %v", c.DrainTimeout)
	p.Check(c.RequestTimeout > 0, "request_timeout", "must be positive, got %v", c.RequestTimeout)
	p.Check(c.HandshakeRate > 0, "handshake_rate", "must be positive, got %v", c.HandshakeRate)
	p.Check(c.HandshakeBurst > 0, "handshake_burst", "must be positive, got %d", c.HandshakeBurst)
	p.Check(c.SyncRate > 0, "sync_rate", "must be positive, got %v", c.SyncRate)
	p.Check(c.SyncBurst > 0, "sync_burst", "must be positive, got %d", c.SyncBurst)
	p.Check(c.MaxConnections > 0, "max_connections", "must be positive, got %d", c.MaxConnections)
	p.Check(c.MaxHeaderBytes >= 1024, "max_header_bytes", "must be at least 1024, got %d", c.MaxHeaderBytes)
	p.Check(c.HeaderTimeout > 0, "header_timeout", "must be positive, got %v", c.HeaderTimeout)
	p.Check(c.BodyTimeout > 0, "body_timeout", "must be positive, got %v", c.BodyTimeout)
	p.Check(c.MaxPendingConnections > 0, "max_pending_connections", "must be positive, got %d", c.MaxPendingConnections)
	p.Check(c.UserSendRate > 0 && c.UserSendBurst > 0, "user_send_rate", "rate and burst must be positive, got %v and %d", c.UserSendRate, c.UserSendBurst)
	p.Check(c.ConnRequestRate > 0 && c.ConnRequestBurst > 0, "conn_request_rate", "rate and burst must be positive, got %v and %d", c.ConnRequestRate, c.ConnRequestBurst)
	p.Check(c.MaxSessionsPerUser > 0, "max_sessions_per_user", "must be positive, got %d", c.MaxSessionsPerUser)
	p.Check(c.MaxPollSessionsPerUser > 0, "max_poll_sessions_per_user", "must be positive, got %d", c.MaxPollSessionsPerUser)
	p.Check(c.UserHandshakeRate > 0 && c.UserHandshakeBurst > 0, "user_handshake_rate", "rate and burst must be positive, got %v and %d", c.UserHandshakeRate, c.UserHandshakeBurst)
	p.Check(c.SourceAcceptRate >= 0, "source_accept_rate", "must not be negative (0: off), got %v", c.SourceAcceptRate)
	p.Check(c.SourceAcceptRate == 0 || c.SourceAcceptBurst >= 1, "source_accept_burst", "must be at least 1 when source_accept_rate is set, got %d", c.SourceAcceptBurst)
	return p.Err("gateway")
}

// Observer receives the gateway's measurements; nil fields are skipped.
type Observer struct {
	Connections func(delta int)
	Handshake   func(result string)
	FrameIn     func(typ string)
	Error       func(code protocol.Code)
	Retransmit  func()
	Drop        func(reason string)
	Delivered   func(d time.Duration)
}

// Gateway is one gateway node.
type Gateway struct {
	cfg      Config
	backend  Backend
	verifier Verifier
	reg      registry.Registry
	bus      bus.Bus
	presence Presence
	mayWatch MayWatch
	access   Access
	log      *slog.Logger
	obs      Observer
	now      func() time.Time
	up       *websocket.Upgrader

	ctx      context.Context // canceled by Shutdown; parent of request contexts
	cancel   context.CancelFunc
	unsub    func()
	sweeper  sync.WaitGroup
	pipes    sync.WaitGroup // the connections' pipelined sends (pipe.go)
	draining atomic.Bool
	conns    atomic.Int64
	nextID   atomic.Uint64
	shutOnce sync.Once
	admit    *bucket
	syncs    *bucket    // admission of sync requests (offline pulls)
	refusals refusalLog // rate limit of refusal log lines (connlog.go)
	// sessionPrefix starts session ids (Config.SessionPrefix or Node).
	sessionPrefix string
	polls         sync.Map    // poll session id → *mailbox
	pushes        chan queued // deliveries waiting for the dispatcher (push.go)
	shards        [64]shard
	groups        [groupShards]groupShard // group lists (groups.go)
	edge          edgeCounters
	sends         userBuckets               // per-user send budgets (fair.go)
	handshakes    userBuckets               // per-user handshake budgets (fair.go)
	reqCtx        atomic.Pointer[sharedCtx] // requestContext's current slice
}

// shard indexes the local sessions of the users that hash to it.
type shard struct {
	mu    sync.Mutex
	users map[string][]*session // guarded by mu
}

// Deps are the gateway's collaborators.
type Deps struct {
	Backend  Backend
	Verifier Verifier
	Registry registry.Registry
	Bus      bus.Bus
	Presence Presence
	MayWatch MayWatch
	// Access, if set, refuses banned users and revoked tokens (access.go).
	Access   Access
	Logger   *slog.Logger
	Observer Observer
	Now      func() time.Time
}

// New builds a gateway and subscribes it to its node's deliveries. Call
// Shutdown to stop it.
func New(cfg Config, d Deps) (*Gateway, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d.Backend == nil || d.Verifier == nil || d.Registry == nil || d.Bus == nil || d.Presence == nil || d.MayWatch == nil {
		return nil, errors.New("gateway: backend, verifier, registry, bus and presence are required")
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	g := &Gateway{cfg: cfg, backend: d.Backend, verifier: d.Verifier, reg: d.Registry, bus: d.Bus,
		presence: d.Presence, mayWatch: d.MayWatch, access: d.Access, log: d.Logger, obs: d.Observer, now: d.Now}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	g.admit = newBucket(cfg.HandshakeRate, cfg.HandshakeBurst, d.Now())
	g.syncs = newBucket(cfg.SyncRate, cfg.SyncBurst, d.Now())
	g.sessionPrefix = cfg.SessionPrefix
	if g.sessionPrefix == "" {
		g.sessionPrefix = cfg.Node
	}
	for i := range g.shards {
		g.shards[i].users = make(map[string][]*session)
	}
	for i := range g.groups {
		g.groups[i].m = make(map[uint64]*groupList)
	}
	g.up = g.newUpgrader()
	// The queue exists before the subscription: a delivery may arrive
	// (e.g. a compensation retry) the moment Subscribe returns or sooner.
	g.pushes = make(chan queued, pushQueueLen)
	unsub, err := d.Bus.Subscribe(g.ctx, cfg.Node, g.deliver)
	if err != nil {
		g.cancel()
		return nil, fmt.Errorf("gateway: subscribe: %w", err)
	}
	g.unsub = unsub
	g.sweeper.Add(2)
	go g.sweep()
	go g.dispatch()
	return g, nil
}

// Connections is the number of open connections on this node.
func (g *Gateway) Connections() int { return int(g.conns.Load()) }

// Draining reports whether Drain has started.
func (g *Gateway) Draining() bool { return g.draining.Load() }

func (g *Gateway) shardOf(user string) *shard {
	return &g.shards[g.shardIndex(user)]
}

func (g *Gateway) shardIndex(user string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(user); i++ {
		h ^= uint32(user[i])
		h *= 16777619
	}
	return h % uint32(len(g.shards))
}

func (g *Gateway) add(s *session) {
	sh := g.shardOf(s.user)
	sh.mu.Lock()
	sh.users[s.user] = append(sh.users[s.user], s)
	sh.mu.Unlock()
}

func (g *Gateway) remove(s *session) bool {
	sh := g.shardOf(s.user)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	list := sh.users[s.user]
	for i, x := range list {
		if x == s {
			list[i] = list[len(list)-1]
			list = list[:len(list)-1]
			if len(list) == 0 {
				delete(sh.users, s.user)
			} else {
				sh.users[s.user] = list
			}
			return true
		}
	}
	return false
}

// sessionsOf returns a snapshot of user's local sessions.
func (g *Gateway) sessionsOf(user string) []*session {
	sh := g.shardOf(user)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return append([]*session(nil), sh.users[user]...)
}

// each calls f for every local session, one shard at a time, outside the
// shard's lock.
func (g *Gateway) each(f func(*session)) {
	var buf []*session
	for i := range g.shards {
		sh := &g.shards[i]
		sh.mu.Lock()
		buf = buf[:0]
		for _, l := range sh.users {
			buf = append(buf, l...)
		}
		sh.mu.Unlock()
		for _, s := range buf {
			f(s)
		}
	}
}

// deliver writes a bus delivery to the local sessions of its users, or
// of its group list's users (groups.go).
func (g *Gateway) deliver(d bus.Delivery) error {
	if d.Kick != nil && d.Kick.Code != 0 {
		g.Disconnect(d.Kick.User, d.Kick.Device, d.Kick.Code)
		return nil
	}
	if d.Kick != nil {
		for _, s := range g.sessionsOf(d.Kick.User) {
			if s.id == d.Kick.Session {
				s.close(protocol.CloseReplaced, "replaced by a newer connection of this device")
			}
		}
		return nil
	}
	users := d.Users
	if d.Group != nil {
		var err error
		if users, err = g.groupRecipients(d, g.now().UnixMilli()); err != nil {
			return err
		}
		if len(users) == 0 {
			return nil
		}
	}
	m := &message{frame: newWireFrame(d.Frame), conv: d.ConvID, seq: d.Seq, key: d.CoalesceKey, untracked: d.Untracked}
	select {
	case g.pushes <- queued{m: m, users: users}:
	case <-g.ctx.Done():
	}
	return nil
}

// sweep enforces idle timeouts and re-sends unacknowledged pushes.
func (g *Gateway) sweep() {
	defer g.sweeper.Done()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	ticks := 0
	for {
		select {
		case <-g.ctx.Done():
			return
		case <-tick.C:
		}
		now := g.now()
		if ticks++; ticks%60 == 0 {
			g.sends.sweep(now)
			g.handshakes.sweep(now)
			g.sweepGroups(now.Add(-groupListIdle).UnixMilli())
		}
		idleBefore := now.Add(-g.cfg.IdleTimeout).UnixMilli()
		resendBefore := now.Add(-g.cfg.RetransmitAfter).UnixMilli()
		g.each(func(s *session) {
			if s.lastSeen.Load() < idleBefore {
				s.close(protocol.CloseIdleTimeout, "idle timeout")
				return
			}
			if s.expiresMS != 0 && s.expiresMS <= now.UnixMilli() {
				s.close(protocol.CloseTokenExpired, "token expired: reconnect with a new token")
				return
			}
			s.retransmit(resendBefore, now.UnixMilli())
		})
	}
}

// CloseAll closes every connection of the node with code (the registry
// lease was lost, so the sessions must register again).
func (g *Gateway) CloseAll(code int, reason string) {
	g.each(func(s *session) { s.close(code, reason) })
}

// Drain tells every client to move to another node, with delays spread
// over half the drain timeout so they do not all reconnect at once,
// then waits for them to leave, at most until ctx ends or DrainTimeout
// passes, and closes the rest with 1001.
func (g *Gateway) Drain(ctx context.Context) {
	if !g.draining.CompareAndSwap(false, true) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, g.cfg.DrainTimeout)
	defer cancel()
	spread := g.cfg.DrainTimeout / 2
	n := max(g.conns.Load(), 1)
	i := int64(0)
	g.each(func(s *session) {
		delay := time.Duration(i) * spread / time.Duration(n)
		i++
		s.writeFrame(&protocol.Frame{Type: protocol.TypeGoAway, RetryAfter: delay.Milliseconds()})
	})
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for g.conns.Load() > 0 {
		select {
		case <-ctx.Done():
			g.each(func(s *session) { s.close(protocol.CloseGoingAway, "node is draining") })
			return
		case <-tick.C:
		}
	}
}

// Shutdown stops the sweeper, leaves the bus and closes every connection.
// It is idempotent and bounded by ctx.
func (g *Gateway) Shutdown(ctx context.Context) error {
	g.shutOnce.Do(func() {
		g.draining.Store(true)
		g.unsub()
		g.cancel()
		g.each(func(s *session) { s.close(protocol.CloseGoingAway, "node is stopping") })
	})
	done := make(chan struct{})
	go func() { g.sweeper.Wait(); g.pipes.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
