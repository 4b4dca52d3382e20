package pebble

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/storetest"
)

// openT opens the engine itself, without the seam's checks.
func openT(t *testing.T, cfg Config) *Store {
	t.Helper()
	s, err := open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return s
}

// harness reopens the store with the Config it was opened with. The suite
// runs on what Open returns: the engine behind the seam.
func harness(cfgOf func(t *testing.T) Config) storetest.Harness {
	cfgs := map[store.Store]Config{}
	openSeam := func(t *testing.T, cfg Config) store.Store {
		s, err := Open(context.Background(), cfg)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		cfgs[s] = cfg
		return s
	}
	return storetest.Harness{
		Open: func(t *testing.T) store.Store { return openSeam(t, cfgOf(t)) },
		Reopen: func(t *testing.T, old store.Store) store.Store {
			if err := old.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			return openSeam(t, cfgs[old])
		},
		Evict: func(s store.Store) { store.Engine(s).(*Store).EvictIdle() },
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

// TestConformanceOneState runs the suite with room for one conversation
// state, so nearly every call finds its conversation evicted and loads it
// again (and with a 1 ms idle time, the others go too).
func TestConformanceOneState(t *testing.T) {
	storetest.Run(t, harness(func(t *testing.T) Config {
		return Config{Dir: "db", FS: vfs.NewMem(), BucketWidth: time.Hour, ConvStates: 1, ConvIdle: time.Millisecond}
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

// TestEditKeepsCoalesceKey: the K row indexes a state message by its key,
// so an edit's Check cannot move the message to another key.
func TestEditKeepsCoalesceKey(t *testing.T) {
	ctx := context.Background()
	s := openT(t, Config{Dir: "db", FS: vfs.NewMem()})
	defer s.Close()
	if err := s.CreateConversation(ctx, store.Conversation{ID: 1, Kind: store.Group}, []store.Member{{UserID: "a"}}); err != nil {
		t.Fatalf("CreateConversation: %v", err)
	}
	for id, key := range []string{"k", "other"} {
		m := store.Message{ConvID: 1, MsgID: uint64(id + 1), Sender: "a", Kind: "state", CoalesceKey: key, Body: key}
		if _, err := s.Append(ctx, store.Append{Msg: m}); err != nil {
			t.Fatalf("Append: %v", err)
		}
	}
	ev := store.Message{ConvID: 1, MsgID: 3, Sender: "a", Kind: "edit", TargetSeq: 1}
	_, err := s.Append(ctx, store.Append{Msg: ev, Check: func(m store.Message) (store.Message, error) {
		m.CoalesceKey, m.Body, m.Edited = "other", "edited", true
		return m, nil
	}})
	if err != nil {
		t.Fatalf("Append(edit): %v", err)
	}
	msgs, err := s.Messages(ctx, 1, 1, 1, 1)
	if err != nil || len(msgs) != 1 || msgs[0].CoalesceKey != "k" || msgs[0].Superseded || msgs[0].Body != "edited" {
		t.Errorf("edited state = %+v, %v; want key k kept, body edited, not superseded", msgs, err)
	}
}

// TestBrokenRefusesWrites: after a failed WAL sync the store behind the
// seam refuses every write (store.Broken) and still serves reads.
func TestBrokenRefusesWrites(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, Config{Dir: "db", FS: vfs.NewMem()})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	if err := s.CreateConversation(ctx, store.Conversation{ID: 1, Kind: store.Group}, []store.Member{{UserID: "a"}}); err != nil {
		t.Fatalf("CreateConversation: %v", err)
	}
	injected := errors.New("injected sync failure")
	store.Engine(s).(*Store).fail(injected)
	_, err = s.Append(ctx, store.Append{Msg: store.Message{ConvID: 1, MsgID: 1, Sender: "a", Kind: "text"}})
	if !errors.Is(err, injected) {
		t.Errorf("Append after a failed sync: %v, want %v", err, injected)
	}
	if _, err := s.SetRead(ctx, "a", "", 1, 1); !errors.Is(err, injected) {
		t.Errorf("SetRead after a failed sync: %v, want %v", err, injected)
	}
	if c, err := s.Conversation(ctx, 1); err != nil || c.LastSeq != 0 {
		t.Errorf("Conversation after a failed sync = %+v, %v; want it, last seq 0", c, err)
	}
}
