package auth

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func TestLoadOrCreateDevKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	k1, err := LoadOrCreateDevKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(k1) != MinHS256KeyBytes {
		t.Fatalf("key is %d bytes, want %d", len(k1), MinHS256KeyBytes)
	}
	fi, err := os.Stat(filepath.Join(dir, DevKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o600 {
		t.Fatalf("mode = %v, want 0600", got)
	}
	k2, err := LoadOrCreateDevKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(k1, k2) {
		t.Fatal("second load returned a different key")
	}
	// What `parley token` mints, `parley serve` accepts.
	tok, err := MintHS256(k1, Claims{User: "u", Expires: t0.Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewVerifier(Config{HS256Key: k2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(tok, t0); err != nil {
		t.Fatalf("verify with reloaded key: %v", err)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "*.tmp*"))
	if len(left) != 0 {
		t.Fatalf("temporary files left behind: %v", left)
	}
}

func TestLoadOrCreateDevKeyConcurrent(t *testing.T) {
	dir := t.TempDir()
	const n = 8
	keys := make([][]byte, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			keys[i], errs[i] = LoadOrCreateDevKey(dir)
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("goroutine %d: %v", i, errs[i])
		}
		if !bytes.Equal(keys[i], keys[0]) {
			t.Fatalf("goroutine %d got a different key", i)
		}
	}
}

func TestLoadOrCreateDevKeyCorrupt(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, DevKeyFile), []byte("zz"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateDevKey(dir); err == nil {
		t.Fatal("corrupt key file accepted; it must not be silently replaced")
	}
}
