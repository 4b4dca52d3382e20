// Package config owns the configuration of `parley serve`: one Config for
// the whole server, its defaults, its validation, and Load, which layers, in
// increasing precedence, defaults < YAML file < PARLEY_* environment
// variables < command-line flags.
//
// Every setting has one dotted path, its YAML key (gateway.idle_timeout),
// from which the other two names follow: the variable PARLEY_ + the path in
// upper snake case (PARLEY_GATEWAY_IDLE_TIMEOUT) and the flag with dashes
// for underscores (--gateway.idle-timeout). Durations are Go durations
// ("25s") everywhere.
//
// This is the only package that defines flags; libraries take their own
// Config structs, filled from this one by cmd/parley.
//
// Concurrency: a Config is a plain value; Load and Validate keep no state.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/protocol"
)

// ErrInvalid is wrapped by every error Validate returns.
var ErrInvalid = errors.New("invalid configuration")

// Roles a node can run.
const (
	RoleAll     = "all"
	RoleGateway = "gateway"
	RoleChat    = "chat"
)

// Read scopes: whether a read receipt moves the read position of the user
// (all devices) or only of the device that read.
const (
	ReadScopeUser   = "user"
	ReadScopeDevice = "device"
)

// Log formats.
const (
	LogText = "text"
	LogJSON = "json"
)

// Config is the whole server's configuration.
type Config struct {
	Listen  string `yaml:"listen"`
	DataDir string `yaml:"data_dir"`
	// NodeID names this node to its peers. Empty means derived from the
	// host name and the listen port (see Load), which is stable across
	// restarts as long as neither changes.
	NodeID string `yaml:"node_id"`
	// Roles is "all" or a comma-separated list of roles.
	Roles   string  `yaml:"roles"`
	Log     Log     `yaml:"log"`
	Auth    Auth    `yaml:"auth"`
	Gateway Gateway `yaml:"gateway"`
	Limits  Limits  `yaml:"limits"`
	Chat    Chat    `yaml:"chat"`
	Metrics Metrics `yaml:"metrics"`
	Web     Web     `yaml:"web"`
	// Cluster names the distributed engines; empty runs on embedded ones.
	Cluster Cluster `yaml:"cluster"`
}

// Cluster configures cluster mode: roles as separate processes on Redis
// (registry, presence leases, limits), NATS with JetStream (routing between
// nodes, compensation tasks) and Cassandra/ScyllaDB (messages and rows).
type Cluster struct {
	Redis string `yaml:"redis"` // host:port
	NATS  string `yaml:"nats"`  // nats://host:port[,nats://...]
	// CassandraHosts are contact points, comma-separated host[:port].
	CassandraHosts string `yaml:"cassandra_hosts"`
	Keyspace       string `yaml:"keyspace"`
	// ReplicationFactor of the keyspace `parley migrate` creates.
	ReplicationFactor int `yaml:"replication_factor"`
	// Consistency of Cassandra reads and writes (QUORUM, LOCAL_QUORUM, ...).
	Consistency string `yaml:"consistency"`
	// SerialConsistency of Cassandra lightweight transactions: SERIAL, or
	// LOCAL_SERIAL for a multi-datacenter deployment.
	SerialConsistency string `yaml:"serial_consistency"`
	// JetStreamReplicas of the compensation task streams (3 on a NATS
	// cluster).
	JetStreamReplicas int `yaml:"jetstream_replicas"`
	// Namespace prefixes the deployment's NATS subjects, JetStream streams
	// and Redis keys, so several deployments can share engines.
	Namespace string `yaml:"namespace"`
}

// Enabled reports whether any cluster engine is configured.
func (c Cluster) Enabled() bool { return c.Redis != "" || c.NATS != "" || c.CassandraHosts != "" }

// Log configures the server's structured log.
type Log struct {
	Level  string `yaml:"level"`  // debug, info, warn, error
	Format string `yaml:"format"` // text or json
}

// Auth says where token verification keys come from. With none of the three
// key settings, the node uses the development HS256 key in data_dir (created
// on first use), so that `parley token` works with no setup.
type Auth struct {
	HS256Key             string        `yaml:"hs256_key"` // hex
	HS256KeyFile         string        `yaml:"hs256_key_file"`
	Ed25519PublicKeyFile string        `yaml:"ed25519_public_key_file"`
	Leeway               time.Duration `yaml:"leeway"`
}

// Gateway configures client connections.
type Gateway struct {
	// HeartbeatInterval is announced to clients, who ping at least this often.
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	// IdleTimeout closes a connection that sent nothing for this long.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// OutboundQueueBytes bounds a connection's unsent frames; a consumer
	// that falls further behind is disconnected rather than slowing others.
	OutboundQueueBytes int           `yaml:"outbound_queue_bytes"`
	RetransmitAfter    time.Duration `yaml:"retransmit_after"`
	RetransmitMax      int           `yaml:"retransmit_max"`
	// MaxInflight bounds pushes awaiting a delivered ACK per connection.
	MaxInflight  int           `yaml:"max_inflight"`
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// HandshakeRate and HandshakeBurst are the node's token bucket for new
	// connections, so a reconnect storm queues instead of toppling the node.
	HandshakeRate  float64 `yaml:"handshake_rate"` // per second
	HandshakeBurst int     `yaml:"handshake_burst"`
	// SyncRate and SyncBurst are the node's token bucket for sync requests
	// (offline pulls), the other half of reconnect-storm protection.
	SyncRate       float64 `yaml:"sync_rate"`
	SyncBurst      int     `yaml:"sync_burst"`
	MaxConnections int     `yaml:"max_connections"`
	// The edge, before a request is authenticated: MaxHeaderBytes bounds a
	// request line and headers (431); a request head must arrive within
	// HeaderTimeout of the connection opening or of the previous response,
	// its body within BodyTimeout (408); MaxPendingConnections is how many
	// TCP connections beyond MaxConnections are accepted at all (partial
	// handshakes count toward MaxConnections and meet a 503).
	MaxHeaderBytes        int           `yaml:"max_header_bytes"`
	HeaderTimeout         time.Duration `yaml:"header_timeout"`
	BodyTimeout           time.Duration `yaml:"body_timeout"`
	MaxPendingConnections int           `yaml:"max_pending_connections"`
	// Fair sharing between users: sends (send, edit, recall) per second
	// and burst per user on this node; requests (all but ping and
	// delivered) per second and burst per connection; sessions per user on
	// this node, and long-poll sessions among them.
	UserSendRate           float64 `yaml:"user_send_rate"`
	UserSendBurst          int     `yaml:"user_send_burst"`
	ConnRequestRate        float64 `yaml:"conn_request_rate"`
	ConnRequestBurst       int     `yaml:"conn_request_burst"`
	MaxSessionsPerUser     int     `yaml:"max_sessions_per_user"`
	MaxPollSessionsPerUser int     `yaml:"max_poll_sessions_per_user"`
	// UserHandshakeRate and UserHandshakeBurst bound one user's new
	// sessions per second on this node.
	UserHandshakeRate  float64 `yaml:"user_handshake_rate"`
	UserHandshakeBurst int     `yaml:"user_handshake_burst"`
}

// Limits mirrors protocol.Limits with YAML keys.
type Limits struct {
	MaxFrameBytes   int `yaml:"max_frame_bytes"`
	MaxBodyBytes    int `yaml:"max_body_bytes"`
	MaxClientMsgID  int `yaml:"max_client_msg_id"`
	MaxSyncConvs    int `yaml:"max_sync_convs"`
	MaxHistory      int `yaml:"max_history"`
	MaxGroupMembers int `yaml:"max_group_members"`
	MaxNameBytes    int `yaml:"max_name_bytes"`
	MaxMentions     int `yaml:"max_mentions"`
	MaxPresenceSubs int `yaml:"max_presence_subs"`
}

// Protocol returns the limits as the protocol package expresses them.
func (l Limits) Protocol() protocol.Limits {
	return protocol.Limits(l)
}

// Chat configures conversations and their storage.
type Chat struct {
	SnapshotRangeLimit int           `yaml:"snapshot_range_limit"`
	SnapshotLatest     int           `yaml:"snapshot_latest"`
	RecallWindow       time.Duration `yaml:"recall_window"`
	ReadScope          string        `yaml:"read_scope"`
	// BucketWidth is the time span of one message partition: wide enough
	// that "latest N" usually reads one bucket, narrow enough that a busy
	// conversation does not grow one unbounded partition.
	BucketWidth time.Duration `yaml:"bucket_width"`
	// Fan-out tiers: below SmallBelow members every member's row is
	// written; up to LargeAbove only online members' rows; beyond, none.
	SmallBelow int     `yaml:"small_below"`
	LargeAbove int     `yaml:"large_above"`
	Hysteresis float64 `yaml:"hysteresis"`
	// EveryoneInterval is the least time between two @everyone of a group.
	EveryoneInterval time.Duration `yaml:"everyone_interval"`
	TypingInterval   time.Duration `yaml:"typing_interval"`
	// Presence changes are flushed every PresenceFlush, each user's at most
	// once per PresenceMinGap.
	PresenceFlush  time.Duration `yaml:"presence_flush"`
	PresenceMinGap time.Duration `yaml:"presence_min_gap"`
}

// Web configures what browsers get from a gateway node.
type Web struct {
	// Page serves the embedded chat page at /.
	Page bool `yaml:"page"`
	// CORSOrigins (comma-separated scheme://host[:port], or *) may call
	// /v1/rpc, /v1/poll and the snapshot endpoint from another origin.
	CORSOrigins string `yaml:"cors_origins"`
	// WSOrigins may open the WebSocket from another origin. The same
	// origin is always allowed.
	WSOrigins string `yaml:"ws_origins"`
}

// Metrics configures the Prometheus endpoint.
type Metrics struct {
	Enabled bool `yaml:"enabled"`
}

// defaults is Default without the derived node id, so that Load can tell a
// configured node id from one it must derive from the final listen address.
func defaults() Config {
	return Config{
		Listen:  "127.0.0.1:7480",
		DataDir: "./data",
		Roles:   RoleAll,
		Log:     Log{Level: "info", Format: LogText},
		Auth:    Auth{Leeway: auth.DefaultLeeway},
		Gateway: Gateway{
			HeartbeatInterval:  25 * time.Second,
			IdleTimeout:        75 * time.Second,
			OutboundQueueBytes: 1 << 20,
			RetransmitAfter:    5 * time.Second,
			RetransmitMax:      3,
			MaxInflight:        256,
			DrainTimeout:       10 * time.Second,
			HandshakeRate:      1000,
			HandshakeBurst:     2000,
			SyncRate:           500,
			SyncBurst:          1000,
			MaxConnections:     100000,

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
		},
		Limits: Limits(protocol.DefaultLimits),
		Chat: Chat{
			SnapshotRangeLimit: 200,
			SnapshotLatest:     50,
			RecallWindow:       24 * time.Hour,
			ReadScope:          ReadScopeUser,
			BucketWidth:        240 * time.Hour,
			SmallBelow:         200,
			LargeAbove:         2000,
			Hysteresis:         0.1,
			EveryoneInterval:   time.Minute,
			TypingInterval:     2 * time.Second,
			PresenceFlush:      time.Second,
			PresenceMinGap:     5 * time.Second,
		},
		Metrics: Metrics{Enabled: true},
		Web:     Web{Page: true},
		Cluster: Cluster{Keyspace: "parley", ReplicationFactor: 1, Consistency: "QUORUM", SerialConsistency: "SERIAL", JetStreamReplicas: 1, Namespace: "parley"},
	}
}

// Default returns the configuration of a server started with no settings.
func Default() Config {
	c := defaults()
	c.NodeID = DeriveNodeID(hostname(), c.Listen)
	return c
}

func hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return ""
	}
	return h
}

// DeriveNodeID builds a node id from a host name and the port of listen,
// replacing characters protocol.ValidID rejects with '-'. Two nodes on one
// host differ by port; with port 0 (chosen by the kernel) the id is not
// unique per process, so set node_id explicitly there.
func DeriveNodeID(host, listen string) string {
	port := "0"
	if _, p, err := net.SplitHostPort(listen); err == nil && p != "" {
		port = p
	}
	var b strings.Builder
	for i := 0; i < len(host); i++ {
		c := host[i]
		if !protocol.ValidID(host[i : i+1]) {
			c = '-'
		}
		b.WriteByte(c)
	}
	h := b.String()
	if h == "" {
		h = "parley"
	}
	if max := protocol.MaxUserIDBytes - 1 - len(port); len(h) > max {
		h = h[:max]
	}
	return h + "-" + port
}

// RoleSet returns the roles this node runs, with "all" expanded.
func (c Config) RoleSet() map[string]bool {
	set := map[string]bool{}
	for _, r := range strings.Split(c.Roles, ",") {
		r = strings.TrimSpace(r)
		if r == RoleAll {
			for _, k := range knownRoles {
				set[k] = true
			}
			continue
		}
		set[r] = true
	}
	return set
}

var knownRoles = []string{RoleGateway, RoleChat}

// SlogLevel returns the configured log level.
func (l Log) SlogLevel() slog.Level {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(l.Level)); err != nil {
		return slog.LevelInfo // unreachable after Validate
	}
	return lv
}

// UsesDevKey reports whether ResolveAuth will fall back to the development
// key, which cmd/parley should warn about.
func (c Config) UsesDevKey() bool {
	a := c.Auth
	return a.HS256Key == "" && a.HS256KeyFile == "" && a.Ed25519PublicKeyFile == ""
}

// ResolveAuth reads the configured keys (or creates the development key) and
// returns the verifier configuration.
func (c Config) ResolveAuth() (auth.Config, error) {
	out := auth.Config{Leeway: c.Auth.Leeway}
	var err error
	switch {
	case c.Auth.HS256Key != "":
		out.HS256Key, err = auth.ParseHS256Key(c.Auth.HS256Key)
	case c.Auth.HS256KeyFile != "":
		out.HS256Key, err = auth.LoadHS256KeyFile(c.Auth.HS256KeyFile)
	case c.UsesDevKey():
		out.HS256Key, err = auth.LoadOrCreateDevKey(c.DataDir)
	}
	if err != nil {
		return auth.Config{}, fmt.Errorf("config: auth: %w", err)
	}
	if c.Auth.Ed25519PublicKeyFile != "" {
		if out.Ed25519PublicKey, err = auth.LoadEd25519PublicKeyFile(c.Auth.Ed25519PublicKeyFile); err != nil {
			return auth.Config{}, fmt.Errorf("config: auth: %w", err)
		}
	}
	if err := out.Validate(); err != nil {
		return auth.Config{}, fmt.Errorf("config: %w", err)
	}
	return out, nil
}

// Validate reports every bad setting at once, each with its path, so one run
// shows all that needs fixing.
func (c Config) Validate() error {
	var p problems
	if _, port, err := net.SplitHostPort(c.Listen); err != nil {
		p.add("listen", "%q is not host:port: %v", c.Listen, err)
	} else if n, err := strconv.ParseUint(port, 10, 16); err != nil || (n == 0 && port != "0") {
		p.add("listen", "port %q is not a number in 0-65535", port)
	}
	p.check(c.DataDir != "", "data_dir", "must not be empty")
	p.check(protocol.ValidID(c.NodeID), "node_id", "%q must be 1-64 bytes of [A-Za-z0-9._@-]", c.NodeID)
	c.validateRoles(&p)

	var lv slog.Level
	if err := lv.UnmarshalText([]byte(c.Log.Level)); err != nil {
		p.add("log.level", "%q is not one of debug, info, warn, error", c.Log.Level)
	}
	p.check(c.Log.Format == LogText || c.Log.Format == LogJSON, "log.format", "%q is not %s or %s", c.Log.Format, LogText, LogJSON)

	c.validateAuth(&p)
	c.validateGateway(&p)
	c.validateLimits(&p)
	validateOrigins(&p, "web.cors_origins", c.Web.CORSOrigins)
	validateOrigins(&p, "web.ws_origins", c.Web.WSOrigins)

	ch := c.Chat
	p.check(ch.SnapshotRangeLimit > 0, "chat.snapshot_range_limit", "must be positive, got %d", ch.SnapshotRangeLimit)
	p.check(ch.SnapshotLatest > 0, "chat.snapshot_latest", "must be positive, got %d", ch.SnapshotLatest)
	p.check(ch.RecallWindow > 0, "chat.recall_window", "must be positive, got %v", ch.RecallWindow)
	p.check(ch.ReadScope == ReadScopeUser || ch.ReadScope == ReadScopeDevice, "chat.read_scope", "%q is not %s or %s", ch.ReadScope, ReadScopeUser, ReadScopeDevice)
	p.check(ch.BucketWidth >= time.Second, "chat.bucket_width", "must be at least 1s, got %v", ch.BucketWidth)
	p.check(ch.SmallBelow >= 3 && ch.LargeAbove >= ch.SmallBelow, "chat.small_below", "need 3 <= small_below <= large_above, got %d and %d", ch.SmallBelow, ch.LargeAbove)
	p.check(ch.Hysteresis >= 0 && ch.Hysteresis < 1, "chat.hysteresis", "must be in [0, 1), got %v", ch.Hysteresis)
	p.check(ch.EveryoneInterval >= 0 && ch.TypingInterval >= 0, "chat.everyone_interval", "intervals must not be negative")
	p.check(ch.PresenceFlush > 0 && ch.PresenceMinGap >= 0, "chat.presence_flush", "must be positive")
	return p.err()
}

func (c Config) validateRoles(p *problems) {
	if c.Cluster.Enabled() {
		p.check(c.Cluster.Redis != "", "cluster.redis", "cluster mode needs Redis (host:port)")
		p.check(c.Cluster.NATS != "", "cluster.nats", "cluster mode needs NATS (nats://host:port)")
		p.check(validNamespace(c.Cluster.Namespace), "cluster.namespace", "%q must be 1-32 bytes of [a-z0-9_]", c.Cluster.Namespace)
		if c.RoleSet()[RoleChat] {
			p.check(c.Cluster.CassandraHosts != "", "cluster.cassandra_hosts", "the chat role needs Cassandra contact points")
		}
	} else if rs := c.RoleSet(); !rs[RoleGateway] || !rs[RoleChat] {
		p.add("roles", "%q: separate roles need the cluster engines (cluster.redis, cluster.nats, cluster.cassandra_hosts)", c.Roles)
	}
	parts := strings.Split(c.Roles, ",")
	for _, r := range parts {
		r = strings.TrimSpace(r)
		switch {
		case r == RoleAll && len(parts) > 1:
			p.add("roles", "%q: all cannot be combined with other roles", c.Roles)
		case r == RoleAll, r == RoleGateway, r == RoleChat:
		default:
			p.add("roles", "unknown role %q (want all, or a list of %s)", r, strings.Join(knownRoles, ", "))
		}
	}
}

func (c Config) validateAuth(p *problems) {
	a := c.Auth
	if a.HS256Key != "" {
		if _, err := auth.ParseHS256Key(a.HS256Key); err != nil {
			p.add("auth.hs256_key", "%v", err)
		}
	}
	p.check(a.HS256Key == "" || a.HS256KeyFile == "", "auth.hs256_key_file", "set either auth.hs256_key or auth.hs256_key_file, not both")
	p.check(a.Leeway >= 0 && a.Leeway <= 5*time.Minute, "auth.leeway", "must be within 0-5m, got %v", a.Leeway)
}

func (c Config) validateGateway(p *problems) {
	g := c.Gateway
	p.check(g.HeartbeatInterval >= time.Second, "gateway.heartbeat_interval", "must be at least 1s, got %v", g.HeartbeatInterval)
	// Clients ping every heartbeat interval; closing sooner than that would
	// cut healthy idle connections.
	p.check(g.IdleTimeout > g.HeartbeatInterval, "gateway.idle_timeout", "must exceed gateway.heartbeat_interval (%v), got %v", g.HeartbeatInterval, g.IdleTimeout)
	p.check(g.OutboundQueueBytes >= c.Limits.MaxFrameBytes, "gateway.outbound_queue_bytes", "must hold one frame of limits.max_frame_bytes (%d), got %d", c.Limits.MaxFrameBytes, g.OutboundQueueBytes)
	p.check(g.RetransmitAfter > 0, "gateway.retransmit_after", "must be positive, got %v", g.RetransmitAfter)
	p.check(g.RetransmitMax >= 0, "gateway.retransmit_max", "must not be negative, got %d", g.RetransmitMax)
	p.check(g.MaxInflight > 0, "gateway.max_inflight", "must be positive, got %d", g.MaxInflight)
	p.check(g.DrainTimeout >= 0, "gateway.drain_timeout", "must not be negative, got %v", g.DrainTimeout)
	p.check(g.HandshakeRate > 0, "gateway.handshake_rate", "must be positive, got %v", g.HandshakeRate)
	p.check(g.HandshakeBurst > 0, "gateway.handshake_burst", "must be positive, got %d", g.HandshakeBurst)
	p.check(g.SyncRate > 0, "gateway.sync_rate", "must be positive, got %v", g.SyncRate)
	p.check(g.SyncBurst > 0, "gateway.sync_burst", "must be positive, got %d", g.SyncBurst)
	p.check(g.MaxConnections > 0, "gateway.max_connections", "must be positive, got %d", g.MaxConnections)
	p.check(g.MaxHeaderBytes >= 1024, "gateway.max_header_bytes", "must be at least 1024, got %d", g.MaxHeaderBytes)
	p.check(g.HeaderTimeout > 0, "gateway.header_timeout", "must be positive, got %v", g.HeaderTimeout)
	p.check(g.BodyTimeout > 0, "gateway.body_timeout", "must be positive, got %v", g.BodyTimeout)
	p.check(g.MaxPendingConnections > 0, "gateway.max_pending_connections", "must be positive, got %d", g.MaxPendingConnections)
	p.check(g.UserSendRate > 0 && g.UserSendBurst > 0, "gateway.user_send_rate", "rate and burst must be positive, got %v and %d", g.UserSendRate, g.UserSendBurst)
	p.check(g.ConnRequestRate > 0 && g.ConnRequestBurst > 0, "gateway.conn_request_rate", "rate and burst must be positive, got %v and %d", g.ConnRequestRate, g.ConnRequestBurst)
	p.check(g.MaxSessionsPerUser > 0, "gateway.max_sessions_per_user", "must be positive, got %d", g.MaxSessionsPerUser)
	p.check(g.MaxPollSessionsPerUser > 0, "gateway.max_poll_sessions_per_user", "must be positive, got %d", g.MaxPollSessionsPerUser)
	p.check(g.UserHandshakeRate > 0 && g.UserHandshakeBurst > 0, "gateway.user_handshake_rate", "rate and burst must be positive, got %v and %d", g.UserHandshakeRate, g.UserHandshakeBurst)
}

func (c Config) validateLimits(p *problems) {
	l := c.Limits
	for _, f := range []struct {
		path string
		v    int
	}{
		{"limits.max_frame_bytes", l.MaxFrameBytes},
		{"limits.max_body_bytes", l.MaxBodyBytes},
		{"limits.max_client_msg_id", l.MaxClientMsgID},
		{"limits.max_sync_convs", l.MaxSyncConvs},
		{"limits.max_history", l.MaxHistory},
		{"limits.max_group_members", l.MaxGroupMembers},
		{"limits.max_name_bytes", l.MaxNameBytes},
		{"limits.max_mentions", l.MaxMentions},
		{"limits.max_presence_subs", l.MaxPresenceSubs},
	} {
		p.check(f.v > 0, f.path, "must be positive, got %d", f.v)
	}
	// The body travels inside a frame with its JSON envelope.
	p.check(l.MaxBodyBytes < l.MaxFrameBytes, "limits.max_body_bytes", "must be below limits.max_frame_bytes (%d), got %d", l.MaxFrameBytes, l.MaxBodyBytes)
}

// validateOrigins checks a comma-separated list of scheme://host[:port]
// origins (or *).
func validateOrigins(p *problems, path, list string) {
	for _, o := range strings.Split(list, ",") {
		o = strings.TrimSuffix(strings.TrimSpace(o), "/")
		if o == "" || o == "*" {
			continue
		}
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" || u.RawQuery != "" {
			p.add(path, "%q is not an origin (http[s]://host[:port]) or *", o)
		}
	}
}

type problems []string

func (p *problems) add(path, format string, args ...any) {
	*p = append(*p, path+": "+fmt.Sprintf(format, args...))
}

func (p *problems) check(ok bool, path, format string, args ...any) {
	if !ok {
		p.add(path, format, args...)
	}
}

func (p problems) err() error {
	if len(p) == 0 {
		return nil
	}
	return fmt.Errorf("config: %w: %s", ErrInvalid, strings.Join(p, "; "))
}

func validNamespace(ns string) bool {
	if len(ns) == 0 || len(ns) > 32 {
		return false
	}
	for i := 0; i < len(ns); i++ {
		if c := ns[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}
