package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

func ktLeaf(i uint64) []byte { return []byte(fmt.Sprintf("leaf %d", i)) }

// testKTLog: leaves append at the size, a taken index is a conflict that
// leaves the stored leaf alone, and pages run across the engines' buckets
// (Cassandra's are 1000 leaves) to the end of the log; the leaves survive
// a reopen.
func testKTLog(t *testing.T, e *env) {
	ctx := context.Background()
	if got, err := e.s.KTLeaves(ctx, 0, 10); err != nil || len(got) != 0 {
		t.Fatalf("empty log: %d leaves, %v", len(got), err)
	}
	const n = 2105
	for i := uint64(0); i < n; i++ {
		if err := e.s.KTAppend(ctx, i, ktLeaf(i)); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	if err := e.s.KTAppend(ctx, 7, []byte("another")); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("append at a taken index: %v, want ErrConflict", err)
	}
	check := func(from uint64, limit, want int) {
		t.Helper()
		got, err := e.s.KTLeaves(ctx, from, limit)
		if err != nil {
			t.Fatalf("leaves from %d limit %d: %v", from, limit, err)
		}
		if len(got) != want {
			t.Fatalf("leaves from %d limit %d: %d leaves, want %d", from, limit, len(got), want)
		}
		for i, l := range got {
			if !bytes.Equal(l, ktLeaf(from+uint64(i))) {
				t.Fatalf("leaf %d = %q", from+uint64(i), l)
			}
		}
	}
	check(0, 1000, 1000)
	check(999, 2, 2)
	check(1000, 1000, 1000)
	check(1500, 1000, 605)
	check(2000, 1000, 105)
	check(2104, 1000, 1)
	check(n, 1000, 0)
	check(n+5000, 10, 0)
	check(7, 1, 1)
	var all [][]byte
	for from := uint64(0); ; {
		page, err := e.s.KTLeaves(ctx, from, 333)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		all = append(all, page...)
		from += uint64(len(page))
	}
	if len(all) != n {
		t.Fatalf("paged %d leaves, want %d", len(all), n)
	}
	e.reopen(t)
	check(2000, 1000, 105)
	if err := e.s.KTAppend(ctx, n, ktLeaf(n)); err != nil {
		t.Fatalf("append after reopen: %v", err)
	}
	check(n, 10, 1)
}

// testKTAppendRace: writers appending at the same index at once (two chat
// processes) get exactly one success per index; every loser sees
// ErrConflict and the stored leaf is the winner's.
func testKTAppendRace(t *testing.T, e *env) {
	ctx := context.Background()
	const writers, rounds = 4, 20
	for i := uint64(0); i < rounds; i++ {
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			won  []int
			errs []error
		)
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := e.s.KTAppend(ctx, i, []byte(fmt.Sprintf("leaf %d by %d", i, w)))
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					won = append(won, w)
				case !errors.Is(err, store.ErrConflict):
					errs = append(errs, err)
				}
			}()
		}
		wg.Wait()
		if len(errs) > 0 || len(won) != 1 {
			t.Fatalf("index %d: winners %v, errors %v; want one winner and conflicts", i, won, errs)
		}
		got, err := e.s.KTLeaves(ctx, i, 1)
		if err != nil || len(got) != 1 || string(got[0]) != fmt.Sprintf("leaf %d by %d", i, won[0]) {
			t.Fatalf("index %d holds %q (%v), want the winner %d's", i, got, err, won[0])
		}
	}
}

// testKTKeys: the first KTKeys stores its keys, every later one (also
// concurrent ones, as every chat process of a deployment starting at once)
// gets those, whatever it offered, also after a reopen.
func testKTKeys(t *testing.T, e *env) {
	ctx := context.Background()
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		got = map[string]int{}
	)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k, err := e.s.KTKeys(ctx, []byte(fmt.Sprintf("keys of %d", w)))
			if err != nil {
				t.Errorf("KTKeys: %v", err)
				return
			}
			mu.Lock()
			got[string(k)]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(got) != 1 {
		t.Fatalf("concurrent KTKeys returned %v, want one value for all", got)
	}
	var first string
	for k := range got {
		first = k
	}
	e.reopen(t)
	k, err := e.s.KTKeys(ctx, []byte("later"))
	if err != nil || string(k) != first {
		t.Fatalf("KTKeys after reopen = %q, %v; want %q", k, err, first)
	}
}

// testKTBadArguments: the seam refuses what no engine stores.
func testKTBadArguments(t *testing.T, e *env) {
	ctx := context.Background()
	for name, err := range map[string]error{
		"empty leaf":      e.s.KTAppend(ctx, 0, nil),
		"huge leaf":       e.s.KTAppend(ctx, 0, make([]byte, store.MaxKTLeafBytes+1)),
		"index past 2^63": e.s.KTAppend(ctx, 1<<63, []byte("x")),
	} {
		if err == nil || errors.Is(err, store.ErrConflict) {
			t.Errorf("%s: %v, want a plain error", name, err)
		}
	}
	for _, limit := range []int{0, -1, store.MaxKTPage + 1} {
		if _, err := e.s.KTLeaves(ctx, 0, limit); err == nil {
			t.Errorf("KTLeaves limit %d accepted", limit)
		}
	}
	if _, err := e.s.KTKeys(ctx, nil); err == nil {
		t.Error("KTKeys of nothing accepted")
	}
	if got, err := e.s.KTLeaves(ctx, 0, 10); err != nil || len(got) != 0 {
		t.Errorf("a refused append stored something: %d leaves, %v", len(got), err)
	}
}
