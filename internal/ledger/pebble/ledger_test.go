package pebble_test

import (
	"context"
	"errors"
	"slices"
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

// TestExport lists pending tasks with their attempts and due times, then
// dead ones, page by page from each cursor, and leaves the ledger as it
// was.
func TestExport(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	// run records tasks and runs the ledger until settled says the
	// outcome of their attempts is stored.
	run := func(p ledger.Policy, record []ledger.Task, h ledger.Handler, settled func(pebble.Exported) bool) {
		t.Helper()
		l, err := pebble.Open(pebble.Config{Dir: dir, Policy: p, Poll: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		for _, task := range record {
			if err := l.Record(ctx, task); err != nil {
				t.Fatal(err)
			}
		}
		rctx, stop := context.WithCancel(ctx)
		go func() {
			defer stop()
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				page, err := l.Export(ctx, nil, 10)
				if err == nil && slices.ContainsFunc(page, settled) {
					return
				}
			}
			t.Error("the attempts' outcome was never stored")
		}()
		_ = l.Run(rctx, h)
	}
	failed := errors.New("refused")
	// Task 1 dies at its only attempt; task 2 fails once and waits an hour.
	run(ledger.Policy{MaxAttempts: 1}, []ledger.Task{{Kind: ledger.KindRows, Conv: 1, Seq: 4, Users: []string{"ann"}}},
		func(context.Context, ledger.Task) error { return failed }, func(e pebble.Exported) bool { return e.Dead })
	run(ledger.Policy{MaxAttempts: 5, MinBackoff: time.Hour, MaxBackoff: time.Hour},
		[]ledger.Task{{Kind: ledger.KindPush, Conv: 2, Seq: 9, Users: []string{"bo"}, Node: "n1"}},
		func(context.Context, ledger.Task) error { return failed }, func(e pebble.Exported) bool { return !e.Dead && e.Task.NextAt != 0 })
	l, err := pebble.Open(pebble.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Record(ctx, ledger.Task{Kind: ledger.KindRows, Conv: 3, Seq: 1, Users: []string{"cy"}, Mention: true}); err != nil {
		t.Fatal(err)
	}

	var got []pebble.Exported
	var after []byte
	for {
		page, err := l.Export(ctx, after, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		if len(page) != 1 {
			t.Fatalf("a page of %d, want at most 1", len(page))
		}
		got = append(got, page...)
		after = page[0].Cursor
	}
	if len(got) != 3 {
		t.Fatalf("exported %d tasks, want 3: %+v", len(got), got)
	}
	if e := got[0]; e.Dead || e.Task.ID != 2 || e.Task.Conv != 2 || e.Task.Kind != ledger.KindPush || e.Task.Node != "n1" || e.Task.Attempts != 1 || e.Task.NextAt < time.Now().Add(50*time.Minute).UnixMilli() {
		t.Errorf("first: %+v, want task 2 pending after 1 attempt, due in an hour", e)
	}
	if e := got[1]; e.Dead || e.Task.ID != 3 || e.Task.Conv != 3 || !e.Task.Mention || e.Task.Attempts != 0 {
		t.Errorf("second: %+v, want task 3 pending, never attempted", e)
	}
	if e := got[2]; !e.Dead || e.Task.ID != 1 || e.Task.Conv != 1 || e.Task.Attempts != 1 || e.Task.Error != "refused" {
		t.Errorf("third: %+v, want task 1 dead after 1 attempt", e)
	}
	if n := l.Backlog(); n != 2 {
		t.Errorf("backlog after the export %d, want 2", n)
	}
}
