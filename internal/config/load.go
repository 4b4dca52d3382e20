package config

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// EnvPrefix starts every environment variable Load reads.
const EnvPrefix = "PARLEY_"

// EnvConfigFile names the YAML file when --config is not given.
const EnvConfigFile = EnvPrefix + "CONFIG"

// Load resolves the configuration from, in increasing precedence, the
// defaults, the YAML file named by --config or PARLEY_CONFIG, PARLEY_*
// variables in env (KEY=VALUE; a later entry wins over an earlier one) and
// the flags in args. An empty node_id is then derived from the host name
// and the final listen port. The result is validated.
//
// Unknown YAML keys and unknown flags are errors. Unknown PARLEY_* variables
// are ignored, since other tools (the test harness) share the prefix.
// errors.Is(err, flag.ErrHelp) after -h; print Usage then.
func Load(args, env []string) (Config, error) {
	// The first pass only finds --config and rejects bad flags early; the
	// flags are applied for real after the file and the environment.
	probe := defaults()
	fs, file := flagSet(&probe)
	if err := fs.Parse(args); err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("config: unexpected argument %q", fs.Arg(0))
	}
	vars := envMap(env)
	path := *file
	if path == "" {
		path = vars[EnvConfigFile]
	}

	c := defaults()
	if path != "" {
		if err := loadFile(path, &c); err != nil {
			return Config{}, err
		}
	}
	for _, f := range fields(&c) {
		name := f.env()
		v, ok := vars[name]
		if !ok {
			continue
		}
		if err := f.value.Set(v); err != nil {
			return Config{}, fmt.Errorf("config: %s=%q: %w", name, v, err)
		}
	}
	fs, _ = flagSet(&c)
	if err := fs.Parse(args); err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	if c.NodeID == "" {
		c.NodeID = DeriveNodeID(hostname(), c.Listen)
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Usage writes the flags Load accepts with their defaults to w.
func Usage(w io.Writer) {
	c := defaults()
	fs, _ := flagSet(&c)
	fs.SetOutput(w)
	fmt.Fprintf(w, "Settings (flag, or %s<PATH> variable, or YAML key in the --config file):\n", EnvPrefix)
	fs.PrintDefaults()
}

func loadFile(path string, c *Config) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	// A misspelt key would otherwise silently leave its default in force.
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config: %s: %w", path, err)
	}
	return nil
}

func envMap(env []string) map[string]string {
	m := make(map[string]string)
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if ok && strings.HasPrefix(k, EnvPrefix) {
			m[k] = v
		}
	}
	return m
}

func flagSet(c *Config) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet("parley serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // Load returns errors; Usage prints help.
	file := fs.String("config", "", "YAML configuration file (or "+EnvConfigFile+")")
	for _, f := range fields(c) {
		// flag.PrintDefaults shows the back-quoted word as the value's name.
		usage := fmt.Sprintf("%s; env %s", f.usage, f.env())
		if kind := f.kind(); kind != "" {
			usage = fmt.Sprintf("%s; `%s`, env %s", f.usage, kind, f.env())
		}
		fs.Var(f.value, f.flag(), usage)
	}
	return fs, file
}

// field is one setting: its YAML path and a setter into a Config.
type field struct {
	path  string
	usage string
	value flag.Value
}

func (f field) env() string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(f.path, ".", "_"))
}

// kind names the value type in usage text; bool flags take no value.
func (f field) kind() string {
	switch f.value.(type) {
	case strVal:
		return "string"
	case intVal:
		return "int"
	case floatVal:
		return "number"
	case durVal:
		return "duration"
	}
	return ""
}

func (f field) flag() string {
	return strings.ReplaceAll(f.path, "_", "-")
}

// fields lists every setting of c. TestFieldsCoverConfig fails when a Config
// field is missing here.
func fields(c *Config) []field {
	g, l, ch := &c.Gateway, &c.Limits, &c.Chat
	return []field{
		{"listen", "address to listen on, host:port", strVal{&c.Listen}},
		{"data_dir", "directory for the embedded store and the dev key", strVal{&c.DataDir}},
		{"node_id", "this node's id (default: hostname-port)", strVal{&c.NodeID}},
		{"roles", "roles to run: all, or a comma-separated list of gateway, chat", strVal{&c.Roles}},
		{"log.level", "log level: debug, info, warn, error", strVal{&c.Log.Level}},
		{"log.format", "log format: text or json", strVal{&c.Log.Format}},
		{"auth.hs256_key", "HS256 token key, hex (default: dev key in data_dir)", strVal{&c.Auth.HS256Key}},
		{"auth.hs256_key_file", "file holding the hex HS256 token key", strVal{&c.Auth.HS256KeyFile}},
		{"auth.ed25519_public_key_file", "file holding the Ed25519 token public key, PEM or hex", strVal{&c.Auth.Ed25519PublicKeyFile}},
		{"auth.leeway", "tolerated clock skew for token times", durVal{&c.Auth.Leeway}},
		{"gateway.heartbeat_interval", "client ping interval announced in hello", durVal{&g.HeartbeatInterval}},
		{"gateway.idle_timeout", "close a connection silent for this long", durVal{&g.IdleTimeout}},
		{"gateway.outbound_queue_bytes", "unsent bytes per connection before it is dropped as a slow consumer", intVal{&g.OutboundQueueBytes}},
		{"gateway.retransmit_after", "re-send a push not acknowledged within this time", durVal{&g.RetransmitAfter}},
		{"gateway.retransmit_max", "re-sends of one push before giving up on the connection", intVal{&g.RetransmitMax}},
		{"gateway.max_inflight", "unacknowledged pushes per connection", intVal{&g.MaxInflight}},
		{"gateway.drain_timeout", "time given to connections to leave on shutdown", durVal{&g.DrainTimeout}},
		{"gateway.handshake_rate", "handshakes per second admitted by this node", floatVal{&g.HandshakeRate}},
		{"gateway.handshake_burst", "handshakes admitted at once above the rate", intVal{&g.HandshakeBurst}},
		{"gateway.sync_rate", "sync requests (offline pulls) admitted per second", floatVal{&g.SyncRate}},
		{"gateway.sync_burst", "sync requests admitted at once above the rate", intVal{&g.SyncBurst}},
		{"gateway.max_connections", "connections open at once on this node", intVal{&g.MaxConnections}},
		{"gateway.max_header_bytes", "largest request line plus headers (431 over it)", intVal{&g.MaxHeaderBytes}},
		{"gateway.header_timeout", "time for a request head to arrive (408 after it)", durVal{&g.HeaderTimeout}},
		{"gateway.body_timeout", "time for a request body to arrive after its head (408 after it)", durVal{&g.BodyTimeout}},
		{"gateway.max_pending_connections", "TCP connections accepted beyond max_connections (partial handshakes)", intVal{&g.MaxPendingConnections}},
		{"gateway.user_send_rate", "messages (send, edit, recall) per second per user on this node", floatVal{&g.UserSendRate}},
		{"gateway.user_send_burst", "messages one user may send at once above the rate", intVal{&g.UserSendBurst}},
		{"gateway.conn_request_rate", "requests per second per connection (ping and delivered not counted)", floatVal{&g.ConnRequestRate}},
		{"gateway.conn_request_burst", "requests one connection may send at once above the rate", intVal{&g.ConnRequestBurst}},
		{"gateway.max_sessions_per_user", "sessions (devices) one user may hold on this node", intVal{&g.MaxSessionsPerUser}},
		{"gateway.max_poll_sessions_per_user", "long-poll sessions one user may hold on this node", intVal{&g.MaxPollSessionsPerUser}},
		{"gateway.user_handshake_rate", "new sessions per second per user on this node", floatVal{&g.UserHandshakeRate}},
		{"gateway.user_handshake_burst", "new sessions one user may open at once above the rate", intVal{&g.UserHandshakeBurst}},
		{"limits.max_frame_bytes", "largest client frame", intVal{&l.MaxFrameBytes}},
		{"limits.max_body_bytes", "largest message body", intVal{&l.MaxBodyBytes}},
		{"limits.max_client_msg_id", "longest client_msg_id", intVal{&l.MaxClientMsgID}},
		{"limits.max_sync_convs", "conversations in one sync request", intVal{&l.MaxSyncConvs}},
		{"limits.max_history", "messages in one history answer", intVal{&l.MaxHistory}},
		{"limits.max_group_members", "members of one group", intVal{&l.MaxGroupMembers}},
		{"limits.max_name_bytes", "longest group name", intVal{&l.MaxNameBytes}},
		{"limits.max_mentions", "users one message may mention", intVal{&l.MaxMentions}},
		{"limits.max_presence_subs", "users one connection may watch for presence", intVal{&l.MaxPresenceSubs}},
		{"chat.snapshot_range_limit", "most messages in one sync range", intVal{&ch.SnapshotRangeLimit}},
		{"chat.snapshot_latest", "latest messages sent per conversation in a snapshot", intVal{&ch.SnapshotLatest}},
		{"chat.recall_window", "how long after sending a message may be recalled or edited", durVal{&ch.RecallWindow}},
		{"chat.read_scope", "read position per user or per device", strVal{&ch.ReadScope}},
		{"chat.bucket_width", "time span of one message partition", durVal{&ch.BucketWidth}},
		{"chat.small_below", "groups with fewer members get write fan-out to every member", intVal{&ch.SmallBelow}},
		{"chat.large_above", "groups with more members get no per-member rows (read fan-out)", intVal{&ch.LargeAbove}},
		{"chat.hysteresis", "fraction below a threshold a group must fall to move down a tier", floatVal{&ch.Hysteresis}},
		{"chat.everyone_interval", "least time between two @everyone in one group", durVal{&ch.EveryoneInterval}},
		{"chat.typing_interval", "least time between two typing notices of a user in a conversation", durVal{&ch.TypingInterval}},
		{"chat.presence_flush", "presence changes are aggregated over this interval", durVal{&ch.PresenceFlush}},
		{"chat.presence_min_gap", "a user's presence is broadcast at most once per this interval", durVal{&ch.PresenceMinGap}},
		{"metrics.enabled", "serve Prometheus metrics on /metrics", boolVal{&c.Metrics.Enabled}},
		{"web.page", "serve the web chat page at /", boolVal{&c.Web.Page}},
		{"web.cors_origins", "origins (comma-separated, or *) allowed to call /v1/rpc, /v1/poll and the snapshot endpoint cross-origin", strVal{&c.Web.CORSOrigins}},
		{"web.ws_origins", "origins (comma-separated, or *) allowed to open the WebSocket besides the same origin", strVal{&c.Web.WSOrigins}},
		{"cluster.redis", "Redis host:port (cluster mode)", strVal{&c.Cluster.Redis}},
		{"cluster.nats", "NATS URL, e.g. nats://127.0.0.1:4222 (cluster mode)", strVal{&c.Cluster.NATS}},
		{"cluster.cassandra_hosts", "Cassandra contact points, comma-separated (cluster mode)", strVal{&c.Cluster.CassandraHosts}},
		{"cluster.keyspace", "Cassandra keyspace", strVal{&c.Cluster.Keyspace}},
		{"cluster.replication_factor", "replication factor of the keyspace parley migrate creates", intVal{&c.Cluster.ReplicationFactor}},
		{"cluster.consistency", "Cassandra consistency of reads and writes", strVal{&c.Cluster.Consistency}},
		{"cluster.serial_consistency", "Cassandra consistency of lightweight transactions (SERIAL, LOCAL_SERIAL)", strVal{&c.Cluster.SerialConsistency}},
		{"cluster.jetstream_replicas", "replicas of the JetStream task streams", intVal{&c.Cluster.JetStreamReplicas}},
		{"cluster.namespace", "prefix of the deployment's NATS subjects, streams and Redis keys", strVal{&c.Cluster.Namespace}},
	}
}

// The flag.Value adapters. flag calls String on zero values, hence the nil
// checks.

type strVal struct{ p *string }

func (v strVal) Set(s string) error { *v.p = s; return nil }
func (v strVal) String() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}

type intVal struct{ p *int }

func (v intVal) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return errors.New("not an integer")
	}
	*v.p = n
	return nil
}

func (v intVal) String() string {
	if v.p == nil {
		return "0"
	}
	return strconv.Itoa(*v.p)
}

type floatVal struct{ p *float64 }

func (v floatVal) Set(s string) error {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return errors.New("not a number")
	}
	*v.p = f
	return nil
}

func (v floatVal) String() string {
	if v.p == nil {
		return "0"
	}
	return strconv.FormatFloat(*v.p, 'g', -1, 64)
}

type boolVal struct{ p *bool }

func (v boolVal) Set(s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return errors.New("not a boolean")
	}
	*v.p = b
	return nil
}

func (v boolVal) String() string {
	if v.p == nil {
		return "false"
	}
	return strconv.FormatBool(*v.p)
}

// IsBoolFlag lets --metrics.enabled stand for --metrics.enabled=true.
func (v boolVal) IsBoolFlag() bool { return true }

type durVal struct{ p *time.Duration }

func (v durVal) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("not a duration like 25s: %w", err)
	}
	*v.p = d
	return nil
}

func (v durVal) String() string {
	if v.p == nil {
		return "0s"
	}
	return v.p.String()
}
