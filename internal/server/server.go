// Package server assembles a Parley node: it opens the engines, builds the
// roles the node runs (gateway, chat, or both) and serves them with the HTTP
// endpoints on one event-loop listener. With no cluster engines configured,
// every role runs in this one process on embedded storage (Pebble, the
// in-memory registry and bus); with them, roles run as separate processes on
// Redis, NATS (JetStream) and Cassandra.
//
// Start takes the configuration of `parley serve` as internal/config loads
// it (the one tree, read in place) and Deps, what is not configuration (the
// log, the seams fault tests wrap); it returns a running Server, and
// Shutdown stops it (idempotent, bounded by its context). Every goroutine
// Start launches is owned by the Server and waited for by Shutdown.
package server

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	natsio "github.com/nats-io/nats.go"
	"github.com/parley-im/parley/third_party/nbio/nbhttp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	goredis "github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/internal/access"
	"github.com/parley-im/parley/internal/admin"
	"github.com/parley-im/parley/internal/attach"
	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/internal/bus"
	"github.com/parley-im/parley/internal/bus/local"
	pnats "github.com/parley-im/parley/internal/bus/nats"
	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/cluster/lease"
	"github.com/parley-im/parley/internal/cluster/limit"
	"github.com/parley-im/parley/internal/cluster/relay"
	"github.com/parley-im/parley/internal/cluster/route"
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/gateway"
	"github.com/parley-im/parley/internal/hooks"
	hjetstream "github.com/parley-im/parley/internal/hooks/jetstream"
	hpebble "github.com/parley-im/parley/internal/hooks/pebble"
	"github.com/parley-im/parley/internal/ledger"
	"github.com/parley-im/parley/internal/ledger/jetstream"
	lpebble "github.com/parley-im/parley/internal/ledger/pebble"
	"github.com/parley-im/parley/internal/metrics"
	"github.com/parley-im/parley/internal/presence"
	"github.com/parley-im/parley/internal/privatefs"
	"github.com/parley-im/parley/internal/push"
	"github.com/parley-im/parley/internal/registry"
	"github.com/parley-im/parley/internal/registry/memory"
	rredis "github.com/parley-im/parley/internal/registry/redis"
	"github.com/parley-im/parley/internal/search"
	sbleve "github.com/parley-im/parley/internal/search/bleve"
	sopensearch "github.com/parley-im/parley/internal/search/opensearch"
	"github.com/parley-im/parley/internal/snowflake"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/cassandra"
	pstore "github.com/parley-im/parley/internal/store/pebble"
	"github.com/parley-im/parley/protocol"
)

// Deps is what a node takes besides its configuration: the log, and the
// seams tests inject faults through.
type Deps struct {
	Logger *slog.Logger // nil: discard
	// StoreFS is the filesystem of the embedded engines (store, ledger,
	// webhook queue); nil: the disk under data_dir.
	StoreFS vfs.FS
	// WrapStore, if set, wraps the store the chat service uses (tests
	// inject faults with it).
	WrapStore func(store.Store) store.Store
	// WrapRegistry and WrapBus, if set, wrap the registry and bus the
	// chat service pushes through (fault tests).
	WrapRegistry func(registry.Registry) registry.Registry
	WrapBus      func(bus.Bus) bus.Bus
	// PushClient, if set, is the pusher's HTTP client to the push
	// providers (tests: one that trusts a local push service).
	PushClient *http.Client
}

// Server is a running node.
type Server struct {
	cfg  config.Config
	deps Deps
	// Read from cfg once at Start: the roles, the token keys (devKey set
	// only on the development key, which enables POST /v1/dev/token), the
	// server API's key (nil: off) and the browser origins.
	gatewayRole, chatRole bool
	auth                  auth.Config
	devKey, adminKey      []byte
	corsOrigins           Origins
	wsOrigins             Origins

	log      *slog.Logger
	now      func() time.Time
	ln       net.Listener
	streamed []streamedRoute // routes whose bodies stream (stream.go)
	engine   *nbhttp.Engine
	std      *http.Server // instead of engine in race-detector builds and with TLS
	certs    *certSource  // the certificate served; nil: plain HTTP
	hookq    hooks.Queue  // the webhook queue; nil without endpoints
	// embeddedStore is the Pebble store under s.store's checks (nil in
	// cluster mode): what a backup checkpoints.
	embeddedStore store.Store
	backupMu      sync.Mutex // one backup at a time
	reg           *prometheus.Registry
	metrics       *metrics.Metrics
	presence      *presence.Tracker
	online        *fanout.Online // online members of tracked groups (embedded)
	roster        *fanout.Roster // online members of tracked groups (cluster chat)

	// Engines; nil when the node's roles do not use them.
	store    store.Store
	ledger   ledger.Ledger
	registry registry.Registry
	bus      bus.Bus
	nc       *natsio.Conn
	redis    goredis.UniversalClient
	relay    *relay.Relay
	owner    *lease.Owner // chat role in cluster mode

	chat   *chat.Service
	attach *attach.Service // nil: no chat role, or attachments off
	access *access.Manager // banned users and revoked tokens
	admin  *admin.Server
	fanout *fanout.Fanout
	hooks  *hooks.Hooks // nil without webhook endpoints
	pusher *push.Pusher // nil without a push provider
	// search indexes plain conversations into searchIndex (nil: search
	// off, or a cluster node).
	search      *search.Indexer
	searchIndex search.Index
	backend     gateway.Backend
	verifier    gateway.Verifier
	gw          *gateway.Gateway

	bg       sync.WaitGroup // loops owned by the server
	bgCtx    context.Context
	bgCancel context.CancelFunc
	closers  []func() error // engines, closed in reverse order

	shutOnce sync.Once
	stopped  chan struct{} // closed when the stop is done
	shutErr  error         // the stop's error, set before stopped closes
	// shutMu guards shutSoFar: the errors of a stop in progress.
	shutMu    sync.Mutex
	shutSoFar error
}

// Start validates cfg (as config.Load leaves it: every setting of `parley
// serve`), resolves its keys, opens the engines, builds the roles and
// starts listening.
func Start(ctx context.Context, cfg config.Config, d Deps) (_ *Server, err error) {
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err // "config: ..."
	}
	// Read the certificate and bind before anything is written: a node
	// that cannot serve leaves no development key or empty data
	// directories behind.
	var certs *certSource
	if cfg.TLS.Enabled() {
		if certs, err = newCertSource(cfg.TLS.CertFile, cfg.TLS.KeyFile); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("server: listen: %w", err)
	}
	s, err := newServer(cfg, d)
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	s.ln, s.certs = ln, certs
	s.onClose(func() error { _ = ln.Close(); return nil })
	setNBIOLogger(d.Logger)
	s.bgCtx, s.bgCancel = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			if s.gw != nil {
				_ = s.gw.Shutdown(ctx)
			}
			s.bgCancel()
			s.bg.Wait()
			_ = s.closeEngines()
		}
	}()
	s.reg = prometheus.NewRegistry()
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.metrics = metrics.New(s.reg)

	if err := s.openEngines(ctx); err != nil {
		return nil, err
	}
	if err := s.openAccess(ctx); err != nil {
		return nil, err
	}
	if s.chatRole {
		if err := s.startChat(); err != nil {
			return nil, err
		}
	}
	if s.gatewayRole {
		if err := s.startGateway(ctx); err != nil {
			return nil, err
		}
	}
	if err := s.listen(); err != nil {
		return nil, err
	}
	if err := s.startAdmin(); err != nil {
		return nil, err
	}
	s.log.Info("parley node started", "node", cfg.NodeID, "addr", s.Addr(), "gateway", s.gatewayRole, "chat", s.chatRole, "cluster", s.clustered())
	return s, nil
}

// newServer checks cfg and reads what the node needs from it once: the
// roles, the keys and the origins.
func newServer(cfg config.Config, d Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err // "config: ..."
	}
	roles := cfg.RoleSet()
	s := &Server{cfg: cfg, deps: d, log: d.Logger, now: time.Now,
		gatewayRole: roles[config.RoleGateway], chatRole: roles[config.RoleChat],
		corsOrigins: ParseOrigins(cfg.Web.CORSOrigins), wsOrigins: ParseOrigins(cfg.Web.WSOrigins),
	}
	var err error
	if s.auth, err = cfg.ResolveAuth(); err != nil {
		return nil, err
	}
	if cfg.UsesDevKey() {
		s.devKey = s.auth.HS256Key
	}
	if s.adminKey, err = cfg.ResolveAdminKey(); err != nil {
		return nil, err
	}
	return s, nil
}

// clustered reports whether the node runs on the distributed engines.
func (s *Server) clustered() bool { return s.cfg.Cluster.Enabled() }

func (s *Server) onClose(f func() error) { s.closers = append(s.closers, f) }

func (s *Server) closeEngines() error {
	var errs []error
	for i := len(s.closers) - 1; i >= 0; i-- {
		errs = append(errs, s.closers[i]())
	}
	s.closers = nil
	return errors.Join(errs...)
}

// openEngines opens the store and ledger (chat role), the registry and the
// bus, embedded or distributed.
func (s *Server) openEngines(ctx context.Context) error {
	cfg, log := s.cfg, s.log
	if !s.clustered() {
		removeBackupTemps(cfg.DataDir)
		st, err := pstore.Open(ctx, pstore.Config{
			Dir: filepath.Join(cfg.DataDir, "store"), FS: privatefs.Wrap(s.deps.StoreFS), BucketWidth: cfg.Store.BucketWidth, Logger: log,
			ConvStates: cfg.Store.ConversationStates, ConvIdle: cfg.Store.ConversationIdle,
		})
		if err != nil {
			return fmt.Errorf("server: open store: %w", err)
		}
		s.store = st
		s.embeddedStore = store.Engine(st)
		s.onClose(st.Close)
		led, err := lpebble.Open(lpebble.Config{Dir: filepath.Join(cfg.DataDir, "ledger"), FS: privatefs.Wrap(s.deps.StoreFS), Logger: log})
		if err != nil {
			return fmt.Errorf("server: open ledger: %w", err)
		}
		s.ledger = led
		s.onClose(led.Close)
		s.registry = memory.New()
		s.bus = local.New()
		s.presence = presence.New(cfg.Presence, nil)
		s.online = fanout.NewOnline(st)
		s.runLoop(func(ctx context.Context) { s.presence.Run(ctx) })
		return nil
	}
	c := cfg.Cluster
	ns := c.Namespace
	s.redis = RedisClient(c)
	s.onClose(s.redis.Close)
	reg, err := rredis.New(s.redis, rredis.Config{Prefix: ns + ":", Logger: log})
	if err != nil {
		return fmt.Errorf("server: registry: %w", err)
	}
	s.registry = reg
	nc, err := pnats.Connect(ctx, pnats.ConnConfig{URL: c.NATS, Name: "parley-" + cfg.NodeID, Logger: log})
	if err != nil {
		return fmt.Errorf("server: nats: %w", err)
	}
	s.nc = nc
	s.onClose(func() error { nc.Close(); return nil })
	b, err := pnats.New(nc, pnats.Config{Subject: ns + ".node", Logger: log})
	if err != nil {
		return fmt.Errorf("server: bus: %w", err)
	}
	s.bus = b
	if s.chatRole {
		var leases lease.Store = lease.NewRedisStore(s.redis, ns)
		if c.Leases == "nats" {
			kv, err := lease.OpenKVStore(ctx, nc, lease.KVConfig{Bucket: LeaseBucket(ns), Replicas: c.JetStreamReplicas})
			if err != nil {
				return fmt.Errorf("server: leases: %w", err)
			}
			s.onClose(kv.Close)
			leases = kv
		}
		s.owner = lease.NewOwner(leases, lease.OwnerConfig{
			Node: cfg.NodeID, Partitions: c.Partitions, LeaseTTL: c.PartitionLease, Logger: log,
		})
		cc := cfg.Cassandra()
		cc.Logger = log
		cc.Lease = s.owner
		st, err := cassandra.Open(ctx, cc)
		if err != nil {
			return fmt.Errorf("server: open store: %w", err)
		}
		s.store = st
		s.onClose(st.Close)

		lc := LedgerConfig(ns, c.JetStreamReplicas)
		lc.Logger = log
		led, err := jetstream.Open(ctx, nc, lc)
		if err != nil {
			return fmt.Errorf("server: ledger: %w", err)
		}
		s.ledger = led
	}
	// Presence lives in the registry and Redis (relay.Relay): a gateway's
	// tracker holds the users its connections watch, a chat process's
	// roster the members of the groups it tracks; neither mirrors the
	// cluster's online users.
	var members relay.Members
	if s.chatRole {
		s.roster = fanout.NewRoster(nil, log)
		members = s.roster
	}
	s.relay = relay.New(nc, s.redis, reg, members, relay.Config{
		Namespace: ns, Node: cfg.NodeID, Shards: c.PresenceShards, LastSeenTTL: cfg.Presence.LastSeenTTL,
		Resync: c.PresenceResync, Logger: log,
	})
	if s.roster != nil {
		s.roster.Attach(s.relay)
		s.runLoop(s.roster.Run)
	}
	s.presence = presence.NewWith(cfg.Presence, s.relay, nil)
	s.runLoop(func(ctx context.Context) { s.presence.Run(ctx) })
	// What the process holds of presence follows what it serves.
	s.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "parley_presence_followed_users", Help: "Users whose presence this process follows: watched by its connections or members of its tracked groups.",
	}, func() float64 { n, _ := s.relay.Followed(); return float64(n) }))
	s.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "parley_presence_shard_subscriptions", Help: "Presence shard subjects this process subscribes to (of cluster.presence_shards).",
	}, func() float64 { _, n := s.relay.Followed(); return float64(n) }))
	if s.roster != nil {
		s.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "parley_online_index_users", Help: "Members of tracked groups in the chat role's online index.",
		}, func() float64 { n, _ := s.roster.Size(); return float64(n) }))
	}
	s.runLoop(func(ctx context.Context) {
		if err := s.relay.Run(ctx); err != nil {
			s.log.Error("presence relay stopped", "err", err)
		}
	})
	return nil
}

// LeaseBucket is the JetStream KV bucket of namespace ns's partition
// leases (cluster.leases nats).
func LeaseBucket(ns string) string { return strings.ToUpper(ns) + "_LEASES" }

// LedgerConfig names the JetStream streams and subjects of namespace ns's
// compensation ledger.
func LedgerConfig(ns string, replicas int) jetstream.Config {
	return jetstream.Config{Stream: strings.ToUpper(ns) + "_TASKS", Subject: ns + ".tasks", DeadSubject: ns + ".dead", Replicas: replicas}
}

// PushNamespace is the namespace of the push queue's JetStream streams
// (internal/hooks/jetstream) in namespace ns.
func PushNamespace(ns string) string { return ns + ".push" }

// RedisClient returns the client of cluster mode's Redis: a plain client
// of c.Redis, or with c.RedisSentinels go-redis's failover client, which
// asks the Sentinels for the primary of the master named c.Redis and
// follows a failover to the promoted replica.
func RedisClient(c config.Cluster) goredis.UniversalClient {
	if c.RedisSentinels == "" {
		return goredis.NewClient(&goredis.Options{Addr: c.Redis})
	}
	var addrs []string
	for _, a := range strings.Split(c.RedisSentinels, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	return goredis.NewFailoverClient(&goredis.FailoverOptions{MasterName: c.Redis, SentinelAddrs: addrs})
}

// runLoop runs f on a goroutine owned by the server until Shutdown.
func (s *Server) runLoop(f func(ctx context.Context)) {
	s.bg.Add(1)
	go func() { defer s.bg.Done(); f(s.bgCtx) }()
}

func (s *Server) startChat() error {
	cfg, d, m := s.cfg, s.deps, s.metrics
	var online fanout.Index = s.online
	if s.relay != nil {
		online = onlineIndex{fanout.NewScoped(s.roster, s.owner.Epoch), s.relay}
	}
	chatStore := s.store
	if d.WrapStore != nil {
		chatStore = d.WrapStore(chatStore)
	}
	var lim chat.Limiter
	if s.redis != nil {
		lim = limit.New(s.redis, cfg.Cluster.Namespace+":lim:")
	}
	// In cluster mode the Snowflake node number is leased in Redis: a
	// configured one held by another live node refuses the start.
	nodeNumber := cfg.SnowflakeNode()
	if s.redis != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		nn, err := lease.TakeNodeNumber(ctx, s.redis, cfg.Cluster.Namespace, cfg.NodeID, cfg.NodeNumber, s.log)
		cancel()
		if err != nil {
			return fmt.Errorf("server: %w", err)
		}
		nodeNumber = nn.Number()
		s.log.Info("snowflake node number leased", "node_number", nodeNumber)
		s.runLoop(nn.Run)
	}
	chatReg, chatBus := s.registry, s.bus
	if d.WrapRegistry != nil {
		chatReg = d.WrapRegistry(chatReg)
	}
	if d.WrapBus != nil {
		chatBus = d.WrapBus(chatBus)
	}
	consumers, err := s.consumers(chatStore)
	if err != nil {
		return err
	}
	// The fan-out of every stored message after its ACK, and the
	// consumers that hang off it.
	fan, err := fanout.New(cfg.Fanout, fanout.Deps{
		Store: chatStore, Registry: chatReg, Bus: chatBus, Ledger: s.ledger, Online: online,
		Tiers: cfg.Chat.Tiers(), Logger: s.log, Consumers: consumers,
		Observer: fanout.Observer{
			Pushed: func(n int) { m.Pushes.Add(float64(n)) },
			Fanout: func(tier string, rows, pushes int) {
				m.FanoutMessages.WithLabelValues(tier).Inc()
				m.FanoutRows.WithLabelValues(tier).Add(float64(rows))
				m.FanoutPushes.WithLabelValues(tier).Add(float64(pushes))
			},
			Compensated: func(kind string) { m.Compensations.WithLabelValues(kind).Inc() },
		},
	})
	if err != nil {
		return err
	}
	ktLog, err := s.openKT(chatStore)
	if err != nil {
		return err
	}
	// One id generator for messages and attachments, so their ids never
	// collide.
	ids := snowflake.New(nodeNumber, nil)
	att, err := s.openAttach(chatStore, ids)
	if err != nil {
		return err
	}
	svc, err := chat.New(cfg.ChatConfig(), chat.Deps{
		Store: chatStore, IDs: ids, Logger: s.log, Limiter: lim, Fanout: fan, KT: ktLog, Attach: att,
		Search: s.searchIndex, SearchLimits: cfg.Search.Limits(),
		Observer: chat.Observer{
			Stored:      func(d time.Duration) { m.Stored.Inc(); m.SendAck.Observe(d.Seconds()) },
			StoreFailed: func(op string) { m.StoreErrors.WithLabelValues(op).Inc() },
			Snapshot:    func(n int) { m.SnapshotConv.Observe(float64(n)) },
			Shed:        func() { m.Shed.Inc() },
		},
	})
	if err != nil {
		return err
	}
	s.chat = svc
	s.fanout = fan
	s.runLoop(fan.Run)
	if att != nil {
		s.attach = att
		s.runLoop(att.Run) // the GC of expired and deleted files, thumbnails
	}
	if s.hooks != nil {
		s.runLoop(s.hooks.Run)
	}
	if s.search != nil {
		s.runLoop(s.search.Run)
	}
	if s.pusher != nil {
		s.runLoop(s.pusher.Run)
	}
	// Delivered positions live in memory; the loop flushes them in batches
	// and once more when the server stops, before the store closes.
	s.runLoop(svc.RunPositions)
	s.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "parley_fanout_backlog", Help: "Stored messages whose fan-out is queued or running in this process.",
	}, func() float64 { return float64(fan.Backlog()) }))
	s.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "parley_fanout_lag_seconds", Help: "How long the oldest message queued or being fanned out in this process has waited since its ACK: how far delivery is behind the acknowledgements.",
	}, func() float64 { return fan.Lag().Seconds() }))
	s.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "parley_compensation_backlog", Help: "Compensation tasks waiting for a successful retry.",
	}, func() float64 { return float64(s.ledger.Backlog()) }))
	if ktLog != nil {
		s.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "parley_kt_leaves", Help: "Leaves of the key transparency log this chat process has read or appended.",
		}, func() float64 { return float64(ktLog.Size()) }))
	}
	if cs, ok := s.store.(interface{ ConvStates() (int, uint64) }); ok {
		// The bounded per-conversation state (store.conversation_states).
		s.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "parley_conversation_states", Help: "Conversations whose state the store keeps in memory (bounded by store.conversation_states).",
		}, func() float64 { n, _ := cs.ConvStates(); return float64(n) }))
		s.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "parley_conversation_states_evicted_total", Help: "Conversation states evicted from memory (idle or least recently used).",
		}, func() float64 { _, n := cs.ConvStates(); return float64(n) }))
	}
	s.runLoop(func(ctx context.Context) {
		if err := s.ledger.Run(ctx, fan.Compensate); err != nil && ctx.Err() == nil {
			s.log.Error("compensation ledger stopped", "err", err)
		}
	})
	if s.nc != nil {
		s.runLoop(func(ctx context.Context) {
			err := route.Serve(ctx, route.ServeConfig{
				Conn: s.nc, Namespace: cfg.Cluster.Namespace, Service: svc, Owner: s.owner,
				Timeout: cfg.Gateway.RequestTimeout, MaxInflight: cfg.Cluster.ChatMaxInflight, Logger: s.log,
			})
			if err != nil {
				s.log.Error("chat service stopped serving", "err", err)
			}
		})
		s.runLoop(s.owner.Run)
	}
	return nil
}

// consumers are what hangs off every stored message after its fan-out:
// the search indexer on an embedded node, the webhooks with endpoints
// configured. A new consumer is wired here.
func (s *Server) consumers(chatStore store.Store) ([]fanout.Consumer, error) {
	var cs []fanout.Consumer
	if ix, err := s.openSearch(); err != nil {
		return nil, err
	} else if ix != nil {
		cs = append(cs, ix)
	}
	if s.cfg.Push.Enabled() {
		p, err := s.openPusher(chatStore)
		if err != nil {
			return nil, err
		}
		cs = append(cs, p)
	}
	if len(s.cfg.Webhooks.Endpoints) == 0 {
		return cs, nil
	}
	// The webhook queue: a Pebble database of its own on an embedded
	// node, the shared JetStream streams in cluster mode
	// (docs/webhooks.md); the fan-out only writes to it.
	q, err := s.openHookQueue()
	if err != nil {
		return nil, err
	}
	s.hookq = q
	h, err := hooks.New(s.cfg.Webhooks, hooks.Options{Queue: q, Members: chatStore, Logger: s.log})
	if err != nil {
		q.Close()
		return nil, err
	}
	s.hooks = h
	s.onClose(h.Close)
	s.registerHookMetrics(h)
	return append(cs, h), nil
}

// openSearch opens the search index and its indexer with search on: Bleve
// in data_dir/search on an embedded node, OpenSearch at
// search.opensearch_url in cluster mode (nil without it: the node answers
// search with search_unavailable). The indexer's loop starts with the
// node's other loops.
func (s *Server) openSearch() (*search.Indexer, error) {
	if !s.cfg.Search.Enabled {
		return nil, nil
	}
	st, ok := s.store.(search.Store)
	if !ok {
		return nil, nil
	}
	var x search.Index
	if s.owner == nil {
		bx, err := sbleve.Open(filepath.Join(s.cfg.DataDir, "search"))
		if err != nil {
			return nil, fmt.Errorf("server: search index: %w", err)
		}
		x = bx
	} else {
		if s.cfg.Search.OpenSearchURL == "" {
			return nil, nil
		}
		urls, err := search.SplitURLs(s.cfg.Search.OpenSearchURL)
		if err != nil {
			return nil, fmt.Errorf("server: search.opensearch_url: %w", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		ox, err := sopensearch.Open(ctx, sopensearch.Config{URLs: urls, Prefix: s.cfg.Cluster.Namespace + "-search",
			Shards: s.cfg.Search.OpenSearchShards, Replicas: s.cfg.Search.OpenSearchReplicas})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("server: search index: %w", err)
		}
		x = ox
	}
	s.onClose(x.Close)
	lag := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "parley_search_index_lag_seconds", Help: "From a message's server time to its being searchable in the search index.",
		Buckets: []float64{.01, .05, .1, .25, .5, 1, 2, 5, 10, 30, 60, 300},
	})
	failures := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "parley_search_index_failures_total", Help: "Indexing rounds that failed (the index or the store) and are retried.",
	})
	var owns func(uint64) bool
	if s.owner != nil {
		n := s.owner.Partitions()
		owns = func(conv uint64) bool { return s.owner.Holds(lease.Partition(conv, n)) }
	}
	ix := search.NewIndexer(search.IndexerOptions{Index: x, Store: st, Logger: s.log, Batch: s.cfg.Search.Batch, Owns: owns,
		Observer: search.IndexerObserver{Indexed: func(d time.Duration) { lag.Observe(d.Seconds()) }, Failed: failures.Inc}})
	s.reg.MustRegister(lag, failures,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "parley_search_pending_conversations", Help: "Conversations with messages not yet in the search index.",
		}, func() float64 { return float64(ix.Pending()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "parley_search_indexed_total", Help: "Messages written into the search index.",
		}, func() float64 { return float64(ix.Indexed()) }))
	if s.owner != nil {
		// A partition taken over may hold conversations its last owner
		// noted and never indexed (it died): a catch-up finds them.
		s.owner.Watch(func(_ int, held bool) {
			if held {
				ix.Rescan()
			}
		})
	}
	s.search, s.searchIndex = ix, x
	return ix, nil
}

// openPusher opens the pusher on a queue of its own: a Pebble database at
// data_dir/push on an embedded node, JetStream streams under the
// namespace <ns>.push in cluster mode (each partition sent by its owner).
func (s *Server) openPusher(chatStore store.Store) (*push.Pusher, error) {
	cfg := s.cfg
	var q hooks.Queue
	var err error
	if s.owner == nil {
		q, err = hpebble.Open(hpebble.Config{Dir: filepath.Join(cfg.DataDir, "push"), FS: privatefs.Wrap(s.deps.StoreFS), Logger: s.log})
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		q, err = hjetstream.Open(ctx, hjetstream.Config{NATS: s.nc, Namespace: PushNamespace(cfg.Cluster.Namespace), Replicas: cfg.Cluster.JetStreamReplicas,
			Owner: s.owner, Node: cfg.NodeID, AckWait: max(time.Minute, 2*cfg.Push.MaxBackoff), Logger: s.log})
		cancel()
	}
	if err != nil {
		return nil, fmt.Errorf("push: queue: %w", err)
	}
	p, err := push.New(cfg.Push, push.Options{Queue: q, Store: chatStore, Logger: s.log, Client: s.deps.PushClient})
	if err != nil {
		q.Close()
		return nil, err
	}
	s.pusher = p
	s.onClose(p.Close)
	s.registerPushMetrics(p)
	return p, nil
}

// registerPushMetrics exports the pusher's counters per provider, its
// queue and the delay from a message to its provider request.
func (s *Server) registerPushMetrics(p *push.Pusher) {
	for i, st := range p.Stats() {
		l := prometheus.Labels{"provider": st.Provider}
		get := func(f func(push.Stats) int64) func() float64 {
			return func() float64 { return float64(f(p.Stats()[i])) }
		}
		s.reg.MustRegister(
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "parley_push_sent_total", Help: "Notifications the provider accepted.", ConstLabels: l},
				get(func(x push.Stats) int64 { return x.Sent })),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "parley_push_failed_total", Help: "Notification requests that failed (retried, or refused for good).", ConstLabels: l},
				get(func(x push.Stats) int64 { return x.Failed })),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "parley_push_tokens_removed_total", Help: "Registrations removed because the provider called the token unregistered.", ConstLabels: l},
				get(func(x push.Stats) int64 { return x.Removed })),
		)
	}
	lag := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "parley_push_lag_seconds", Help: "Delay from a message's server time to its notification's provider request.",
		Buckets: []float64{.05, .1, .25, .5, 1, 2, 5, 10, 30, 60, 300}})
	p.Lag = func(d time.Duration) { lag.Observe(d.Seconds()) }
	s.reg.MustRegister(lag,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "parley_push_backlog", Help: "Notification events queued (cluster mode: the shared stream)."},
			func() float64 { b, _ := p.Backlog(); return float64(b) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "parley_push_dead", Help: "Notification events given up after their last attempt."},
			func() float64 { _, d := p.Backlog(); return float64(d) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "parley_push_collapsed_total", Help: "Notification events superseded by a later message of their conversation."},
			func() float64 { return float64(p.Collapsed()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "parley_push_suppressed_total", Help: "Users' notifications not sent: the user muted the conversation (reason muted) or was in do-not-disturb (dnd).", ConstLabels: prometheus.Labels{"reason": "muted"}},
			func() float64 { m, _ := p.Suppressed(); return float64(m) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "parley_push_suppressed_total", Help: "Users' notifications not sent: the user muted the conversation (reason muted) or was in do-not-disturb (dnd).", ConstLabels: prometheus.Labels{"reason": "dnd"}},
			func() float64 { _, d := p.Suppressed(); return float64(d) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "parley_push_rate_limited_total", Help: "Notifications a device's rate limit (push.device_rate) held, to be coalesced into its next one."},
			func() float64 { return float64(p.RateLimited()) }),
	)
}

// openHookQueue opens the webhook queue: a Pebble database of its own on
// an embedded node, the JetStream streams every chat process shares in
// cluster mode.
func (s *Server) openHookQueue() (hooks.Queue, error) {
	cfg := s.cfg
	if s.owner == nil {
		return hpebble.Open(hpebble.Config{Dir: filepath.Join(cfg.DataDir, "webhooks"), FS: privatefs.Wrap(s.deps.StoreFS), Logger: s.log})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return hjetstream.Open(ctx, hjetstream.Config{NATS: s.nc, Namespace: cfg.Cluster.Namespace, Replicas: cfg.Cluster.JetStreamReplicas,
		Owner: s.owner, Node: cfg.NodeID, AckWait: cfg.Webhooks.RedeliverAfter(), Logger: s.log})
}

// registerHookMetrics exports the webhook endpoints' counters.
func (s *Server) registerHookMetrics(h *hooks.Hooks) {
	for i, st := range h.Stats() {
		l := prometheus.Labels{"endpoint": st.Endpoint}
		get := func(f func(hooks.Stats) int64) func() float64 {
			return func() float64 { return float64(f(h.Stats()[i])) }
		}
		s.reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "parley_webhook_backlog", Help: "Webhook events queued for the endpoint (cluster mode: the shared stream, the same figure on every chat process).", ConstLabels: l},
				get(func(x hooks.Stats) int64 { return x.Backlog })),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "parley_webhook_delivered_total", Help: "Webhook events the endpoint acknowledged (2xx).", ConstLabels: l},
				get(func(x hooks.Stats) int64 { return x.Delivered })),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "parley_webhook_failed_attempts_total", Help: "Webhook attempts that failed (error, timeout, not 2xx).", ConstLabels: l},
				get(func(x hooks.Stats) int64 { return x.Failed })),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "parley_webhook_dead", Help: "Webhook events in the endpoint's dead letters (cluster mode: the shared stream, the same figure on every chat process).", ConstLabels: l},
				get(func(x hooks.Stats) int64 { return x.Dead })),
		)
	}
}

// Search exposes the node's search indexer and index (nil: none).
func (s *Server) Search() (*search.Indexer, search.Index) { return s.search, s.searchIndex }

// Hooks exposes the node's webhooks (nil without endpoints).
func (s *Server) Hooks() *hooks.Hooks { return s.hooks }

// onlineIndex is the fan-out's online index in cluster mode: the
// process's roster, its groups trusted only under the ownership epoch they
// were built in (fanout.Scoped), with joins and leaves also relayed to the
// other chat processes' rosters (best effort).
type onlineIndex struct {
	*fanout.Scoped
	relay *relay.Relay
}

func (o onlineIndex) Joined(conv uint64, members []store.Member) {
	o.Scoped.Joined(conv, members)
	o.relay.Joined(conv, members)
}

func (o onlineIndex) Left(conv uint64, users []string) {
	o.Scoped.Left(conv, users)
	o.relay.Left(conv, users)
}

// hub is the gateway's presence: the node's tracker, plus on an embedded
// node the online index the tracker's connects and disconnects feed (in
// cluster mode the tracker's directory tells the chat processes).
type hub struct {
	*presence.Tracker
	online *fanout.Online
}

func (h hub) Connected(ctx context.Context, user string) {
	h.Tracker.Connected(ctx, user)
	if h.online != nil {
		h.online.Connected(ctx, user)
	}
}

func (h hub) Disconnected(user string) {
	h.Tracker.Disconnected(user)
	if h.online != nil {
		h.online.Disconnected(user)
	}
}

// hub returns the gateway's presence hub.
func (s *Server) hub() hub {
	h := hub{Tracker: s.presence}
	if s.relay == nil {
		h.online = s.online
	}
	return h
}

func (s *Server) startGateway(ctx context.Context) error {
	cfg, m := s.cfg, s.metrics
	tv, err := auth.NewVerifier(s.auth)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	v := reserving{Verifier: tv, user: s.reservedUser()}
	s.verifier = v
	var mayWatch gateway.MayWatch
	switch {
	case s.chat != nil && s.owner != nil:
		r := route.NewRemote(s.nc, cfg.Cluster.Namespace, cfg.Gateway.RequestTimeout, cfg.Cluster.Partitions)
		s.backend, mayWatch = route.Routed{Local: s.chat, Remote: r, Owner: s.owner}, s.chat.SharesConversation
	case s.chat != nil:
		s.backend, mayWatch = s.chat, s.chat.SharesConversation
	default:
		r := route.NewRemote(s.nc, cfg.Cluster.Namespace, cfg.Gateway.RequestTimeout, cfg.Cluster.Partitions)
		s.backend, mayWatch = r, r.MayWatch
	}
	gcfg, err := s.gatewayConfig()
	if err != nil {
		return err
	}
	gcfg.SessionPrefix = cfg.NodeID + "-" + nonce()
	if err := s.dropPredecessor(ctx); err != nil {
		return fmt.Errorf("server: registry: %w", err)
	}
	s.gw, err = gateway.New(gcfg, gateway.Deps{
		Backend: s.backend, Verifier: v, Registry: s.registry, Bus: s.bus, Logger: s.log,
		Presence: s.hub(), MayWatch: mayWatch, Access: s.access.List(),
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
		return err
	}
	// Bans and revocations close the node's sessions as soon as the list
	// changes here, whoever changed it.
	s.access.OnChange(s.gw.Enforce)
	if rr, ok := s.registry.(*rredis.Registry); ok {
		s.runLoop(func(ctx context.Context) { s.refreshLease(ctx, rr) })
	}
	return nil
}

// dropPredecessor clears what a previous process of this node left in
// the registry (it died without unregistering) and, in cluster mode,
// records those users offline with a last seen and tells their followers.
func (s *Server) dropPredecessor(ctx context.Context) error {
	rr, ok := s.registry.(*rredis.Registry)
	if !ok || s.relay == nil {
		return s.registry.DropNode(ctx, s.cfg.NodeID)
	}
	users, err := rr.DropNodeUsers(ctx, s.cfg.NodeID)
	if err != nil {
		return err
	}
	if len(users) > 0 {
		s.log.Info("registry: devices left by this node's previous process dropped", "users", len(users))
		s.relay.Gone(ctx, users)
	}
	return nil
}

// refreshLease keeps this gateway's registry entries alive. If the lease
// was lost (the node was cut off long enough for others to consider it
// dead, or a Redis failover or restart lost it), the open sessions are
// registered again under a new lease and announced online, so they stay
// connected and pushes reach them again; only if that fails are they
// closed, so their clients reconnect and register again.
func (s *Server) refreshLease(ctx context.Context, r *rredis.Registry) {
	tick := time.NewTicker(r.TTL() / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		err := r.Refresh(ctx, s.cfg.NodeID)
		switch {
		case errors.Is(err, rredis.ErrLeaseLost):
			s.restoreRegistry(ctx, r)
		case err != nil && ctx.Err() == nil:
			s.log.Warn("registry refresh failed; retrying", "err", err)
		}
	}
}

// restoreRegistry registers this gateway's open sessions again after
// its registry lease was lost.
func (s *Server) restoreRegistry(ctx context.Context, r *rredis.Registry) {
	entries := s.gw.Registered()
	rctx, cancel := context.WithTimeout(ctx, r.TTL()/3)
	users, err := r.Restore(rctx, s.cfg.NodeID, entries)
	cancel()
	if err != nil {
		s.log.Warn("registry lease lost and the sessions could not be registered again; closing them so they reconnect", "sessions", len(entries), "err", err)
		s.gw.CloseAll(protocol.CloseGoingAway, "session registry lease lost")
		return
	}
	s.log.Warn("registry lease lost (Redis failover or restart); open sessions registered again", "sessions", len(entries), "restored", len(users))
	slices.Sort(users)
	users = slices.Compact(users)
	for _, u := range users {
		s.presence.Connected(ctx, u)
	}
}

func nonce() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// gatewayConfig is the gateway's configuration; on a node with the chat
// role, hello announces attachments only if the node serves them. Hello
// announces the VAPID public key of push.webpush.vapid_key_file, and the
// reactions of chat.reactions.
func (s *Server) gatewayConfig() (gateway.Config, error) {
	g := s.cfg.GatewayConfig()
	if s.chatRole && s.attach == nil {
		g.MaxFileBytes, g.PartBytes = 0, 0
	}
	g.Reactions, g.ReactionsPerUser = strings.Fields(s.cfg.Chat.Reactions), s.cfg.Chat.ReactionsPerUser
	if f := s.cfg.Push.WebPush.VAPIDKeyFile; f != "" {
		k, err := push.VAPIDPublicKey(f)
		if err != nil {
			return g, err
		}
		g.WebPushKey = k
	}
	return g, nil
}

func (s *Server) listen() error {
	gcfg, err := s.gatewayConfig()
	if err != nil {
		return err
	}
	var ln net.Listener = s.ln // bound by Start
	if s.gw != nil {
		// Per-source pacing before anything reads the connection.
		ln = gateway.PaceSources(ln, gcfg, s.log)
		s.onClose(func() error { _ = ln.Close(); return nil })
	}
	mux := http.NewServeMux()
	if s.gw != nil {
		mux.Handle("GET /v1/ws", s.gw)
		mux.HandleFunc("GET /v1/poll", s.gw.ServePoll)
		mux.HandleFunc("POST /v1/rpc", s.gw.ServeRPC)
		mux.HandleFunc("GET /v1/conversations/snapshot", s.handleSnapshot)
		s.routeKT(mux)
	}
	if s.embeddedUploads() {
		// Parts are read as they arrive, never held whole.
		mux.Handle("PUT "+attach.UploadPrefix, s.attach.UploadHandler())
		s.streamRoute(http.MethodPut, attach.UploadPrefix, s.cfg.Attach.PartBytes)
		// Downloads: signed URLs, the window checked on every request.
		mux.Handle("GET "+attach.ContentPath, s.attach.ContentHandler())
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", s.handleReady)
	if s.cfg.Metrics.Enabled {
		mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	}
	if s.gw != nil {
		s.routeWeb(mux)
	}
	var handler http.Handler = s.browserGuard(mux)
	if s.gw != nil {
		handler = s.gw.Track(handler)
	}
	if s.certs != nil {
		// TLS runs on net/http and crypto/tls: a goroutine per connection
		// (docs/deploy.md, "TLS", gives the cost); the event loop serves
		// plain connections only.
		s.std = gateway.StdServer(gcfg, handler)
		s.std.TLSConfig = s.certs.config()
		go func() { _ = s.std.Serve(tls.NewListener(ln, s.std.TLSConfig)) }()
		return nil
	}
	if stdServer {
		s.std = gateway.StdServer(gcfg, handler)
		go func() { _ = s.std.Serve(ln) }()
		return nil
	}
	ecfg := gateway.EngineConfig(gcfg, ln, handler)
	ecfg.StreamBody = s.streamsBody
	s.engine = nbhttp.NewEngine(ecfg)
	if s.gw != nil {
		s.gw.Attach(s.engine)
	}
	if err := s.engine.Start(); err != nil {
		return fmt.Errorf("server: start engine: %w", err)
	}
	return nil
}

// openAccess loads the access list: a file in the data directory for an
// embedded node, a Redis hash shared by the cluster's processes (polled,
// so a change made anywhere reaches every gateway within
// access.PollEvery).
func (s *Server) openAccess(ctx context.Context) error {
	var st access.Store
	if s.redis != nil {
		st = access.NewRedis(s.redis, s.cfg.Cluster.Namespace+":")
	} else {
		fst, err := access.OpenFile(filepath.Join(s.cfg.DataDir, "access.json"))
		if err != nil {
			return fmt.Errorf("server: %w", err)
		}
		st = fst
	}
	m, err := access.NewManager(ctx, st, s.now, s.log)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	s.access = m
	if s.redis != nil {
		s.runLoop(m.Run)
	}
	return nil
}

// startAdmin serves the server API if configured.
func (s *Server) startAdmin() error {
	if s.adminKey == nil {
		return nil
	}
	cfg := s.cfg
	if s.chat == nil {
		return errors.New("server: the admin API needs the chat role on this node")
	}
	var svc admin.Chat = s.chat
	if s.owner != nil {
		// Cluster mode: each conversation write runs on its partition's owner.
		svc = route.NewAdmin(s.chat, s.owner, s.nc, cfg.Cluster.Namespace, s.chat.Limits(), cfg.Gateway.RequestTimeout)
	}
	deps := admin.Deps{Chat: svc, Access: s.access, Disconnect: s.disconnect, Limits: cfg.Limits, Logger: s.log, Now: s.now}
	if s.attach != nil {
		// Records and blobs are shared by every chat process: any of them
		// lists and deletes.
		deps.Attachments = s.attach
	}
	if !s.clustered() {
		deps.Backup = s.Backup
	}
	if s.search != nil {
		deps.Reindex = s.search.Reindex
	}
	a, err := admin.New(admin.Config{Listen: cfg.Admin.Listen, Key: s.adminKey, Actor: cfg.Admin.Actor, RequestTimeout: cfg.Gateway.RequestTimeout}, deps)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	if err := a.Start(); err != nil {
		return fmt.Errorf("server: %w", err)
	}
	s.admin = a
	s.log.Info("admin API listening", "addr", a.Addr())
	return nil
}

// AdminAddr is the admin API's address ("" when it is off).
func (s *Server) AdminAddr() string {
	if s.admin == nil {
		return ""
	}
	return s.admin.Addr()
}

// disconnect closes user's sessions (of device, if set) on every gateway
// the registry knows them on, through the bus (the node's own included).
func (s *Server) disconnect(ctx context.Context, user, device string) (int, error) {
	online, err := s.registry.Lookup(ctx, []string{user})
	if err != nil {
		return 0, err
	}
	nodes := map[string]bool{}
	n := 0
	for _, e := range online[user] {
		if device == "" || e.Device == device {
			nodes[e.Node] = true
			n++
		}
	}
	var errs []error
	for node := range nodes {
		err := s.bus.Publish(ctx, node, bus.Delivery{Kick: &bus.Kick{User: user, Device: device, Code: protocol.CloseDisconnected}})
		if err != nil && !errors.Is(err, bus.ErrNoSubscriber) {
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}

// Addr is the address the node listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// TLS reports whether the node serves HTTPS and WSS.
func (s *Server) TLS() bool { return s.certs != nil }

// ReloadTLS reads the certificate and key files again (serve calls it on
// SIGHUP). New handshakes get the new certificate; on an error the node
// keeps serving the one it had. Without TLS it does nothing.
func (s *Server) ReloadTLS() error {
	if s.certs == nil {
		return nil
	}
	if err := s.certs.Reload(); err != nil {
		return err
	}
	s.log.Info("tls certificate loaded", "cert_file", s.cfg.TLS.CertFile, "not_after", s.certs.NotAfter())
	return nil
}

// Metrics exposes the node's collectors (for tests and benchmarks).
func (s *Server) Metrics() *metrics.Metrics { return s.metrics }

// Gateway exposes the node's gateway (nil on a chat-only node).
func (s *Server) Gateway() *gateway.Gateway { return s.gw }

// Chat returns the chat service (nil without the chat role), for
// in-process drivers such as the churn benchmark (internal/churn).
func (s *Server) Chat() *chat.Service { return s.chat }

// Store returns the message store (nil without the chat role).
func (s *Server) Store() store.Store { return s.store }

func (s *Server) handleReady(w http.ResponseWriter, _ *http.Request) {
	if s.gw != nil && s.gw.Draining() {
		http.Error(w, "draining", http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write([]byte("ready\n"))
}

// Drain tells clients to move and waits for them, bounded by ctx and the
// gateway's drain timeout. A chat-only node has nothing to drain.
func (s *Server) Drain(ctx context.Context) {
	if s.gw != nil {
		s.gw.Drain(ctx)
	}
}

// Shutdown stops the node: connections are closed, the listener and the
// event loop stop, the server's loops end, and the engines are closed. Call
// Drain first for a graceful stop.
//
// Shutdown is bounded by ctx. The stop runs on a goroutine the Server
// owns; if ctx ends before it is done, Shutdown returns ctx's error joined
// with what the stop reported so far, and the loops still ending and the
// engines' closing go on in the background, with nothing left running
// once they are done. It is idempotent and safe to call concurrently:
// every call waits (each bounded by its own ctx) for the same stop and,
// once it is done, returns its error.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutOnce.Do(func() {
		s.stopped = make(chan struct{})
		go func() {
			defer close(s.stopped)
			s.stop(ctx)
		}()
	})
	select {
	case <-s.stopped:
		return s.shutErr
	case <-ctx.Done():
	}
	select {
	case <-s.stopped: // done in the same instant
		return s.shutErr
	default:
	}
	s.shutMu.Lock()
	defer s.shutMu.Unlock()
	return errors.Join(fmt.Errorf("server: shutdown: %w", ctx.Err()), s.shutSoFar)
}

// stop runs Shutdown's steps in order; ctx bounds those that wait on
// clients or the network (the admin API, the gateway's connections, the
// registry), not the end of the loops and the closing of the engines,
// which must happen however long they take.
func (s *Server) stop(ctx context.Context) {
	var errs []error
	if s.admin != nil {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := s.admin.Shutdown(actx); err != nil {
			s.log.Warn("admin API: shutdown", "err", err)
		}
		cancel()
	}
	if s.gw != nil {
		if err := s.gw.Shutdown(ctx); err != nil {
			errs = append(errs, err)
			s.noteShutdown(err)
		}
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if err := s.registry.DropNode(dctx, s.cfg.NodeID); err != nil {
			s.log.Warn("registry: drop node", "err", err)
		}
		cancel()
	}
	if s.engine != nil {
		s.engine.Stop()
	}
	if s.std != nil {
		_ = s.std.Close()
	}
	s.bgCancel()
	s.bg.Wait()
	errs = append(errs, s.closeEngines())
	s.shutErr = errors.Join(errs...)
}

// noteShutdown records an error of a stop still in progress, for a
// Shutdown whose context ends first.
func (s *Server) noteShutdown(err error) {
	s.shutMu.Lock()
	defer s.shutMu.Unlock()
	s.shutSoFar = errors.Join(s.shutSoFar, err)
}

// reservedUser is the user id no token may carry: the server API's actor
// (admin.actor), so that no client can send as the operator, whether or
// not the API is served.
func (s *Server) reservedUser() string { return s.cfg.Admin.Actor }

// reserving refuses tokens of the reserved user id (the server API's
// actor) as invalid, on every path a gateway authenticates.
type reserving struct {
	*auth.Verifier
	user string
}

func (r reserving) Verify(token string, now time.Time) (auth.Identity, error) {
	id, err := r.Verifier.Verify(token, now)
	if err == nil && id.User == r.user {
		return auth.Identity{}, fmt.Errorf("verify: user id %q is reserved for the server API: %w", r.user, auth.ErrInvalid)
	}
	return id, err
}
