// Package registrytest is the conformance suite every registry.Registry
// engine must pass.
package registrytest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/parley-im/parley/internal/registry"
)

// Run runs the suite; open returns a fresh, empty registry per subtest.
func Run(t *testing.T, open func(t *testing.T) registry.Registry) {
	ctx := context.Background()
	entry := func(u, d, n, s string) registry.Entry {
		return registry.Entry{User: u, Device: d, Node: n, Session: s, Since: 1}
	}
	t.Run("RegisterLookupUnregister", func(t *testing.T) {
		r := open(t)
		mustRegister(t, r, entry("alice", "phone", "n1", "s1"))
		mustRegister(t, r, entry("alice", "laptop", "n2", "s2"))
		got, err := r.Lookup(ctx, []string{"alice", "bob"})
		if err != nil {
			t.Fatal(err)
		}
		if len(got["alice"]) != 2 || len(got["bob"]) != 0 {
			t.Fatalf("Lookup = %v, want 2 devices of alice and none of bob", got)
		}
		if err := r.Unregister(ctx, "alice", "phone", "s1"); err != nil {
			t.Fatal(err)
		}
		got, _ = r.Lookup(ctx, []string{"alice"})
		if len(got["alice"]) != 1 || got["alice"][0].Device != "laptop" {
			t.Fatalf("after unregister Lookup = %v, want only laptop", got)
		}
	})
	t.Run("ReplaceReturnsOld", func(t *testing.T) {
		r := open(t)
		mustRegister(t, r, entry("bob", "phone", "n1", "s1"))
		old, err := r.Register(ctx, entry("bob", "phone", "n2", "s9"))
		if err != nil {
			t.Fatal(err)
		}
		if old == nil || old.Session != "s1" || old.Node != "n1" {
			t.Fatalf("replaced = %+v, want session s1 on n1", old)
		}
		// A late unregister of the replaced session must not remove the new one.
		if err := r.Unregister(ctx, "bob", "phone", "s1"); err != nil {
			t.Fatal(err)
		}
		got, _ := r.Lookup(ctx, []string{"bob"})
		if len(got["bob"]) != 1 || got["bob"][0].Session != "s9" {
			t.Fatalf("Lookup = %v, want the new session s9", got)
		}
	})
	t.Run("DropNode", func(t *testing.T) {
		r := open(t)
		mustRegister(t, r, entry("u1", "d", "n1", "a"))
		mustRegister(t, r, entry("u2", "d", "n2", "b"))
		if err := r.DropNode(ctx, "n1"); err != nil {
			t.Fatal(err)
		}
		got, _ := r.Lookup(ctx, []string{"u1", "u2"})
		if len(got["u1"]) != 0 || len(got["u2"]) != 1 {
			t.Fatalf("Lookup = %v, want u1 gone and u2 kept", got)
		}
	})
	t.Run("Concurrent", func(t *testing.T) {
		r := open(t)
		var wg sync.WaitGroup
		for i := 0; i < 16; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				for j := 0; j < 50; j++ {
					e := entry(fmt.Sprintf("u%d", j), fmt.Sprintf("d%d", i), "n1", fmt.Sprintf("s%d-%d", i, j))
					if _, err := r.Register(ctx, e); err != nil {
						t.Error(err)
						return
					}
				}
			}(i)
		}
		wg.Wait()
		got, _ := r.Lookup(ctx, []string{"u0", "u49"})
		if len(got["u0"]) != 16 || len(got["u49"]) != 16 {
			t.Fatalf("got %d and %d devices, want 16 each", len(got["u0"]), len(got["u49"]))
		}
	})
}

func mustRegister(t *testing.T, r registry.Registry, e registry.Entry) {
	t.Helper()
	if _, err := r.Register(context.Background(), e); err != nil {
		t.Fatalf("Register(%+v): %v", e, err)
	}
}
