package pebble_test

import (
	"testing"

	"github.com/parley-im/parley/internal/hooks/hookstest"
	"github.com/parley-im/parley/internal/hooks/pebble"
)

// open gives each test a directory of its own; each process opens the
// database there again.
func open(t testing.TB) func() hookstest.Instance {
	dir := t.TempDir()
	return func() hookstest.Instance {
		q, err := pebble.Open(pebble.Config{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		return hookstest.Instance{Queue: q}
	}
}

func TestConformance(t *testing.T) { hookstest.Run(t, open) }

func BenchmarkProduceDeliver(b *testing.B) { hookstest.BenchmarkProduceDeliver(b, open) }
