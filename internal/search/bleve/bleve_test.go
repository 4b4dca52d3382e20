package bleve_test

import (
	"path/filepath"
	"testing"

	"github.com/parley-im/parley/internal/search"
	"github.com/parley-im/parley/internal/search/bleve"
	"github.com/parley-im/parley/internal/search/searchtest"
)

func open(t *testing.T, dir string) search.Index {
	t.Helper()
	x, err := bleve.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func TestConformance(t *testing.T) {
	dirs := map[search.Index]string{}
	searchtest.Run(t, searchtest.Harness{
		Open: func(t *testing.T) search.Index {
			dir := filepath.Join(t.TempDir(), "search")
			x := open(t, dir)
			dirs[x] = dir
			return x
		},
		Reopen: func(t *testing.T, x search.Index) search.Index {
			if err := x.Close(); err != nil {
				t.Fatal(err)
			}
			y := open(t, dirs[x])
			dirs[y] = dirs[x]
			return y
		},
	})
}
