package pebble

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/storetest"
)

func openT(t *testing.T, cfg Config) *Store {
	t.Helper()
	s, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

// harness reopens the store with the Config it was opened with.
func harness(cfgOf func(t *testing.T) Config) storetest.Harness {
	cfgs := map[store.Store]Config{}
	return storetest.Harness{
		Open: func(t *testing.T) store.Store {
			cfg := cfgOf(t)
			s := openT(t, cfg)
			cfgs[s] = cfg
			return s
		},
		Reopen: func(t *testing.T, old store.Store) store.Store {
			cfg := cfgs[old]
			if err := old.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			s := openT(t, cfg)
			cfgs[s] = cfg
			return s
		},
	}
}

func TestConformanceDisk(t *testing.T) {
	storetest.Run(t, harness(func(t *testing.T) Config {
		return Config{Dir: filepath.Join(t.TempDir(), "db")}
	}))
}

func TestConformanceMem(t *testing.T) {
	storetest.Run(t, harness(func(t *testing.T) Config {
		// A small bucket width puts the suite's messages in many buckets.
		return Config{Dir: "db", FS: vfs.NewMem(), BucketWidth: time.Hour}
	}))
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{Dir: "d"}, true},
		{"no dir", Config{}, false},
		{"bucket below 1ms", Config{Dir: "d", BucketWidth: 10}, false},
		{"negative cache", Config{Dir: "d", CacheSize: -1}, false},
	}
	for _, tc := range tests {
		if err := tc.cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
	if _, err := Open(context.Background(), Config{}); err == nil {
		t.Error("Open with an invalid Config succeeded")
	}
}
