// Package config assembles the configuration of `parley serve` (and of the
// subcommands that read it: migrate, token) from the packages' own Configs,
// and Load, which layers, in increasing precedence, defaults < YAML file <
// PARLEY_* environment variables < command-line flags.
//
// A setting is declared once, on a field of the Config of the package that
// uses it (gateway.Config, chat.Config, presence.Config, fanout.Config,
// protocol.Limits) or, for what only this package assembles (listen, log,
// auth keys, cluster engines, web), on a field here: its yaml tag is its
// key, its help tag its help, the package's DefaultConfig its default and
// the package's Validate its check (see internal/settings). Every setting
// has one dotted path, its YAML key (gateway.idle_timeout), from which the
// other two names follow: the variable PARLEY_ + the path in upper snake
// case (PARLEY_GATEWAY_IDLE_TIMEOUT) and the flag with dashes for
// underscores (--gateway.idle-timeout). Durations are Go durations ("25s")
// everywhere.
//
// Concurrency: a Config is a plain value; Load and Validate keep no state.
package config

import (
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/parley-im/parley/internal/attach"
	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/gateway"
	"github.com/parley-im/parley/internal/hooks"
	"github.com/parley-im/parley/internal/kt"
	"github.com/parley-im/parley/internal/presence"
	"github.com/parley-im/parley/internal/push"
	"github.com/parley-im/parley/internal/search"
	"github.com/parley-im/parley/internal/settings"
	"github.com/parley-im/parley/internal/snowflake"
	"github.com/parley-im/parley/internal/store/cassandra"
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
	ReadScopeUser   = chat.ReadPerUser
	ReadScopeDevice = chat.ReadPerDevice
)

// Log formats.
const (
	LogText = "text"
	LogJSON = "json"
)

// Config is the whole server's configuration. Nested package Configs are
// used as they are, except for the fields tagged yaml:"-" there, which
// GatewayConfig and ChatConfig fill in from this one.
type Config struct {
	Listen  string `yaml:"listen" help:"address to listen on, host:port (port 0: any free port)"`
	DataDir string `yaml:"data_dir" help:"directory of the embedded store, the ledger and the development token key"`
	// TLS serves the listen address over HTTPS/WSS when both files are
	// set (docs/deploy.md, "TLS").
	TLS TLS `yaml:"tls"`
	// NodeID names this node to its peers. Empty means derived from the
	// host name and the listen port (see Load), which is stable across
	// restarts as long as neither changes.
	NodeID string `yaml:"node_id" help:"this node's id, unique in the cluster (empty: host name and listen port)"`
	// NodeNumber is the Snowflake node number in the message ids this node
	// mints; -1 derives it from NodeID by a hash, which can collide.
	NodeNumber int `yaml:"node_number" help:"Snowflake node number (0-1023) of the message ids this node mints, unique among chat nodes; in cluster mode leased in Redis, and a start refused if another live node holds it (-1: a hash of node_id, which can collide; in cluster mode the first free number from that hash on)"`
	// Roles is "all" or a comma-separated list of roles.
	Roles    string          `yaml:"roles" help:"roles to run: all, or a comma-separated list of gateway, chat"`
	Log      Log             `yaml:"log"`
	Auth     Auth            `yaml:"auth"`
	Gateway  gateway.Config  `yaml:"gateway"`
	Limits   protocol.Limits `yaml:"limits"`
	Chat     chat.Config     `yaml:"chat"`
	Fanout   fanout.Config   `yaml:"fanout"`
	Presence presence.Config `yaml:"presence"`
	Store    Store           `yaml:"store"`
	Metrics  Metrics         `yaml:"metrics"`
	Web      Web             `yaml:"web"`
	Admin    Admin           `yaml:"admin"`
	// Cluster names the distributed engines; empty runs on embedded ones.
	Cluster Cluster `yaml:"cluster"`
	// KT is the key transparency log (internal/kt; docs/protocol.md,
	// "Key transparency").
	KT kt.Config `yaml:"kt"`
	// Attach is attachments: the blob engine, limits and quotas
	// (docs/protocol.md, "Attachments").
	Attach attach.Config `yaml:"attach"`
	// Webhooks: endpoints (a list, in the file only) and their retry
	// policy (docs/webhooks.md).
	Webhooks hooks.Config `yaml:"webhooks"`
	// Search is full-text search of plain conversations (internal/search;
	// docs/protocol.md, "Search").
	Search search.Config `yaml:"search"`
	// Push: notifications to phones and browsers through APNs, FCM and
	// Web Push (docs/push.md); the pusher runs with a provider set.
	Push push.Config `yaml:"push"`
}

// Cluster configures cluster mode: roles as separate processes on Redis
// (registry, presence leases, limits), NATS with JetStream (routing between
// nodes, compensation tasks) and Cassandra/ScyllaDB (messages and rows).
type Cluster struct {
	Redis string `yaml:"redis" help:"Redis host:port (cluster mode), or with cluster.redis_sentinels the Sentinel master name"`
	// RedisSentinels, when set, are the Sentinels that tell where the
	// primary of the Redis named by Redis is (go-redis's failover client):
	// a failover moves the processes to the promoted replica.
	RedisSentinels string `yaml:"redis_sentinels" help:"Redis Sentinel addresses, comma-separated host:port; cluster.redis is then the master name Sentinel monitors"`
	// Leases says where partition leases and their fencing epochs are
	// kept: "nats" (a JetStream key-value bucket with
	// cluster.jetstream_replicas replicas) or "redis".
	Leases string `yaml:"leases" help:"where partition leases and fencing epochs live: nats (a JetStream KV bucket, replicated by Raft with cluster.jetstream_replicas) or redis (one primary; a failover can grant a lease twice)"`
	NATS   string `yaml:"nats" help:"NATS URL, e.g. nats://127.0.0.1:4222, comma-separated for several (cluster mode)"`
	// CassandraHosts are contact points, comma-separated host[:port].
	CassandraHosts string `yaml:"cassandra_hosts" help:"Cassandra contact points, comma-separated host[:port] (cluster mode)"`
	Keyspace       string `yaml:"keyspace" help:"Cassandra keyspace"`
	// ReplicationFactor of the keyspace `parley migrate` creates.
	ReplicationFactor int `yaml:"replication_factor" help:"replication factor of the keyspace parley migrate creates"`
	// Consistency of Cassandra reads and writes (QUORUM, LOCAL_QUORUM, ...).
	Consistency string `yaml:"consistency" help:"Cassandra consistency of reads and writes (QUORUM, LOCAL_QUORUM, ...)"`
	// SerialConsistency of Cassandra lightweight transactions: SERIAL, or
	// LOCAL_SERIAL for a multi-datacenter deployment.
	SerialConsistency string `yaml:"serial_consistency" help:"Cassandra consistency of lightweight transactions (SERIAL, LOCAL_SERIAL)"`
	// JetStreamReplicas of the compensation task streams and the lease
	// bucket (3 on a NATS cluster).
	JetStreamReplicas int `yaml:"jetstream_replicas" help:"replicas of the JetStream task streams and lease bucket (3 on a NATS cluster)"`
	// Namespace prefixes the deployment's NATS subjects, JetStream streams
	// and Redis keys, so several deployments can share engines.
	Namespace string `yaml:"namespace" help:"prefix of the deployment's NATS subjects, streams and Redis keys"`
	// PresenceResync is how often a process checks the registry leases of
	// the gateways its followed users are on (a gateway killed without
	// disconnecting announces nothing; its users go offline once its
	// lease lapses and this check sees it).
	PresenceResync time.Duration `yaml:"presence_resync" help:"how often a process checks, in Redis, the leases of the gateways its watched users and tracked group members are on, and reads again the users of a gateway that died (bounds how late a gateway's death is seen)"`
	// PresenceShards is how many NATS subjects presence hints are spread
	// over; a process subscribes to the shards of the users it follows.
	PresenceShards int `yaml:"presence_shards" help:"how many NATS subjects (<ns>.presence.s.<n>) presence changes are spread over, by user; the same on every process of a deployment"`
	// Partitions: conversations map to this many partitions, each owned
	// by one chat process at a time (the same in every process of a
	// deployment, gateways included).
	Partitions int `yaml:"partitions" help:"conversation partitions, each owned by one chat process at a time (the same in every process, gateways included)"`
	// PartitionLease is the TTL of a partition lease: a dead or stalled
	// owner's partitions move within about 4/3 of it.
	PartitionLease time.Duration `yaml:"partition_lease" help:"TTL of a partition's ownership lease; a dead owner's partitions move within about 4/3 of it"`
	// ChatMaxInflight bounds the requests a chat process serves at once;
	// past it a request is answered overloaded with retry_after_ms.
	ChatMaxInflight int `yaml:"chat_max_inflight" help:"requests a chat process serves at once; past it a request is answered overloaded with retry_after_ms"`
}

// Enabled reports whether any cluster engine is configured.
func (c Cluster) Enabled() bool { return c.Redis != "" || c.NATS != "" || c.CassandraHosts != "" }

// TLS names the certificate and key the node serves its listen address
// with. Both empty: plain HTTP (TLS ends at a proxy in front). The files are
// read at start and again on SIGHUP, so a renewed certificate is picked up
// without a restart; connections already open keep the one they began with.
type TLS struct {
	CertFile string `yaml:"cert_file" help:"PEM certificate chain to serve HTTPS and WSS with (empty: plain HTTP); read again on SIGHUP"`
	KeyFile  string `yaml:"key_file" help:"PEM private key of tls.cert_file; read again on SIGHUP"`
}

// Enabled reports whether the node serves TLS.
func (t TLS) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" }

// Log configures the server's structured log.
type Log struct {
	Level  string `yaml:"level" help:"log level: debug, info, warn, error"`
	Format string `yaml:"format" help:"log format: text or json"`
}

// Auth says where token verification keys come from. With none of the three
// key settings, the node uses the development HS256 key in data_dir (created
// on first use), so that `parley token` works with no setup.
type Auth struct {
	HS256Key             string        `yaml:"hs256_key" help:"HS256 token key, hex (empty, with no key file: the development key in data_dir)"`
	HS256KeyFile         string        `yaml:"hs256_key_file" help:"file holding the hex HS256 token key"`
	Ed25519PublicKeyFile string        `yaml:"ed25519_public_key_file" help:"file holding the Ed25519 token public key, PEM or hex"`
	Leeway               time.Duration `yaml:"leeway" help:"tolerated clock skew for token times"`
}

// Store configures the message store, embedded or Cassandra.
type Store struct {
	// BucketWidth is the time span of one message partition: wide enough
	// that "latest N" usually reads one bucket, narrow enough that a busy
	// conversation does not grow one unbounded partition.
	BucketWidth time.Duration `yaml:"bucket_width" help:"time span of one message partition (fixed for the life of a store)"`
	// ConversationStates and ConversationIdle bound the per-conversation
	// state a chat process keeps in memory (internal/store/statecache).
	ConversationStates int           `yaml:"conversation_states" help:"conversations whose state a chat process keeps in memory (least recently used idle ones go first; about 1.3 KiB each)"`
	ConversationIdle   time.Duration `yaml:"conversation_idle" help:"a conversation's in-memory state is dropped after this long unused"`
}

// Web configures what browsers get from a gateway node.
type Web struct {
	// Page serves the embedded chat page at /.
	Page bool `yaml:"page" help:"serve the web chat page at /"`
	// CORSOrigins (comma-separated scheme://host[:port], or *) may call
	// /v1/rpc, /v1/poll and the snapshot endpoint from another origin.
	CORSOrigins string `yaml:"cors_origins" help:"origins (comma-separated, or *) allowed to call /v1/rpc, /v1/poll and the snapshot endpoint cross-origin"`
	// WSOrigins may open the WebSocket from another origin. The same
	// origin is always allowed.
	WSOrigins string `yaml:"ws_origins" help:"origins (comma-separated, or *) allowed to open the WebSocket besides the same origin"`
}

// Admin configures the server API (docs/admin.md), off unless Listen is
// set; it needs the chat role and a key (hex, at least 32 bytes) in Key or
// KeyFile. Actor names the admin in the events it makes.
type Admin struct {
	Listen  string `yaml:"listen" help:"host:port of the server API (docs/admin.md; needs the chat role); empty: off"`
	Key     string `yaml:"key" help:"the server API's key, hex (at least 32 bytes); requests send it as Authorization: Bearer"`
	KeyFile string `yaml:"key_file" help:"file holding the server API's hex key"`
	Actor   string `yaml:"actor" help:"actor id of the server API's events, notices and moderation (reserved: refused as a client token's user)"`
}

// ResolveAdminKey returns the admin key (nil when the API is off).
func (c Config) ResolveAdminKey() ([]byte, error) {
	a := c.Admin
	switch {
	case a.Listen == "":
		return nil, nil
	case a.Key != "":
		return parseAdminKey(a.Key)
	case a.KeyFile != "":
		b, err := os.ReadFile(a.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("config: admin.key_file: %w", err)
		}
		key, err := parseAdminKey(string(b))
		if err != nil {
			return nil, fmt.Errorf("config: admin.key_file %s: %w", a.KeyFile, err)
		}
		return key, nil
	}
	return nil, fmt.Errorf("config: admin.listen needs admin.key or admin.key_file: %w", ErrInvalid)
}

// parseAdminKey reads a hex admin key of at least 32 bytes.
func parseAdminKey(s string) ([]byte, error) {
	key, err := hex.DecodeString(strings.TrimSpace(s))
	if err != nil {
		return nil, errors.New("the admin key is not hex")
	}
	if len(key) < 32 {
		return nil, fmt.Errorf("the admin key is %d bytes, need at least 32 (64 hex digits)", len(key))
	}
	return key, nil
}

func (c Config) validateAdmin(p *settings.Problems) {
	a := c.Admin
	p.Check(protocol.ValidID(a.Actor), "admin.actor", "%q must be 1-64 bytes of [A-Za-z0-9._@-]", a.Actor)
	if a.Listen == "" {
		return
	}
	if _, _, err := net.SplitHostPort(a.Listen); err != nil {
		p.Add("admin.listen", "%q is not host:port: %v", a.Listen, err)
	}
	p.Check(a.Key != "" || a.KeyFile != "", "admin.key", "admin.listen needs admin.key or admin.key_file")
	p.Check(a.Key == "" || a.KeyFile == "", "admin.key_file", "set either admin.key or admin.key_file, not both")
	if a.Key != "" {
		if _, err := parseAdminKey(a.Key); err != nil {
			p.Add("admin.key", "%v", err)
		}
	}
	p.Check(c.RoleSet()[RoleChat], "admin.listen", "the server API needs the chat role on this node")
}

// Metrics configures the Prometheus endpoint.
type Metrics struct {
	Enabled bool `yaml:"enabled" help:"serve Prometheus metrics on /metrics"`
}

// defaults is Default without the derived node id, so that Load can tell a
// configured node id from one it must derive from the final listen address.
func defaults() Config {
	gw := gateway.DefaultConfig()
	gw.Node, gw.Limits = "", protocol.Limits{} // filled by GatewayConfig
	ch := chat.DefaultConfig()
	ch.Limits = protocol.Limits{} // filled by ChatConfig
	return Config{
		Listen:     "127.0.0.1:7480",
		DataDir:    "./data",
		NodeNumber: -1,
		Roles:      RoleAll,
		Log:        Log{Level: "info", Format: LogText},
		Auth:       Auth{Leeway: auth.DefaultLeeway},
		Gateway:    gw,
		Limits:     protocol.DefaultLimits,
		Chat:       ch,
		Fanout:     fanout.DefaultConfig(),
		Webhooks:   hooks.DefaultConfig(),
		Search:     search.DefaultConfig(),
		Push:       push.DefaultConfig(),
		KT:         kt.DefaultConfig(),
		Attach:     attach.DefaultConfig(),
		Presence:   presence.DefaultConfig(),
		Store:      Store{BucketWidth: 240 * time.Hour, ConversationStates: 65536, ConversationIdle: 10 * time.Minute},
		Metrics:    Metrics{Enabled: true},
		Web:        Web{Page: true},
		Admin:      Admin{Actor: "admin"},
		Cluster: Cluster{Keyspace: "parley", ReplicationFactor: 1, Consistency: "QUORUM", SerialConsistency: "SERIAL",
			JetStreamReplicas: 1, Namespace: "parley", PresenceResync: 15 * time.Second, PresenceShards: 256,
			Partitions: 64, PartitionLease: 3 * time.Second, ChatMaxInflight: 1024, Leases: "nats"},
	}
}

// GatewayConfig is the gateway's Config with the node id, the limits and
// the attachment sizes its hello announces.
func (c Config) GatewayConfig() gateway.Config {
	g := c.Gateway
	g.Node, g.Limits = c.NodeID, c.Limits
	if c.Attach.Enabled() {
		g.MaxFileBytes, g.PartBytes = c.Attach.MaxFileBytes, c.Attach.PartBytes
	}
	return g
}

// KTOrigin is the origin of the key transparency keys a deployment
// creates: kt.origin, else parley, in cluster mode parley/<namespace>.
func (c Config) KTOrigin() string {
	switch {
	case c.KT.Origin != "":
		return c.KT.Origin
	case c.Cluster.Enabled():
		return "parley/" + c.Cluster.Namespace
	}
	return "parley"
}

// ChatConfig is the chat service's Config with the limits.
func (c Config) ChatConfig() chat.Config {
	ch := c.Chat
	ch.Limits = c.Limits
	return ch
}

// Cassandra is the Cassandra store's configuration (cluster mode).
func (c Config) Cassandra() cassandra.Config {
	var hosts []string
	for _, h := range strings.Split(c.Cluster.CassandraHosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hosts = append(hosts, h)
		}
	}
	return cassandra.Config{
		Hosts: hosts, Keyspace: c.Cluster.Keyspace, Consistency: c.Cluster.Consistency,
		SerialConsistency: c.Cluster.SerialConsistency,
		ReplicationFactor: c.Cluster.ReplicationFactor, BucketWidth: c.Store.BucketWidth,
		ConvStates: c.Store.ConversationStates, ConvIdle: c.Store.ConversationIdle,
	}
}

// ValidateMigrate checks what `parley migrate` uses: the Cassandra
// settings (and the bucket width the schema is not tied to, but the
// adapter checks).
func (c Config) ValidateMigrate() error {
	var p settings.Problems
	if c.Cluster.CassandraHosts == "" {
		p.Add("cluster.cassandra_hosts", "is not set: the embedded store needs no migration")
	} else {
		p.Merge("cluster", c.Cassandra().Validate())
	}
	return problemsErr(p)
}

// SnowflakeNode is the node number of the message ids this node mints.
func (c Config) SnowflakeNode() uint16 {
	if c.NodeNumber < 0 {
		return snowflake.NodeNumber(c.NodeID)
	}
	return uint16(c.NodeNumber)
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
	var (
		hs  [][]byte
		err error
	)
	// A key file (or the key setting, one key per line) may hold several
	// keys during a rotation: each verifies (docs/deploy.md, "Token keys").
	switch {
	case c.Auth.HS256Key != "":
		hs, err = auth.ParseHS256Keys(c.Auth.HS256Key)
	case c.Auth.HS256KeyFile != "":
		hs, err = auth.LoadHS256KeysFile(c.Auth.HS256KeyFile)
	case c.UsesDevKey():
		var key []byte
		key, err = auth.LoadOrCreateDevKey(c.DataDir)
		hs = [][]byte{key}
	}
	if err != nil {
		return auth.Config{}, fmt.Errorf("config: auth: %w", err)
	}
	if len(hs) > 0 {
		out.HS256Key, out.ExtraHS256Keys = hs[0], hs[1:]
	}
	if c.Auth.Ed25519PublicKeyFile != "" {
		ed, err := auth.LoadEd25519PublicKeysFile(c.Auth.Ed25519PublicKeyFile)
		if err != nil {
			return auth.Config{}, fmt.Errorf("config: auth: %w", err)
		}
		out.Ed25519PublicKey, out.ExtraEd25519PublicKeys = ed[0], ed[1:]
	}
	if err := out.Validate(); err != nil {
		return auth.Config{}, fmt.Errorf("config: %w", err)
	}
	return out, nil
}

// Validate reports every bad setting at once, each with its path, so one run
// shows all that needs fixing.
func (c Config) Validate() error {
	var p settings.Problems
	if _, port, err := net.SplitHostPort(c.Listen); err != nil {
		p.Add("listen", "%q is not host:port: %v", c.Listen, err)
	} else if n, err := strconv.ParseUint(port, 10, 16); err != nil || (n == 0 && port != "0") {
		p.Add("listen", "port %q is not a number in 0-65535", port)
	}
	p.Check(c.DataDir != "", "data_dir", "must not be empty")
	if c.TLS.Enabled() {
		p.Check(c.TLS.CertFile != "", "tls.cert_file", "must be set with tls.key_file")
		p.Check(c.TLS.KeyFile != "", "tls.key_file", "must be set with tls.cert_file")
	}
	p.Check(protocol.ValidID(c.NodeID), "node_id", "%q must be 1-64 bytes of [A-Za-z0-9._@-]", c.NodeID)
	p.Check(c.NodeNumber >= -1 && c.NodeNumber <= snowflake.MaxNode, "node_number", "must be -1 or 0-%d, got %d", snowflake.MaxNode, c.NodeNumber)
	c.validateRoles(&p)

	var lv slog.Level
	if err := lv.UnmarshalText([]byte(c.Log.Level)); err != nil {
		p.Add("log.level", "%q is not one of debug, info, warn, error", c.Log.Level)
	}
	p.Check(c.Log.Format == LogText || c.Log.Format == LogJSON, "log.format", "%q is not %s or %s", c.Log.Format, LogText, LogJSON)

	c.validateAuth(&p)
	c.validateAdmin(&p)
	c.validateLimits(&p)
	p.Merge("gateway", c.GatewayConfig().Validate())
	p.Merge("chat", c.ChatConfig().Validate())
	p.Merge("fanout", c.Fanout.Validate())
	p.Merge("webhooks", c.Webhooks.Validate())
	p.Merge("search", c.Search.Validate())
	p.Check(c.Search.OpenSearchURL == "" || c.Cluster.Enabled(), "search.opensearch_url",
		"is for cluster mode; an embedded node searches its Bleve index in data_dir/search")
	p.Merge("push", c.Push.Validate())
	p.Merge("presence", c.Presence.Validate())
	p.Merge("kt", c.KT.Validate())
	p.Merge("attach", c.Attach.Validate())
	if c.Cluster.Enabled() && c.Attach.Enabled() && c.Attach.Engine == attach.EngineDisk {
		p.Add("attach.engine", "disk keeps each file on the disk of the one chat process that received it; cluster mode needs engine s3 (or attach.max_file_bytes 0: attachments off)")
	}
	p.Check(c.Store.BucketWidth >= time.Second, "store.bucket_width", "must be at least 1s, got %v", c.Store.BucketWidth)
	p.Check(c.Store.ConversationStates >= 1, "store.conversation_states", "must be at least 1, got %d", c.Store.ConversationStates)
	p.Check(c.Store.ConversationIdle >= time.Second, "store.conversation_idle", "must be at least 1s, got %v", c.Store.ConversationIdle)
	validateOrigins(&p, "web.cors_origins", c.Web.CORSOrigins)
	validateOrigins(&p, "web.ws_origins", c.Web.WSOrigins)
	return problemsErr(p)
}

func problemsErr(p settings.Problems) error {
	if len(p) == 0 {
		return nil
	}
	msgs := make([]string, len(p))
	for i, q := range p {
		msgs[i] = q.Key + ": " + q.Msg
	}
	return fmt.Errorf("config: %w: %s", ErrInvalid, strings.Join(msgs, "; "))
}

func (c Config) validateRoles(p *settings.Problems) {
	if c.Cluster.Enabled() {
		p.Check(c.Cluster.Redis != "", "cluster.redis", "cluster mode needs Redis (host:port, or the master name with cluster.redis_sentinels)")
		p.Check(c.Cluster.Leases == "nats" || c.Cluster.Leases == "redis", "cluster.leases", "must be nats or redis, got %q", c.Cluster.Leases)
		p.Check(c.Cluster.NATS != "", "cluster.nats", "cluster mode needs NATS (nats://host:port)")
		p.Check(validNamespace(c.Cluster.Namespace), "cluster.namespace", "%q must be 1-32 bytes of [a-z0-9_]", c.Cluster.Namespace)
		p.Check(c.Cluster.Partitions >= 1 && c.Cluster.Partitions <= 65536, "cluster.partitions", "must be in [1, 65536], got %d", c.Cluster.Partitions)
		p.Check(c.Cluster.PartitionLease >= 300*time.Millisecond, "cluster.partition_lease", "must be at least 300ms, got %v", c.Cluster.PartitionLease)
		p.Check(c.Cluster.ChatMaxInflight >= 1, "cluster.chat_max_inflight", "must be at least 1, got %d", c.Cluster.ChatMaxInflight)
		p.Check(c.Cluster.PresenceShards >= 1 && c.Cluster.PresenceShards <= 65536, "cluster.presence_shards", "must be in [1, 65536], got %d", c.Cluster.PresenceShards)
		p.Check(c.Cluster.PresenceResync >= 100*time.Millisecond, "cluster.presence_resync", "must be at least 100ms, got %v", c.Cluster.PresenceResync)
		if c.RoleSet()[RoleChat] {
			p.Check(c.Cluster.CassandraHosts != "", "cluster.cassandra_hosts", "the chat role needs Cassandra contact points")
		}
		if c.Cluster.CassandraHosts != "" {
			p.Merge("cluster", c.Cassandra().Validate())
		}
	} else if rs := c.RoleSet(); !rs[RoleGateway] || !rs[RoleChat] {
		p.Add("roles", "%q: separate roles need the cluster engines (cluster.redis, cluster.nats, cluster.cassandra_hosts)", c.Roles)
	}
	parts := strings.Split(c.Roles, ",")
	for _, r := range parts {
		r = strings.TrimSpace(r)
		switch {
		case r == RoleAll && len(parts) > 1:
			p.Add("roles", "%q: all cannot be combined with other roles", c.Roles)
		case r == RoleAll, r == RoleGateway, r == RoleChat:
		default:
			p.Add("roles", "unknown role %q (want all, or a list of %s)", r, strings.Join(knownRoles, ", "))
		}
	}
}

func (c Config) validateAuth(p *settings.Problems) {
	a := c.Auth
	if a.HS256Key != "" {
		if _, err := auth.ParseHS256Key(a.HS256Key); err != nil {
			p.Add("auth.hs256_key", "%v", err)
		}
	}
	p.Check(a.HS256Key == "" || a.HS256KeyFile == "", "auth.hs256_key_file", "set either auth.hs256_key or auth.hs256_key_file, not both")
	p.Check(a.Leeway >= 0 && a.Leeway <= 5*time.Minute, "auth.leeway", "must be within 0-5m, got %v", a.Leeway)
}

func (c Config) validateLimits(p *settings.Problems) {
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
		p.Check(f.v > 0, f.path, "must be positive, got %d", f.v)
	}
	// The body travels inside a frame with its JSON envelope.
	p.Check(l.MaxBodyBytes < l.MaxFrameBytes, "limits.max_body_bytes", "must be below limits.max_frame_bytes (%d), got %d", l.MaxFrameBytes, l.MaxBodyBytes)
}

// validateOrigins checks a comma-separated list of scheme://host[:port]
// origins (or *).
func validateOrigins(p *settings.Problems, path, list string) {
	for _, o := range strings.Split(list, ",") {
		o = strings.TrimSuffix(strings.TrimSpace(o), "/")
		if o == "" || o == "*" {
			continue
		}
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" || u.RawQuery != "" {
			p.Add(path, "%q is not an origin (http[s]://host[:port]) or *", o)
		}
	}
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
