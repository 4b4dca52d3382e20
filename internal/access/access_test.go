package access

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/protocol"
)

func TestCheck(t *testing.T) {
	l := NewList()
	if r := l.Check("alice", "d", 0); r != nil {
		t.Fatalf("empty list refused: %+v", r)
	}
	t0 := time.UnixMilli(1_700_000_000_500)
	l.apply(Entry{User: "alice", RevokedBefore: t0.UnixMilli()})
	l.apply(Entry{User: "bob", Device: "d1", RevokedBefore: t0.UnixMilli()})
	l.apply(Entry{User: "carol", Banned: true})
	for _, tc := range []struct {
		user, device string
		iat          time.Time
		want         protocol.Code
	}{
		{"alice", "d", t0.Add(-time.Hour), protocol.CodeTokenRevoked},
		// iat has second precision: the second of the revocation is revoked.
		{"alice", "d", time.UnixMilli(1_700_000_000_000), protocol.CodeTokenRevoked},
		{"alice", "d", time.UnixMilli(1_700_000_001_000), ""},
		{"alice", "d", time.Time{}, protocol.CodeTokenRevoked}, // no iat
		{"bob", "d1", t0.Add(-time.Hour), protocol.CodeTokenRevoked},
		{"bob", "d2", t0.Add(-time.Hour), ""},
		{"bob", "", t0.Add(-time.Hour), ""},
		{"carol", "d", t0.Add(time.Hour), protocol.CodeBanned},
		{"dave", "d", t0, ""},
	} {
		iat := int64(0)
		if !tc.iat.IsZero() {
			iat = tc.iat.UnixMilli()
		}
		r := l.Check(tc.user, tc.device, iat)
		got := protocol.Code("")
		if r != nil {
			got = r.Code
			if (got == protocol.CodeBanned) != (r.Close == protocol.CloseBanned) {
				t.Errorf("%+v: close code %d", tc, r.Close)
			}
		}
		if got != tc.want {
			t.Errorf("%s/%s iat %v: %q, want %q", tc.user, tc.device, tc.iat, got, tc.want)
		}
	}
}

// recorder collects OnChange calls.
type recorder struct {
	mu  sync.Mutex
	got []Entry
}

func (r *recorder) add(e Entry) { r.mu.Lock(); r.got = append(r.got, e); r.mu.Unlock() }
func (r *recorder) has(user string, banned bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.got {
		if e.User == user && e.Banned == banned {
			return true
		}
	}
	return false
}

// TestFileStorePersists: the list survives reopening, the file is 0600,
// and changes reach the hook at once.
func TestFileStorePersists(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "access.json")
	st, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m, err := NewManager(ctx, st, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var rec recorder
	m.OnChange(rec.add)
	if _, err := m.Ban(ctx, "alice", "spam"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Revoke(ctx, "bob", "phone", time.Now()); err != nil {
		t.Fatal(err)
	}
	if !rec.has("alice", true) {
		t.Fatal("the hook did not see the ban")
	}
	if _, err := m.Ban(ctx, "not valid", ""); err == nil {
		t.Fatal("an invalid user id was stored")
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("access file mode %v, want 0600", fi.Mode().Perm())
	}
	st2, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m2, err := NewManager(ctx, st2, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := m2.List().Check("alice", "x", time.Now().UnixMilli()); r == nil || r.Code != protocol.CodeBanned {
		t.Fatalf("after reopening: %+v", r)
	}
	if r := m2.List().Check("bob", "phone", time.Now().Add(-time.Minute).UnixMilli()); r == nil || r.Code != protocol.CodeTokenRevoked {
		t.Fatalf("device revocation after reopening: %+v", r)
	}
	if _, err := m2.Unban(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	if r := m2.List().Check("alice", "x", time.Now().UnixMilli()); r != nil {
		t.Fatalf("after unban: %+v", r)
	}
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenFile(path); err == nil {
		t.Fatal("a corrupt access file opened")
	}
}

func redisClient(t *testing.T) *goredis.Client {
	addr := os.Getenv("PARLEY_TEST_REDIS")
	if addr == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires Redis: PARLEY_TEST_REDIS is unset")
		}
		t.Skip("PARLEY_TEST_REDIS is unset; run scripts/engines/up.sh")
	}
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestRedisSharesBetweenProcesses: a ban made by one manager reaches
// another on the same Redis through Run's poll, and its hook.
func TestRedisSharesBetweenProcesses(t *testing.T) {
	c := redisClient(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "t" + hex.EncodeToString(b[:]) + ":"
	ctx := context.Background()
	t.Cleanup(func() { c.Del(ctx, prefix+"access", prefix+"access:ver") })
	a, err := NewManager(ctx, NewRedis(c, prefix), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewManager(ctx, NewRedis(c, prefix), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var rec recorder
	other.OnChange(rec.add)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go other.Run(rctx)
	if _, err := a.Ban(ctx, "alice", ""); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !rec.has("alice", true) {
		if time.Now().After(deadline) {
			t.Fatal("the other manager never saw the ban")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r := other.List().Check("alice", "d", time.Now().UnixMilli()); r == nil || r.Code != protocol.CodeBanned {
		t.Fatalf("other's list: %+v", r)
	}
	if _, err := a.Unban(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	for !rec.has("alice", false) {
		if time.Now().After(deadline) {
			t.Fatal("the other manager never saw the unban")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A third manager starting now loads the list.
	third, err := NewManager(ctx, NewRedis(c, prefix), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if e, ok := third.List().Get("alice", ""); !ok || e.Banned {
		t.Fatalf("third's entry %+v %v", e, ok)
	}
}
