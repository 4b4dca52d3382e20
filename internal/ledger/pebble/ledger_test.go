package pebble_test

import (
	"context"
	"testing"
	"time"

	cpebble "github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/parley-im/parley/internal/ledger"
	"github.com/parley-im/parley/internal/ledger/ledgertest"
	"github.com/parley-im/parley/internal/ledger/pebble"
)

// The Pebble ledger on disk, and on a crashable in-memory file system for
// the crash subtest.
func TestConformance(t *testing.T) {
	open := func(fs func(t *testing.T) (vfs.FS, string, func() vfs.FS)) ledgertest.Open {
		return func(t *testing.T, p ledger.Policy) func() ledgertest.Instance {
			cur, dir, crash := fs(t)
			return func() ledgertest.Instance {
				l, err := pebble.Open(pebble.Config{Dir: dir, FS: cur, Policy: p, Poll: 10 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				in := ledgertest.Instance{Ledger: l, Close: func() {
					if err := l.Close(); err != nil {
						t.Error(err)
					}
				}}
				if crash != nil {
					in.Crash = func() { cur = crash() }
				}
				return in
			}
		}
	}
	t.Run("Disk", func(t *testing.T) {
		ledgertest.Run(t, open(func(t *testing.T) (vfs.FS, string, func() vfs.FS) {
			return vfs.Default, t.TempDir(), nil
		}))
	})
	t.Run("CrashableMem", func(t *testing.T) {
		ledgertest.Run(t, open(func(t *testing.T) (vfs.FS, string, func() vfs.FS) {
			fs := vfs.NewCrashableMem()
			return fs, "ledger", func() vfs.FS {
				fs = fs.CrashClone(vfs.CrashCloneCfg{})
				return fs
			}
		}))
	})
}

// A stored task that cannot be decoded dies at once, and the others run.
func TestUndecodableTaskDies(t *testing.T) {
	dir := t.TempDir()
	db, err := cpebble.Open(dir, &cpebble.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Set([]byte{0, 0, 0, 0, 0, 0, 0, 5}, []byte("{not json"), cpebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := pebble.Open(pebble.Config{Dir: dir, Poll: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Backlog() != 1 {
		t.Fatalf("backlog %d, want 1", l.Backlog())
	}
	ctx := context.Background()
	if err := l.Record(ctx, ledger.Task{Kind: ledger.KindRows, Conv: 1, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	ran := make(chan ledger.Task, 4)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = l.Run(rctx, func(_ context.Context, task ledger.Task) error { ran <- task; return nil })
	}()
	defer func() { cancel(); <-done }()
	select {
	case task := <-ran:
		if task.Conv != 1 || task.ID <= 5 {
			t.Fatalf("ran %+v, want conv 1 with an id above the stored one", task)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the decodable task did not run")
	}
	deadline := time.Now().Add(30 * time.Second)
	for l.Backlog() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("backlog %d, want 0", l.Backlog())
		}
		time.Sleep(10 * time.Millisecond)
	}
	dead, err := l.Dead(ctx, 10)
	if err != nil || len(dead) != 1 || dead[0].Error == "" {
		t.Fatalf("dead = %+v, %v; want the undecodable task with its error", dead, err)
	}
}
