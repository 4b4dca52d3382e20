package opensearch_test

import (
	"context"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/enginetest"
	"github.com/parley-im/parley/internal/search"
	"github.com/parley-im/parley/internal/search/opensearch"
	"github.com/parley-im/parley/internal/search/searchtest"
)

func open(t *testing.T, cfg opensearch.Config) search.Index {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	x, err := opensearch.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// TestConformance runs the suite against the real node: each subtest
// has indexes of its own, and Reopen connects again to the same ones.
func TestConformance(t *testing.T) {
	cfgs := map[search.Index]opensearch.Config{}
	searchtest.Run(t, searchtest.Harness{
		Open: func(t *testing.T) search.Index {
			cfg := enginetest.OpenSearch(t)
			x := open(t, cfg)
			cfgs[x] = cfg
			return x
		},
		Reopen: func(t *testing.T, x search.Index) search.Index {
			if err := x.Close(); err != nil {
				t.Fatal(err)
			}
			y := open(t, cfgs[x])
			cfgs[y] = cfgs[x]
			return y
		},
	})
}
