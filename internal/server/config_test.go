package server

import (
	"bytes"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/internal/config"
)

// TestNewServerReadsConfig: what a node derives from its configuration —
// the roles, the development key only when no key is configured (it alone
// enables POST /v1/dev/token), the server API's key, the reserved user and
// the browser origins — and an invalid configuration refused.
func TestNewServerReadsConfig(t *testing.T) {
	base := func(t *testing.T) config.Config {
		c := config.Default()
		c.DataDir = t.TempDir()
		return c
	}
	key := bytes.Repeat([]byte{7}, 32)
	adminKey := bytes.Repeat([]byte{9}, 32)

	t.Run("development key", func(t *testing.T) {
		c := base(t)
		s, err := newServer(c, Deps{})
		if err != nil {
			t.Fatal(err)
		}
		dev, err := auth.LoadOrCreateDevKey(c.DataDir)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(s.devKey, dev) || !bytes.Equal(s.auth.HS256Key, dev) {
			t.Fatalf("dev key %x, verifier key %x; want the data directory's %x", s.devKey, s.auth.HS256Key, dev)
		}
		if !s.gatewayRole || !s.chatRole || s.adminKey != nil || s.reservedUser() != "admin" {
			t.Fatalf("roles %v/%v, admin key %x, reserved %q; want both roles, no admin API, admin reserved", s.gatewayRole, s.chatRole, s.adminKey, s.reservedUser())
		}
	})
	t.Run("configured key", func(t *testing.T) {
		c := base(t)
		c.Auth.HS256Key = hex.EncodeToString(key)
		c.Admin.Listen, c.Admin.Key, c.Admin.Actor = "127.0.0.1:0", hex.EncodeToString(adminKey), "ops"
		c.Web.CORSOrigins, c.Web.WSOrigins = "https://a.example.com, http://localhost:3000/", "*"
		s, err := newServer(c, Deps{})
		if err != nil {
			t.Fatal(err)
		}
		if s.devKey != nil || !bytes.Equal(s.auth.HS256Key, key) {
			t.Fatalf("dev key %x, verifier key %x; want none and %x", s.devKey, s.auth.HS256Key, key)
		}
		if !bytes.Equal(s.adminKey, adminKey) || s.reservedUser() != "ops" {
			t.Fatalf("admin key %x, reserved %q; want %x, ops", s.adminKey, s.reservedUser(), adminKey)
		}
		if want := (Origins{"https://a.example.com", "http://localhost:3000"}); !slices.Equal(s.corsOrigins, want) || !slices.Equal(s.wsOrigins, Origins{"*"}) {
			t.Fatalf("origins cors %q ws %q; want %q and *", s.corsOrigins, s.wsOrigins, want)
		}
	})
	t.Run("chat role", func(t *testing.T) {
		c := base(t)
		c.Roles = config.RoleChat
		c.Cluster.Redis, c.Cluster.NATS, c.Cluster.CassandraHosts = "127.0.0.1:1", "nats://127.0.0.1:2", "127.0.0.1"
		c.Attach.MaxFileBytes = 0 // cluster mode needs engine s3 for attachments
		s, err := newServer(c, Deps{})
		if err != nil {
			t.Fatal(err)
		}
		if s.gatewayRole || !s.chatRole || !s.clustered() {
			t.Fatalf("gateway %v chat %v cluster %v; want a chat-only cluster node", s.gatewayRole, s.chatRole, s.clustered())
		}
	})
	t.Run("invalid", func(t *testing.T) {
		c := base(t)
		c.Roles = config.RoleGateway // separate roles need the cluster engines
		c.NodeID = "bad id"
		_, err := newServer(c, Deps{})
		if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), "roles") || !strings.Contains(err.Error(), "node_id") {
			t.Fatalf("newServer = %v, want config.ErrInvalid naming roles and node_id", err)
		}
	})
}
