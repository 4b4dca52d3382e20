package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/token"
)

// verifierOf is the verifier a server configured by mod would use.
func verifierOf(t *testing.T, mod func(*config.Config)) *auth.Verifier {
	t.Helper()
	cfg := config.Default()
	cfg.DataDir = t.TempDir()
	mod(&cfg)
	ac, err := cfg.ResolveAuth()
	if err != nil {
		t.Fatal(err)
	}
	v, err := auth.NewVerifier(ac)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func mint(t *testing.T, key []byte) string {
	t.Helper()
	now := time.Now()
	tok, err := token.MintHS256(key, token.Claims{User: "alice", IssuedAt: now, Expires: now.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestKeygenHS256AndRotation: `parley keygen -type hs256` writes a key file
// the server verifies with and `parley token` signs with; a file listing
// two keys (a rotation) verifies tokens of both, and `parley token` signs
// with the first; nothing is overwritten.
func TestKeygenHS256AndRotation(t *testing.T) {
	dir := t.TempDir()
	oldPath, newPath := filepath.Join(dir, "old.key"), filepath.Join(dir, "new.key")
	var out bytes.Buffer
	for _, p := range []string{oldPath, newPath} {
		if err := runKeygen([]string{"-type", "hs256", "-out", p}, &out); err != nil {
			t.Fatal(err)
		}
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v, want mode 0600", p, st.Mode(), err)
		}
	}
	if err := runKeygen([]string{"-type", "hs256", "-out", oldPath}, &out); err == nil || !strings.Contains(err.Error(), "not overwritten") {
		t.Fatalf("keygen over an existing file: %v", err)
	}
	oldKey, err := token.LoadHS256KeyFile(oldPath)
	if err != nil {
		t.Fatal(err)
	}
	newKey, err := token.LoadHS256KeyFile(newPath)
	if err != nil {
		t.Fatal(err)
	}

	single := verifierOf(t, func(c *config.Config) { c.Auth.HS256KeyFile = oldPath })
	if _, err := single.Verify(mint(t, oldKey), time.Now()); err != nil {
		t.Fatalf("the key's own token: %v", err)
	}
	if _, err := single.Verify(mint(t, newKey), time.Now()); err == nil {
		t.Fatal("a token of another key verified")
	}

	both := filepath.Join(dir, "rotating.key")
	oldHex, _ := os.ReadFile(oldPath)
	newHex, _ := os.ReadFile(newPath)
	if err := os.WriteFile(both, []byte("# current, then next\n"+string(oldHex)+"\n"+string(newHex)), 0o600); err != nil {
		t.Fatal(err)
	}
	rot := verifierOf(t, func(c *config.Config) { c.Auth.HS256KeyFile = both })
	for name, key := range map[string][]byte{"old": oldKey, "new": newKey} {
		if _, err := rot.Verify(mint(t, key), time.Now()); err != nil {
			t.Fatalf("during the rotation, a token of the %s key: %v", name, err)
		}
	}
	out.Reset()
	if err := runToken([]string{"-user", "bob", "--auth.hs256-key-file", both}, &out); err != nil {
		t.Fatal(err)
	}
	if _, err := single.Verify(strings.TrimSpace(out.String()), time.Now()); err != nil {
		t.Fatalf("parley token did not sign with the file's first key: %v", err)
	}
}

// TestKeygenEd25519: the private key keygen writes signs tokens (through
// token.ParseEd25519PrivateKey, as an auth service would) that a server
// with the .pub file verifies; a .pub with two keys verifies both.
func TestKeygenEd25519(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	keys := map[string]string{}
	for _, name := range []string{"a", "b"} {
		p := filepath.Join(dir, name)
		if err := runKeygen([]string{"-type", "ed25519", "-out", p}, &out); err != nil {
			t.Fatal(err)
		}
		keys[name] = p
	}
	signed := map[string]string{}
	for name, p := range keys {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		priv, err := token.ParseEd25519PrivateKey(b)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		tok, err := token.MintEdDSA(priv, token.Claims{User: "carol", IssuedAt: now, Expires: now.Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		signed[name] = tok
	}
	v := verifierOf(t, func(c *config.Config) { c.Auth.Ed25519PublicKeyFile = keys["a"] + ".pub" })
	if _, err := v.Verify(signed["a"], time.Now()); err != nil {
		t.Fatalf("the pair's own token: %v", err)
	}
	if _, err := v.Verify(signed["b"], time.Now()); err == nil {
		t.Fatal("another pair's token verified")
	}
	pa, _ := os.ReadFile(keys["a"] + ".pub")
	pb, _ := os.ReadFile(keys["b"] + ".pub")
	both := filepath.Join(dir, "both.pub")
	if err := os.WriteFile(both, append(pa, pb...), 0o644); err != nil {
		t.Fatal(err)
	}
	rot := verifierOf(t, func(c *config.Config) { c.Auth.Ed25519PublicKeyFile = both })
	for name, tok := range signed {
		if _, err := rot.Verify(tok, time.Now()); err != nil {
			t.Fatalf("during the rotation, the token of pair %s: %v", name, err)
		}
	}
}
