package redis

import (
	"context"
	"encoding/hex"
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/internal/enginetest"
	"github.com/parley-im/parley/internal/registry"
	"github.com/parley-im/parley/internal/registry/registrytest"
)

func newRegistry(t testing.TB, c *goredis.Client, cfg Config) *Registry {
	t.Helper()
	r, err := New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestConformance(t *testing.T) {
	c := enginetest.Redis(t)
	registrytest.Run(t, func(t *testing.T) registry.Registry {
		return newRegistry(t, c, Config{Prefix: enginetest.RedisPrefix(t, c)})
	})
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{}, true},
		{"short TTL", Config{TTL: 50 * time.Millisecond}, false},
		{"cache as long as TTL", Config{TTL: time.Second, LeaseCache: time.Second}, false},
		{"cache disabled", Config{TTL: time.Second, LeaseCache: -1}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

var ctx = context.Background()

func entry(u, d, n, s string) registry.Entry {
	return registry.Entry{User: u, Device: d, Node: n, Session: s, Since: 7}
}

func mustRegister(t testing.TB, r *Registry, e registry.Entry) *registry.Entry {
	t.Helper()
	old, err := r.Register(ctx, e)
	if err != nil {
		t.Fatalf("Register(%+v): %v", e, err)
	}
	return old
}

func sessions(t *testing.T, r *Registry, user string) []string {
	t.Helper()
	got, err := r.Lookup(ctx, []string{user})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range got[user] {
		out = append(out, e.Session)
	}
	return out
}

// shortTTL is a config whose leases lapse within the test; the cache is off
// so each Lookup reads the leases.
func shortTTL(prefix string) Config {
	return Config{Prefix: prefix, TTL: 300 * time.Millisecond, LeaseCache: -1}
}

func TestEntriesOfDeadNodeExpire(t *testing.T) {
	c := enginetest.Redis(t)
	prefix := enginetest.RedisPrefix(t, c)
	r := newRegistry(t, c, shortTTL(prefix))
	mustRegister(t, r, entry("alice", "phone", "n1", "s1"))
	if got := sessions(t, r, "alice"); len(got) != 1 {
		t.Fatalf("before expiry: sessions %v, want [s1]", got)
	}
	time.Sleep(500 * time.Millisecond) // n1 never refreshes: it died
	if got := sessions(t, r, "alice"); len(got) != 0 {
		t.Fatalf("after expiry: sessions %v, want none", got)
	}
	// Lookup removed the dead entry and its index member.
	if n := c.HLen(ctx, prefix+"u:alice").Val(); n != 0 {
		t.Fatalf("user hash has %d fields after cleanup, want 0", n)
	}
	if n := c.SCard(ctx, prefix+"n:n1").Val(); n != 0 {
		t.Fatalf("node index has %d members after cleanup, want 0", n)
	}
}

// TestLookupDeadNamesDeadNodesUsers: LookupDead names the users whose
// entries it found dead (once: it deletes them), not those with live
// entries only.
func TestLookupDeadNamesDeadNodesUsers(t *testing.T) {
	c := enginetest.Redis(t)
	prefix := enginetest.RedisPrefix(t, c)
	r := newRegistry(t, c, shortTTL(prefix))
	mustRegister(t, r, entry("alice", "phone", "n1", "s1"))
	time.Sleep(500 * time.Millisecond) // n1 never refreshes: it died
	mustRegister(t, r, entry("bob", "phone", "n2", "s2"))
	live, dead, err := r.LookupDead(ctx, []string{"alice", "bob", "carol"})
	if err != nil {
		t.Fatal(err)
	}
	if len(live["alice"]) != 0 || len(live["bob"]) != 1 || len(dead) != 1 || dead[0] != "alice" {
		t.Fatalf("LookupDead = %v, %v; want bob live and alice dead", live, dead)
	}
	if _, dead, _ := r.LookupDead(ctx, []string{"alice"}); len(dead) != 0 {
		t.Fatalf("second LookupDead names %v dead, want none (the entry is gone)", dead)
	}
}

// TestDropNodeUsersNamesThem: DropNodeUsers returns each user whose
// entries of the node it deleted, once, and keeps other nodes' entries.
func TestDropNodeUsersNamesThem(t *testing.T) {
	c := enginetest.Redis(t)
	r := newRegistry(t, c, Config{Prefix: enginetest.RedisPrefix(t, c)})
	mustRegister(t, r, entry("alice", "phone", "n1", "s1"))
	mustRegister(t, r, entry("alice", "laptop", "n1", "s2"))
	mustRegister(t, r, entry("bob", "phone", "n1", "s3"))
	mustRegister(t, r, entry("carol", "phone", "n2", "s4"))
	users, err := r.DropNodeUsers(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(users)
	if !slices.Equal(users, []string{"alice", "bob"}) {
		t.Fatalf("DropNodeUsers = %v, want [alice bob]", users)
	}
	if got := sessions(t, r, "carol"); len(got) != 1 {
		t.Fatalf("carol on n2: sessions %v, want one", got)
	}
	if users, _ := r.DropNodeUsers(ctx, "n1"); len(users) != 0 {
		t.Fatalf("second DropNodeUsers = %v, want none", users)
	}
}

func TestRefreshKeepsEntries(t *testing.T) {
	c := enginetest.Redis(t)
	// TTL leaves room for a refresh delayed by a loaded machine.
	r := newRegistry(t, c, Config{Prefix: enginetest.RedisPrefix(t, c), TTL: 600 * time.Millisecond, LeaseCache: -1})
	mustRegister(t, r, entry("alice", "phone", "n1", "s1"))
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if err := r.Refresh(ctx, "n1"); err != nil {
			t.Fatal(err)
		}
	}
	if got := sessions(t, r, "alice"); len(got) != 1 {
		t.Fatalf("after 1.5s of refreshes with a 600ms TTL: sessions %v, want [s1]", got)
	}
}

func TestRefreshReportsLostLease(t *testing.T) {
	c := enginetest.Redis(t)
	r := newRegistry(t, c, shortTTL(enginetest.RedisPrefix(t, c)))
	if err := r.Refresh(ctx, "n1"); err != nil {
		t.Fatalf("first Refresh takes a lease: %v", err)
	}
	mustRegister(t, r, entry("alice", "phone", "n1", "s1"))
	time.Sleep(500 * time.Millisecond) // cut off from Redis longer than TTL
	if err := r.Refresh(ctx, "n1"); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Refresh after lapse = %v, want ErrLeaseLost", err)
	}
	// The clients reconnect; a new epoch starts and the old entry stays dead.
	mustRegister(t, r, entry("bob", "phone", "n1", "s2"))
	if err := r.Refresh(ctx, "n1"); err != nil {
		t.Fatalf("Refresh under the new lease: %v", err)
	}
	if got := sessions(t, r, "alice"); len(got) != 0 {
		t.Fatalf("alice's entry of the lost lease came back: %v", got)
	}
	if got := sessions(t, r, "bob"); len(got) != 1 {
		t.Fatalf("bob: sessions %v, want [s2]", got)
	}
}

// A lapse must be reported even when a Register took a new lease first.
func TestLeaseLostNoticedAfterRegister(t *testing.T) {
	c := enginetest.Redis(t)
	r := newRegistry(t, c, shortTTL(enginetest.RedisPrefix(t, c)))
	mustRegister(t, r, entry("alice", "phone", "n1", "s1"))
	time.Sleep(500 * time.Millisecond)
	mustRegister(t, r, entry("bob", "phone", "n1", "s2")) // first call after the partition
	if err := r.Refresh(ctx, "n1"); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Refresh = %v, want ErrLeaseLost: alice's connection is open but unreachable", err)
	}
	if err := r.Refresh(ctx, "n1"); err != nil {
		t.Fatalf("second Refresh = %v, want nil (reported once)", err)
	}
	if got := sessions(t, r, "bob"); len(got) != 1 {
		t.Fatalf("bob: %v, want [s2]", got)
	}
}

// A node that dies and comes back under the same name must not revive the
// entries of its previous process, with or without DropNode.
func TestRestartedNodeDoesNotRevive(t *testing.T) {
	c := enginetest.Redis(t)
	prefix := enginetest.RedisPrefix(t, c)
	t.Run("LeaseLapsed", func(t *testing.T) {
		old := newRegistry(t, c, shortTTL(prefix))
		mustRegister(t, old, entry("alice", "phone", "n1", "n1-1"))
		time.Sleep(500 * time.Millisecond)
		restarted := newRegistry(t, c, shortTTL(prefix))
		mustRegister(t, restarted, entry("bob", "phone", "n1", "n1-1"))
		reader := newRegistry(t, c, shortTTL(prefix))
		if got := sessions(t, reader, "alice"); len(got) != 0 {
			t.Fatalf("alice of the dead process: %v, want none", got)
		}
		if got := sessions(t, reader, "bob"); len(got) != 1 {
			t.Fatalf("bob: %v, want [n1-1]", got)
		}
	})
	t.Run("DropNodeAtStart", func(t *testing.T) {
		old := newRegistry(t, c, Config{Prefix: prefix})
		mustRegister(t, old, entry("carol", "phone", "n2", "n2-1"))
		restarted := newRegistry(t, c, Config{Prefix: prefix}) // lease still valid
		if err := restarted.DropNode(ctx, "n2"); err != nil {
			t.Fatal(err)
		}
		mustRegister(t, restarted, entry("dave", "phone", "n2", "n2-1"))
		reader := newRegistry(t, c, Config{Prefix: prefix})
		if got := sessions(t, reader, "carol"); len(got) != 0 {
			t.Fatalf("carol of the previous process: %v, want none", got)
		}
		if got := sessions(t, reader, "dave"); len(got) != 1 {
			t.Fatalf("dave: %v, want [n2-1]", got)
		}
	})
}

func TestReplacedEntryOfDeadNodeIsNotReturned(t *testing.T) {
	c := enginetest.Redis(t)
	prefix := enginetest.RedisPrefix(t, c)
	dead := newRegistry(t, c, shortTTL(prefix))
	mustRegister(t, dead, entry("alice", "phone", "n1", "s1"))
	time.Sleep(500 * time.Millisecond)
	live := newRegistry(t, c, shortTTL(prefix))
	if old := mustRegister(t, live, entry("alice", "phone", "n2", "s2")); old != nil {
		t.Fatalf("replaced = %+v, want nil: n1 is dead, nobody to kick", old)
	}
	// With n1 alive the replaced entry comes back for the kick.
	if err := live.Refresh(ctx, "n1"); err != nil { // n1 restarts and takes a lease
		t.Fatal(err)
	}
	mustRegister(t, live, entry("bob", "phone", "n1", "s3"))
	old := mustRegister(t, live, entry("bob", "phone", "n2", "s4"))
	if old == nil || old.Session != "s3" || old.Node != "n1" || old.Since != 7 {
		t.Fatalf("replaced = %+v, want s3 on n1", old)
	}
}

func TestDropNodeKeepsNewerEntry(t *testing.T) {
	c := enginetest.Redis(t)
	prefix := enginetest.RedisPrefix(t, c)
	r := newRegistry(t, c, Config{Prefix: prefix})
	mustRegister(t, r, entry("alice", "phone", "n1", "s1"))
	mustRegister(t, r, entry("alice", "phone", "n2", "s2")) // moved to n2
	mustRegister(t, r, entry("alice", "laptop", "n1", "s3"))
	if err := r.DropNode(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if got := sessions(t, r, "alice"); len(got) != 1 || got[0] != "s2" {
		t.Fatalf("sessions %v, want [s2]", got)
	}
	if n := c.Exists(ctx, prefix+"n:n1", prefix+"lease:n1").Val(); n != 0 {
		t.Fatalf("%d keys of n1 left, want 0", n)
	}
}

func TestUnregisterCleansIndex(t *testing.T) {
	c := enginetest.Redis(t)
	prefix := enginetest.RedisPrefix(t, c)
	r := newRegistry(t, c, Config{Prefix: prefix})
	mustRegister(t, r, entry("alice", "phone", "n1", "s1"))
	mustRegister(t, r, entry("alice", "phone", "n1", "s2")) // reconnect on the same node
	if n := c.SCard(ctx, prefix+"n:n1").Val(); n != 1 {
		t.Fatalf("index has %d members after a replace, want 1", n)
	}
	if err := r.Unregister(ctx, "alice", "phone", "s2"); err != nil {
		t.Fatal(err)
	}
	if n := c.SCard(ctx, prefix+"n:n1").Val(); n != 0 {
		t.Fatalf("index has %d members after unregister, want 0", n)
	}
}

func TestLookupManyUsersAndNodes(t *testing.T) {
	c := enginetest.Redis(t)
	r := newRegistry(t, c, Config{Prefix: enginetest.RedisPrefix(t, c)})
	var users []string
	for i := range 200 {
		u := "u" + string(rune('a'+i%26)) + hex.EncodeToString([]byte{byte(i)})
		users = append(users, u)
		mustRegister(t, r, entry(u, "d1", "n"+string(rune('0'+i%5)), "s"+u))
		if i%2 == 0 {
			mustRegister(t, r, entry(u, "d2", "n9", "t"+u))
		}
	}
	got, err := r.Lookup(ctx, append(users, "nobody"))
	if err != nil {
		t.Fatal(err)
	}
	for i, u := range users {
		if want := 1 + (1 - i%2); len(got[u]) != want {
			t.Fatalf("%s: %d devices, want %d", u, len(got[u]), want)
		}
	}
	if _, ok := got["nobody"]; ok {
		t.Fatal("Lookup returned an entry for a user never registered")
	}
}

func TestLeaseCacheBoundsStaleness(t *testing.T) {
	c := enginetest.Redis(t)
	prefix := enginetest.RedisPrefix(t, c)
	cfg := Config{Prefix: prefix, TTL: 5 * time.Second, LeaseCache: time.Second}
	writer, reader := newRegistry(t, c, cfg), newRegistry(t, c, cfg)
	mustRegister(t, writer, entry("alice", "phone", "n1", "s1"))
	if got := sessions(t, reader, "alice"); len(got) != 1 {
		t.Fatalf("sessions %v, want [s1]", got)
	}
	c.Del(ctx, prefix+"lease:n1") // the lease lapses behind the reader's back
	if got := sessions(t, reader, "alice"); len(got) != 1 {
		t.Fatalf("within LeaseCache: sessions %v, want the cached [s1]", got)
	}
	time.Sleep(1100 * time.Millisecond)
	if got := sessions(t, reader, "alice"); len(got) != 0 {
		t.Fatalf("past LeaseCache: sessions %v, want none", got)
	}
}

// BenchmarkLookup measures a Lookup of a 20-member group spread over 4 nodes.
func BenchmarkLookup(b *testing.B) {
	if os.Getenv("PARLEY_TEST_REDIS") == "" {
		b.Skip("PARLEY_TEST_REDIS is unset")
	}
	c := enginetest.Redis(b)
	r := newRegistry(b, c, Config{Prefix: enginetest.RedisPrefix(b, c)})
	var users []string
	for i := range 20 {
		u := "u" + hex.EncodeToString([]byte{byte(i)})
		users = append(users, u)
		mustRegister(b, r, entry(u, "d", "n"+hex.EncodeToString([]byte{byte(i % 4)}), "s"))
	}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := r.Lookup(ctx, users); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// TestRestoreAfterLostLease: Redis loses a gateway's lease and entries (a
// failover to a replica that had not got them, a restart without data):
// Refresh reports ErrLeaseLost, Restore brings the open connections back
// under a new lease, except a device that connected to another gateway
// meanwhile, and later Refreshes keep the new lease.
func TestRestoreAfterLostLease(t *testing.T) {
	c := enginetest.Redis(t)
	prefix := enginetest.RedisPrefix(t, c)
	r := newRegistry(t, c, Config{Prefix: prefix})
	mustRegister(t, r, entry("u1", "d1", "g1", "s1"))
	mustRegister(t, r, entry("u2", "d1", "g1", "s2"))
	mustRegister(t, r, entry("u3", "d1", "g1", "s3"))
	// Redis loses it all.
	keys, _ := c.Keys(ctx, prefix+"*").Result()
	c.Del(ctx, keys...)
	if err := r.Refresh(ctx, "g1"); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Refresh after the lease was lost: %v, want ErrLeaseLost", err)
	}
	// u3's device connected to g2 meanwhile.
	mustRegister(t, r, entry("u3", "d1", "g2", "s9"))
	users, err := r.Restore(ctx, "g1", []registry.Entry{entry("u1", "d1", "g1", "s1"), entry("u2", "d1", "g1", "s2"), entry("u3", "d1", "g1", "s3")})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(users)
	if !slices.Equal(users, []string{"u1", "u2"}) {
		t.Errorf("restored users %v, want [u1 u2]", users)
	}
	got, err := r.Lookup(ctx, []string{"u1", "u2", "u3"})
	if err != nil {
		t.Fatal(err)
	}
	for u, want := range map[string]string{"u1": "g1/s1", "u2": "g1/s2", "u3": "g2/s9"} {
		if es := got[u]; len(es) != 1 || es[0].Node+"/"+es[0].Session != want {
			t.Errorf("%s: %v, want %s", u, es, want)
		}
	}
	if err := r.Refresh(ctx, "g1"); err != nil {
		t.Errorf("Refresh after Restore: %v", err)
	}
	// DropNode still finds the restored entries through the index.
	if err := r.DropNode(ctx, "g1"); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.Lookup(ctx, []string{"u1", "u2"}); len(got) != 0 {
		t.Errorf("after DropNode: %v", got)
	}
}
