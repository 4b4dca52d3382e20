package pebble_test

import (
	"context"
	"testing"

	"github.com/parley-im/parley/internal/hooks"
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

// TestExport lists queued events with their attempts and dead letters,
// page by page from each cursor, and leaves the queue as it was.
func TestExport(t *testing.T) {
	ctx := context.Background()
	q, err := pebble.Open(pebble.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	evs := []hooks.Event{
		{Endpoint: "a", Key: hooks.Key{Conv: 2, Seq: 1}, Body: []byte(`"a21"`)},
		{Endpoint: "a", Key: hooks.Key{Conv: 2, Seq: 2}, Body: []byte(`"a22"`)},
		{Endpoint: "b", Key: hooks.Key{Conv: 1, Seq: 7, Type: 1}, Body: []byte(`"b17"`)},
	}
	if err := q.Put(ctx, evs); err != nil {
		t.Fatal(err)
	}
	// b's event fails twice, a's first dies.
	sctx, stop := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go q.Serve(sctx, []string{"a", "b"}, func(ctx context.Context, ep string, l hooks.Lane) {
		hs, err := l.Heads(ctx, 0, 10, func(uint64) bool { return false })
		if err != nil || len(hs) != 1 {
			t.Errorf("%s: heads %v, %v", ep, hs, err)
		} else if h := hs[0]; ep == "a" {
			h.Attempts = 3
			err = l.Bury(ctx, h, "refused")
		} else {
			h.Attempts = 2
			err = l.Retry(ctx, h)
		}
		if err != nil {
			t.Error(err)
		}
		done <- struct{}{}
		<-ctx.Done()
	})
	<-done
	<-done
	stop()

	var got []pebble.Exported
	var after []byte
	for {
		page, err := q.Export(ctx, after, 1)
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
		t.Fatalf("exported %d events, want 3: %+v", len(got), got)
	}
	if d := got[0]; d.Endpoint != "a" || d.Dead == nil || d.Head.Key != evs[0].Key || d.Dead.Attempts != 3 || d.Dead.Error != "refused" || string(d.Dead.Event) != `"a21"` {
		t.Errorf("first: %+v (dead %+v), want a's dead letter of %v", d, d.Dead, evs[0].Key)
	}
	if e := got[1]; e.Endpoint != "a" || e.Dead != nil || e.Head.Key != evs[1].Key || e.Head.Attempts != 0 || string(e.Head.Body) != `"a22"` || e.Head.Queued.IsZero() {
		t.Errorf("second: %+v, want a's queued %v", e, evs[1].Key)
	}
	if e := got[2]; e.Endpoint != "b" || e.Dead != nil || e.Head.Key != evs[2].Key || e.Head.Attempts != 2 || string(e.Head.Body) != `"b17"` {
		t.Errorf("third: %+v, want b's queued %v after 2 attempts", e, evs[2].Key)
	}
	if backlog, dead := q.Stats("a"); backlog != 1 || dead != 1 {
		t.Errorf("a after the export: backlog %d, dead %d; want 1, 1", backlog, dead)
	}
}
