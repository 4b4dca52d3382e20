package config

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/internal/snowflake"
	"github.com/parley-im/parley/protocol"
)

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefault(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v", err)
	}
	if c.Listen != "127.0.0.1:7480" || c.DataDir != "./data" || c.Roles != RoleAll {
		t.Errorf("top-level defaults = %q %q %q", c.Listen, c.DataDir, c.Roles)
	}
	if c.Gateway.HeartbeatInterval != 25*time.Second || c.Gateway.OutboundQueueBytes != 1<<20 || c.Gateway.HandshakeBurst != 2000 {
		t.Errorf("gateway defaults = %+v", c.Gateway)
	}
	if c.Limits != protocol.DefaultLimits {
		t.Errorf("limits = %+v, want protocol.DefaultLimits", c.Limits)
	}
	if c.Chat.ReadScope != ReadScopeUser || c.Store.BucketWidth != 240*time.Hour || !c.Metrics.Enabled {
		t.Errorf("chat/metrics defaults = %+v %+v", c.Chat, c.Metrics)
	}
	if !strings.HasSuffix(c.NodeID, "-7480") {
		t.Errorf("node id %q does not end in the default port", c.NodeID)
	}
}

// TestPrecedence sets each key in some of the layers and checks which wins:
// defaults < file < env < flags.
func TestPrecedence(t *testing.T) {
	file := writeFile(t, "parley.yaml", `
listen: "127.0.0.1:1001"
log:
  level: warn
gateway:
  idle_timeout: 100s
  heartbeat_interval: 20s
chat:
  read_scope: device
metrics:
  enabled: false
`)
	env := []string{
		"HOME=/root",
		"PARLEY_LISTEN=127.0.0.1:2002",
		"PARLEY_GATEWAY_IDLE_TIMEOUT=200s",
		"PARLEY_LOG_FORMAT=json",
		"PARLEY_LIMITS_MAX_HISTORY=77",
		"PARLEY_LIMITS_MAX_HISTORY=88", // a later entry wins
		"PARLEY_UNRELATED_TOOL=x",      // other users of the prefix are ignored
	}
	args := []string{"--config", file, "--gateway.idle-timeout=300s", "-node-id", "n1", "--metrics.enabled"}
	c, err := Load(args, env)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		key  string
		got  any
		want any
	}{
		{"default only", c.DataDir, "./data"},
		{"file only", c.Log.Level, "warn"},
		{"file only (nested)", c.Gateway.HeartbeatInterval, 20 * time.Second},
		{"file only (string enum)", c.Chat.ReadScope, "device"},
		{"file over default, env over file", c.Listen, "127.0.0.1:2002"},
		{"env only", c.Log.Format, "json"},
		{"env last entry", c.Limits.MaxHistory, 88},
		{"flag over env over file", c.Gateway.IdleTimeout, 300 * time.Second},
		{"flag only", c.NodeID, "n1"},
		{"bool flag over file", c.Metrics.Enabled, true},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %v, want %v", tt.got, tt.want)
			}
		})
	}
}

func TestConfigPathSources(t *testing.T) {
	a := writeFile(t, "a.yaml", "node_id: from-a\n")
	b := writeFile(t, "b.yaml", "node_id: from-b\n")
	tests := []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"env", nil, []string{"PARLEY_CONFIG=" + a}, "from-a"},
		{"flag over env", []string{"-config=" + b}, []string{"PARLEY_CONFIG=" + a}, "from-b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(tt.args, tt.env)
			if err != nil {
				t.Fatal(err)
			}
			if c.NodeID != tt.want {
				t.Errorf("node_id = %q, want %q", c.NodeID, tt.want)
			}
		})
	}
}

func TestNodeIDDerivedFromFinalListen(t *testing.T) {
	c, err := Load([]string{"--listen", "127.0.0.1:9999"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(c.NodeID, "-9999") || !protocol.ValidID(c.NodeID) {
		t.Errorf("node_id = %q, want a valid id ending in -9999", c.NodeID)
	}
}

func TestLoadErrors(t *testing.T) {
	tests := []struct {
		name string
		file string // YAML; empty = no file
		args []string
		env  []string
		want string // substring of the error
	}{
		{"unknown top-level key", "lisen: x\n", nil, nil, "field lisen not found"},
		{"unknown nested key", "gateway:\n  idel_timeout: 5s\n", nil, nil, "field idel_timeout not found"},
		{"yaml duration not a duration", "gateway:\n  idle_timeout: soon\n", nil, nil, "line 2: cannot unmarshal !!str `soon` into time.Duration"},
		// Bare numbers are refused rather than read as nanoseconds.
		{"yaml bare integer duration", "gateway:\n  idle_timeout: 75\n", nil, nil, "line 2: cannot unmarshal !!int `75` into time.Duration"},
		{"yaml wrong type", "limits:\n  max_history: lots\n", nil, nil, "line 2: cannot unmarshal !!str `lots` into int"},
		{"missing file", "", []string{"--config", "/nonexistent/parley.yaml"}, nil, "no such file"},
		{"bad env int", "", nil, []string{"PARLEY_GATEWAY_MAX_INFLIGHT=many"}, "PARLEY_GATEWAY_MAX_INFLIGHT"},
		{"bad env duration", "", nil, []string{"PARLEY_AUTH_LEEWAY=30"}, "PARLEY_AUTH_LEEWAY"},
		{"bad flag duration", "", []string{"--gateway.drain-timeout=10"}, nil, "gateway.drain-timeout"},
		{"unknown flag", "", []string{"--gateway.idle_timeout=5s"}, nil, "flag provided but not defined"},
		{"positional argument", "", []string{"extra"}, nil, `unexpected argument "extra"`},
		{"valid syntax, invalid value", "", []string{"--chat.read-scope=team"}, nil, "chat.read_scope"},
		{"webhook without url", "webhooks:\n  endpoints:\n    - name: a\n      secret: s\n", nil, nil, "webhooks.endpoints[0].url"},
		{"webhook unknown event", "webhooks:\n  endpoints:\n    - name: a\n      url: http://x/\n      secret: s\n      events: [message.sent]\n", nil, nil, "webhooks.endpoints[0].events"},
		{"webhook two secrets", "webhooks:\n  endpoints:\n    - {name: a, url: 'http://x/', secret: s, secret_file: /f}\n", nil, nil, "exactly one of secret and secret_file"},
		{"webhook bad preview", "webhooks:\n  endpoints:\n    - {name: a, url: 'http://x/', secret: s, preview: all}\n", nil, nil, "webhooks.endpoints[0].preview"},
		{"webhook duplicate name", "webhooks:\n  endpoints:\n    - {name: a, url: 'http://x/', secret: s}\n    - {name: a, url: 'http://y/', secret: s}\n", nil, nil, "used twice"},
		{"webhook unknown key", "webhooks:\n  endpoints:\n    - {name: a, url: 'http://x/', secret: s, retries: 3}\n", nil, nil, "field retries not found"},
		{"webhook backoff", "", []string{"--webhooks.max-backoff=1ms"}, nil, "webhooks.max_backoff"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			if tt.file != "" {
				args = append([]string{"--config", writeFile(t, "c.yaml", tt.file)}, args...)
			}
			_, err := Load(args, tt.env)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Load err = %v, want it to mention %q", err, tt.want)
			}
		})
	}
}

func TestLoadWebhooks(t *testing.T) {
	file := `webhooks:
  max_attempts: 4
  endpoints:
    - name: push
      url: https://push.example/parley
      secret: s3cret
      events: [recipient.offline]
      timeout: 2s
      preview: sender
    - name: bots
      url: http://127.0.0.1:9000/hook
      secret_file: /etc/parley/bots.secret
`
	c, err := Load([]string{"--config", writeFile(t, "c.yaml", file), "--webhooks.min-backoff=2s"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := c.Webhooks
	if w.MaxAttempts != 4 || w.MinBackoff != 2*time.Second || w.MaxBackoff != 5*time.Minute || len(w.Endpoints) != 2 {
		t.Fatalf("webhooks = %+v", w)
	}
	if e := w.Endpoints[0]; e.Name != "push" || e.Preview != "sender" || e.Timeout != 2*time.Second || len(e.Events) != 1 {
		t.Fatalf("endpoint 0 = %+v", e)
	}
	if e := w.Endpoints[1]; e.SecretFile != "/etc/parley/bots.secret" || e.Events != nil {
		t.Fatalf("endpoint 1 = %+v", e)
	}
}

func TestLoadHelp(t *testing.T) {
	for _, arg := range []string{"-h", "--help"} {
		if _, err := Load([]string{arg}, nil); !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("Load(%s) err = %v, want flag.ErrHelp", arg, err)
		}
	}
	var b bytes.Buffer
	fs := NewFlagSet("x")
	fs.String("user", "", "the user to act as")
	Usage(&b, "parley x [flags]", fs)
	out := b.String()
	for _, want := range []string{"usage: parley x [flags]", "-user", "the user to act as", "--config FILE", EnvConfigFile,
		"gateway.idle_timeout (duration, default 1m15s)", "PARLEY_GATEWAY_IDLE_TIMEOUT  --gateway.idle-timeout", `listen (string, default "127.0.0.1:7480")`} {
		if !strings.Contains(out, want) {
			t.Errorf("usage lacks %q:\n%s", want, out)
		}
	}
	// Every setting, with its key, variable, flag and default.
	c := defaults()
	for _, f := range Fields(&c) {
		for _, want := range []string{"  " + f.Path + " (" + f.Kind() + ", default ", f.Env() + "  --" + f.Flag(), f.Help} {
			if !strings.Contains(out, want) {
				t.Errorf("usage lacks %q", want)
			}
		}
	}
}

// TestOwnFlagsAndSettings: a command's own flags and the settings parse
// from one command line.
func TestOwnFlagsAndSettings(t *testing.T) {
	fs := NewFlagSet("x")
	user := fs.String("user", "", "")
	c, err := Parse(fs, []string{"-user", "alice", "--data-dir", "/tmp/d", "--metrics.enabled=false"}, []string{"PARLEY_DATA_DIR=/env"})
	if err != nil {
		t.Fatal(err)
	}
	if *user != "alice" || c.DataDir != "/tmp/d" || c.Metrics.Enabled {
		t.Fatalf("user %q data_dir %q metrics %v", *user, c.DataDir, c.Metrics.Enabled)
	}
}

func TestEmptyAndNullYAML(t *testing.T) {
	for _, body := range []string{"", "# nothing\n", "gateway:\n"} {
		c, err := Load([]string{"--config", writeFile(t, "c.yaml", body)}, nil)
		if err != nil {
			t.Fatalf("%q: %v", body, err)
		}
		if c.Gateway.IdleTimeout != 75*time.Second {
			t.Errorf("%q: idle_timeout = %v, want the default kept", body, c.Gateway.IdleTimeout)
		}
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want string // substring of the error; "" = valid
	}{
		{"default", func(*Config) {}, ""},
		{"roles list", func(c *Config) { c.Roles = "gateway, chat" }, ""},
		{"ephemeral port", func(c *Config) { c.Listen = "127.0.0.1:0" }, ""},
		{"listen no port", func(c *Config) { c.Listen = "localhost" }, "listen:"},
		{"listen bad port", func(c *Config) { c.Listen = ":99999" }, "listen: port"},
		{"empty data dir", func(c *Config) { c.DataDir = "" }, "data_dir: must not be empty"},
		{"bad node id", func(c *Config) { c.NodeID = "node one" }, "node_id:"},
		{"unknown role", func(c *Config) { c.Roles = "gateway,router" }, `unknown role "router"`},
		{"all plus role", func(c *Config) { c.Roles = "all,chat" }, "all cannot be combined"},
		{"log level", func(c *Config) { c.Log.Level = "loud" }, "log.level:"},
		{"log format", func(c *Config) { c.Log.Format = "xml" }, "log.format:"},
		{"short key", func(c *Config) { c.Auth.HS256Key = "abcd" }, "auth.hs256_key:"},
		{"key and key file", func(c *Config) {
			c.Auth.HS256Key = strings.Repeat("ab", 32)
			c.Auth.HS256KeyFile = "/k"
		}, "not both"},
		{"leeway", func(c *Config) { c.Auth.Leeway = time.Hour }, "auth.leeway:"},
		{"idle below heartbeat", func(c *Config) { c.Gateway.IdleTimeout = 10 * time.Second }, "gateway.idle_timeout: must exceed heartbeat_interval (25s), got 10s"},
		{"queue below frame", func(c *Config) { c.Gateway.OutboundQueueBytes = 1024 }, "gateway.outbound_queue_bytes:"},
		{"zero inflight", func(c *Config) { c.Gateway.MaxInflight = 0 }, "gateway.max_inflight:"},
		{"negative retransmit", func(c *Config) { c.Gateway.RetransmitMax = -1 }, "gateway.retransmit_max:"},
		{"zero rate", func(c *Config) { c.Gateway.HandshakeRate = 0 }, "gateway.handshake_rate:"},
		{"zero max conns", func(c *Config) { c.Gateway.MaxConnections = 0 }, "gateway.max_connections:"},
		{"zero limit", func(c *Config) { c.Limits.MaxSyncConvs = 0 }, "limits.max_sync_convs:"},
		{"body over frame", func(c *Config) { c.Limits.MaxBodyBytes = c.Limits.MaxFrameBytes }, "limits.max_body_bytes:"},
		{"read scope", func(c *Config) { c.Chat.ReadScope = "team" }, "chat.read_scope:"},
		{"bucket width", func(c *Config) { c.Store.BucketWidth = 0 }, "store.bucket_width:"},
		{"snapshot latest over range", func(c *Config) { c.Chat.SnapshotLatest = c.Chat.SnapshotRangeLimit + 1 }, "chat.snapshot_latest:"},
		{"history default over max", func(c *Config) { c.Chat.HistoryDefault = c.Limits.MaxHistory + 1 }, "chat.history_default: must be in 1..limits.max_history (200)"},
		{"zero request timeout", func(c *Config) { c.Gateway.RequestTimeout = 0 }, "gateway.request_timeout:"},
		{"zero drain timeout", func(c *Config) { c.Gateway.DrainTimeout = 0 }, "gateway.drain_timeout:"},
		{"node number too big", func(c *Config) { c.NodeNumber = 1024 }, "node_number:"},
		{"node number", func(c *Config) { c.NodeNumber = 1023 }, ""},
		{"presence flush", func(c *Config) { c.Presence.Flush = 0 }, "presence.flush:"},
		{"fanout workers", func(c *Config) { c.Fanout.Workers = 0 }, "fanout.workers:"},
		{"fanout backoff", func(c *Config) { c.Fanout.MaxBackoff = time.Millisecond }, "fanout.max_backoff:"},
		{"recall window", func(c *Config) { c.Chat.RecallWindow = -time.Second }, "chat.recall_window:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.edit(&c)
			err := c.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v, want ErrInvalid mentioning %q", err, tt.want)
			}
		})
	}
}

func TestValidateReportsAll(t *testing.T) {
	c := Default()
	c.DataDir = ""
	c.Chat.ReadScope = "x"
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "data_dir") || !strings.Contains(err.Error(), "chat.read_scope") {
		t.Fatalf("Validate = %v, want both problems", err)
	}
}

// TestFieldsCoverConfig: every YAML leaf of Config, down into the
// packages' Configs, is a setting (settable by env and flag, with help),
// and nothing else is.
func TestFieldsCoverConfig(t *testing.T) {
	var leaves []string
	var walk func(reflect.Type, string)
	walk = func(t reflect.Type, prefix string) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			key, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if key == "-" || !f.IsExported() {
				continue
			}
			if key == "" {
				panic(fmt.Sprintf("%s.%s has no yaml tag", t, f.Name))
			}
			if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Duration(0)) {
				walk(f.Type, prefix+key+".")
				continue
			}
			if f.Type.Kind() == reflect.Slice {
				continue // a list (webhooks.endpoints): in the file only
			}
			leaves = append(leaves, prefix+key)
		}
	}
	walk(reflect.TypeOf(Config{}), "")
	var c Config
	var paths []string
	for _, f := range Fields(&c) {
		paths = append(paths, f.Path)
		if f.Help == "" || f.Kind() == "" {
			t.Errorf("%s: help %q kind %q", f.Path, f.Help, f.Kind())
		}
	}
	sort.Strings(leaves)
	sort.Strings(paths)
	if !reflect.DeepEqual(leaves, paths) {
		t.Fatalf("Fields paths\n%v\ndiffer from Config's YAML leaves\n%v", paths, leaves)
	}
}

func TestSettersWriteTheirOwnField(t *testing.T) {
	// Set each field through its setter to a distinctive value and check
	// that exactly one YAML leaf changed, the one of the same path.
	base := defaults()
	for _, f := range Fields(&base) {
		t.Run(f.Path, func(t *testing.T) {
			c := defaults()
			var val string
			switch f.Kind() {
			case "string":
				val = "zz"
			case "int":
				val = "12345"
			case "number":
				val = "12.5"
			case "bool":
				val = strconvNot(f.Value.String())
			case "duration":
				val = "1234s"
			}
			for _, g := range Fields(&c) {
				if g.Path == f.Path {
					if err := g.Value.Set(val); err != nil {
						t.Fatal(err)
					}
				}
			}
			changed := diffLeaves(reflect.ValueOf(defaults()), reflect.ValueOf(c), "")
			if len(changed) != 1 || changed[0] != f.Path {
				t.Fatalf("setting %s changed %v", f.Path, changed)
			}
		})
	}
}

func strconvNot(s string) string {
	if s == "true" {
		return "false"
	}
	return "true"
}

func diffLeaves(a, b reflect.Value, prefix string) []string {
	var out []string
	for i := 0; i < a.NumField(); i++ {
		key, _, _ := strings.Cut(a.Type().Field(i).Tag.Get("yaml"), ",")
		if key == "-" {
			continue
		}
		key = prefix + key
		if a.Field(i).Kind() == reflect.Struct {
			out = append(out, diffLeaves(a.Field(i), b.Field(i), key+".")...)
			continue
		}
		if !reflect.DeepEqual(a.Field(i).Interface(), b.Field(i).Interface()) {
			out = append(out, key)
		}
	}
	return out
}

func TestDeriveNodeID(t *testing.T) {
	tests := []struct {
		host, listen, want string
	}{
		{"web-1", "127.0.0.1:7480", "web-1-7480"},
		{"web 1.example.com", ":8080", "web-1.example.com-8080"},
		{"", "127.0.0.1:7480", "parley-7480"},
		{"hôte", "[::1]:7000", "h--te-7000"},
		{strings.Repeat("h", 100), "127.0.0.1:7480", strings.Repeat("h", 59) + "-7480"},
	}
	for _, tt := range tests {
		got := DeriveNodeID(tt.host, tt.listen)
		if got != tt.want || !protocol.ValidID(got) {
			t.Errorf("DeriveNodeID(%q, %q) = %q, want %q (valid id)", tt.host, tt.listen, got, tt.want)
		}
	}
}

func TestRoleSet(t *testing.T) {
	c := Default()
	if s := c.RoleSet(); !s[RoleGateway] || !s[RoleChat] {
		t.Errorf("all → %v", s)
	}
	c.Roles = "gateway"
	if s := c.RoleSet(); !s[RoleGateway] || s[RoleChat] {
		t.Errorf("gateway → %v", s)
	}
}

func TestResolveAuth(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	hsHex := strings.Repeat("5a", 32)
	pubFile := writeFile(t, "ed.pub", hex.EncodeToString(pub))
	now := time.Now()
	claims := auth.Claims{User: "u1", Expires: now.Add(time.Minute)}

	t.Run("dev key", func(t *testing.T) {
		c := Default()
		c.DataDir = filepath.Join(t.TempDir(), "data")
		if !c.UsesDevKey() {
			t.Fatal("UsesDevKey = false with no keys configured")
		}
		ac, err := c.ResolveAuth()
		if err != nil {
			t.Fatal(err)
		}
		// The key `parley token` would load from the same data dir.
		key, err := auth.LoadOrCreateDevKey(c.DataDir)
		if err != nil || !bytes.Equal(key, ac.HS256Key) {
			t.Fatalf("dev key mismatch (err %v)", err)
		}
	})
	t.Run("hex key and ed25519 file", func(t *testing.T) {
		c := Default()
		c.DataDir = t.TempDir()
		c.Auth.HS256Key = hsHex
		c.Auth.Ed25519PublicKeyFile = pubFile
		ac, err := c.ResolveAuth()
		if err != nil {
			t.Fatal(err)
		}
		v, err := auth.NewVerifier(ac)
		if err != nil {
			t.Fatal(err)
		}
		key, _ := hex.DecodeString(hsHex)
		for name, mint := range map[string]func() (string, error){
			"hs256": func() (string, error) { return auth.MintHS256(key, claims) },
			"eddsa": func() (string, error) { return auth.MintEdDSA(priv, claims) },
		} {
			tok, err := mint()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := v.Verify(tok, now); err != nil {
				t.Errorf("%s token rejected: %v", name, err)
			}
		}
		if _, err := os.Stat(filepath.Join(c.DataDir, auth.DevKeyFile)); !os.IsNotExist(err) {
			t.Errorf("dev key created although keys are configured (stat err %v)", err)
		}
	})
	t.Run("ed25519 only", func(t *testing.T) {
		c := Default()
		c.Auth.Ed25519PublicKeyFile = pubFile
		ac, err := c.ResolveAuth()
		if err != nil {
			t.Fatal(err)
		}
		if ac.HS256Key != nil {
			t.Error("ed25519-only config also accepts HS256")
		}
	})
	t.Run("key file", func(t *testing.T) {
		c := Default()
		c.Auth.HS256KeyFile = writeFile(t, "hs.key", hsHex+"\n")
		ac, err := c.ResolveAuth()
		if err != nil || hex.EncodeToString(ac.HS256Key) != hsHex {
			t.Fatalf("key %x, err %v", ac.HS256Key, err)
		}
	})
	t.Run("missing key file", func(t *testing.T) {
		c := Default()
		c.Auth.HS256KeyFile = "/nonexistent/hs.key"
		if _, err := c.ResolveAuth(); err == nil {
			t.Fatal("missing key file accepted")
		}
	})
}

// TestValidateMigrate: migrate needs only the Cassandra settings, checked
// as the adapter would.
func TestValidateMigrate(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want string // "" = valid
	}{
		{"cassandra only", []string{"--cluster.cassandra-hosts", "127.0.0.1:9042"}, ""},
		{"no hosts", nil, "cluster.cassandra_hosts: is not set"},
		{"bad keyspace", []string{"--cluster.cassandra-hosts", "h", "--cluster.keyspace", "Bad-Name"}, "Keyspace"},
		{"bad replication", []string{"--cluster.cassandra-hosts", "h", "--cluster.replication-factor", "-1"}, "ReplicationFactor"},
		{"bad consistency", []string{"--cluster.cassandra-hosts", "h", "--cluster.consistency", "MOST"}, "MOST"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseUnchecked(NewFlagSet("x"), tt.args, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = c.ValidateMigrate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("ValidateMigrate = %v", err)
				}
				// serve would refuse it: cluster mode needs Redis and NATS.
				if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "cluster.redis") {
					t.Fatalf("Validate = %v, want the cluster.redis problem", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ValidateMigrate = %v, want %q", err, tt.want)
			}
		})
	}
	// serve checks the Cassandra settings too.
	c := Default()
	c.Cluster.Redis, c.Cluster.NATS, c.Cluster.CassandraHosts, c.Cluster.Keyspace = "r:1", "nats://n:1", "h", "Bad-Name"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "Keyspace") {
		t.Fatalf("Validate = %v, want the keyspace problem", err)
	}
}

// TestClusterFromFlags: the cluster settings reach the Cassandra store's
// configuration (contact points split, keyspace, bucket width) and the
// cluster tree the server reads, the presence resync interval among them.
func TestClusterFromFlags(t *testing.T) {
	cfg, err := Load([]string{"--cluster.redis", "127.0.0.1:1", "--cluster.nats", "nats://127.0.0.1:2", "--cluster.cassandra-hosts", "h1, h2",
		"--cluster.presence-resync", "7s", "--cluster.namespace", "ns1", "--cluster.keyspace", "ks1", "--store.bucket-width", "48h",
		"--attach.max-file-bytes", "0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Cluster
	if !c.Enabled() || c.PresenceResync != 7*time.Second || c.Namespace != "ns1" || c.Redis != "127.0.0.1:1" || c.NATS != "nats://127.0.0.1:2" {
		t.Fatalf("cluster %+v", c)
	}
	cc := cfg.Cassandra()
	if cc.Keyspace != "ks1" || len(cc.Hosts) != 2 || cc.Hosts[1] != "h2" || cc.BucketWidth != 48*time.Hour {
		t.Fatalf("cassandra %+v", cc)
	}
}

// TestDerivedConfigs: what the server reads through the tree's methods —
// the gateway's and chat service's Configs carry the node id and the
// limits, and the Snowflake node number is the configured one or a hash of
// the node id.
func TestDerivedConfigs(t *testing.T) {
	cfg, err := Load([]string{"--node-id", "n1", "--node-number", "7", "--gateway.request-timeout", "3s",
		"--presence.flush", "250ms", "--chat.history-default", "20", "--limits.max-body-bytes", "1000"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if g := cfg.GatewayConfig(); g.Node != "n1" || g.Limits != cfg.Limits || g.Limits.MaxBodyBytes != 1000 || g.RequestTimeout != 3*time.Second {
		t.Fatalf("gateway config: node %q, limits %+v, request timeout %v", g.Node, g.Limits, g.RequestTimeout)
	}
	if c := cfg.ChatConfig(); c.Limits != cfg.Limits || c.HistoryDefault != 20 {
		t.Fatalf("chat config: limits %+v, history default %d", c.Limits, c.HistoryDefault)
	}
	if cfg.Presence.Flush != 250*time.Millisecond || cfg.SnowflakeNode() != 7 {
		t.Fatalf("presence flush %v, node number %d; want 250ms, 7", cfg.Presence.Flush, cfg.SnowflakeNode())
	}
	cfg.NodeNumber = -1
	if got, want := cfg.SnowflakeNode(), snowflake.NodeNumber("n1"); got != want {
		t.Fatalf("derived node number %d, want %d", got, want)
	}
}
