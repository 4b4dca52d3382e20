package kt

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

// prefill gives the log n changes of n/10 users.
func prefill(b *testing.B, l *Log, d *directory, n int) {
	b.Helper()
	for i := range n {
		u := fmt.Sprintf("u%d", i%(n/10))
		d.set(u, device("p", byte(i)), device("q", byte(i+1)))
		d.ensure(b, l, u)
	}
}

// BenchmarkEnsure measures the log on Pebble on disk, over a log of
// 10,000 changes: an append (a user's device changed: the entry, its
// durable write — one fsync — and the tree), and an answer's kt object
// when nothing changed (catching up with the store, the inclusion proof,
// the cached checkpoint and label).
func BenchmarkEnsure(b *testing.B) {
	st := openStore(b, filepath.Join(b.TempDir(), "db"))
	l := openLog(b, st)
	var d directory
	prefill(b, l, &d, 10_000)
	ctx := context.Background()
	b.Run("append", func(b *testing.B) {
		i := 0
		for b.Loop() {
			i++
			devs := []store.DeviceKeys{device("p", byte(i)), device("r", byte(i>>8))}
			if _, err := l.Ensure(ctx, "bench", devs, func(context.Context) ([]store.DeviceKeys, error) { return devs, nil }); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
	})
	b.Run("unchanged", func(b *testing.B) {
		devs := d.get("u7")
		read := d.reader("u7")
		before := l.Size()
		for b.Loop() {
			if _, err := l.Ensure(ctx, "u7", devs, read); err != nil {
				b.Fatal(err)
			}
		}
		if l.Size() != before {
			b.Fatal("an unchanged state appended")
		}
	})
}
