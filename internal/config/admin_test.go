package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAdminSettings: the server API is off by default; admin.listen needs a
// key (inline or in a file, hex, at least 32 bytes) and the chat role.
func TestAdminSettings(t *testing.T) {
	key := strings.Repeat("ab", 32)
	c, err := Load(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if k, err := c.ResolveAdminKey(); err != nil || k != nil || c.Admin.Actor != "admin" {
		t.Fatalf("default: key %x, err %v, actor %q", k, err, c.Admin.Actor)
	}
	c, err = Load([]string{"--admin.listen", "127.0.0.1:0", "--admin.key", key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if k, err := c.ResolveAdminKey(); err != nil || len(k) != 32 || k[0] != 0xab {
		t.Fatalf("inline key: %x %v", k, err)
	}
	file := filepath.Join(t.TempDir(), "admin.key")
	if err := os.WriteFile(file, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err = Load([]string{"--admin.listen", "127.0.0.1:0"}, []string{"PARLEY_ADMIN_KEY_FILE=" + file})
	if err != nil {
		t.Fatal(err)
	}
	if k, err := c.ResolveAdminKey(); err != nil || len(k) != 32 {
		t.Fatalf("key file: %x %v", k, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--admin.listen", "127.0.0.1:0"}, "admin.key: admin.listen needs"},
		{[]string{"--admin.listen", "127.0.0.1:0", "--admin.key", "zz"}, "admin.key: the admin key is not hex"},
		{[]string{"--admin.listen", "127.0.0.1:0", "--admin.key", "abcd"}, "need at least 32"},
		{[]string{"--admin.listen", "nope", "--admin.key", key}, "admin.listen"},
		{[]string{"--admin.listen", "127.0.0.1:0", "--admin.key", key, "--admin.key-file", file}, "not both"},
		{[]string{"--admin.actor", "a b"}, "admin.actor"},
		{[]string{"--admin.listen", "127.0.0.1:0", "--admin.key", key, "--roles", "gateway", "--cluster.redis", "r:1", "--cluster.nats", "nats://n:1"}, "needs the chat role"},
	} {
		_, err := Load(tc.args, nil)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}
