package pebble

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

// BenchmarkTakeBundle: prekey bundle fetches per second on the embedded
// store (disk, fsync per fetch shared by group commit). Each fetch takes
// one one-time prekey and one KEM prekey; devices are refilled outside the
// timer. parallel: 16 goroutines on 64 devices.
func BenchmarkTakeBundle(b *testing.B) {
	for _, par := range []bool{false, true} {
		name := "serial"
		if par {
			name = "parallel"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			s, err := Open(ctx, Config{Dir: filepath.Join(b.TempDir(), "db")})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			const devices, perDevice = 64, 1000
			kem := make([]byte, 1569)
			for d := 0; d < devices; d++ {
				up := store.KeyUpload{RegistrationID: 1, IdentityKey: make([]byte, 33),
					SignedPreKey:  &store.PreKey{ID: 1, Key: make([]byte, 33), Sig: make([]byte, 64)},
					LastResortKEM: &store.PreKey{ID: 1, Key: kem, Sig: make([]byte, 64)}}
				for i := 0; i < perDevice; i++ {
					up.PreKeys = append(up.PreKeys, store.PreKey{ID: uint32(i + 1), Key: make([]byte, 33)})
					up.KEMPreKeys = append(up.KEMPreKeys, store.PreKey{ID: uint32(i + 1), Key: kem, Sig: make([]byte, 64)})
				}
				if _, err := s.UploadKeys(ctx, "user", fmt.Sprint("d", d), up); err != nil {
					b.Fatal(err)
				}
			}
			var n atomic.Uint64
			take := func() {
				i := n.Add(1)
				if _, err := s.TakeBundle(ctx, "user", fmt.Sprint("d", i%devices)); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			if par {
				b.SetParallelism(16)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						take()
					}
				})
			} else {
				for i := 0; i < b.N; i++ {
					take()
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "fetches/s")
		})
	}
}
