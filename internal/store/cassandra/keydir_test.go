package cassandra

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

// TestTwoProcessesTakeBundles: two Stores on one keyspace (two chat
// processes) fetch bundles of one device at once; the lightweight
// transaction hands out each one-time key exactly once.
func TestTwoProcessesTakeBundles(t *testing.T) {
	cfg := fresh(t)
	ctx := context.Background()
	procs := []*Store{openT(t, cfg), openT(t, cfg)}
	const keys = 30
	up := store.KeyUpload{RegistrationID: 1, IdentityKey: []byte("id"),
		SignedPreKey:  &store.PreKey{ID: 1, Key: []byte("spk"), Sig: []byte("s")},
		LastResortKEM: &store.PreKey{ID: 99, Key: []byte("lr"), Sig: []byte("s")}}
	for i := 1; i <= keys; i++ {
		up.PreKeys = append(up.PreKeys, store.PreKey{ID: uint32(i), Key: []byte(fmt.Sprint("pk", i))})
	}
	if _, err := procs[0].UploadKeys(ctx, "bob", "phone", up); err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		seen = map[uint32]int{}
		wg   sync.WaitGroup
	)
	for p := range procs {
		for w := 0; w < 4; w++ {
			wg.Go(func() {
				for i := 0; i < keys/8+2; i++ {
					b, err := procs[p].TakeBundle(ctx, "bob", "phone")
					if err != nil {
						t.Errorf("process %d: %v", p, err)
						return
					}
					if b.PreKey != nil {
						mu.Lock()
						seen[b.PreKey.ID]++
						mu.Unlock()
					}
				}
			})
		}
	}
	wg.Wait()
	if len(seen) != keys {
		t.Fatalf("%d distinct keys handed out, want %d", len(seen), keys)
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("key %d handed out %d times", id, n)
		}
	}
}
