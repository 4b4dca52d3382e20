package pebble_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
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

// The index the queue keeps in memory answers as the database does: after
// random puts, retries, deliveries and burials, the heads of the queue
// that made them are those of a queue opened again on its files (which
// builds its index from them alone).
func TestIndexMatchesDatabase(t *testing.T) {
	dir := t.TempDir()
	q, err := pebble.Open(pebble.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	ctx := context.Background()
	l := lane(t, q)
	for range 2000 {
		conv, seq := uint64(rng.IntN(50)), uint64(rng.IntN(8))
		switch op := rng.IntN(4); {
		case op < 2:
			e := hooks.Event{Endpoint: "ep", Key: hooks.Key{Conv: conv, Seq: seq, Type: uint8(rng.IntN(2))}, Body: fmt.Appendf(nil, `{"conv":%d,"seq":%d}`, conv, seq)}
			if err := q.Put(ctx, []hooks.Event{e}); err != nil {
				t.Fatal(err)
			}
		default:
			hs, err := l.Heads(ctx, conv, 1, func(uint64) bool { return false })
			if err != nil {
				t.Fatal(err)
			}
			if len(hs) == 0 {
				continue
			}
			h := hs[0]
			h.Attempts++
			switch rng.IntN(3) {
			case 0:
				err = l.Retry(ctx, h)
			case 1:
				err = l.Done(ctx, h)
			default:
				err = l.Bury(ctx, h, "cause")
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	all := func(l hooks.Lane, from uint64) []hooks.Head {
		hs, err := l.Heads(ctx, from, 1<<20, func(uint64) bool { return false })
		if err != nil {
			t.Fatal(err)
		}
		return hs
	}
	backlog, dead := q.Stats("ep")
	var live [][]hooks.Head
	for _, from := range []uint64{0, 17, 49, 50} {
		live = append(live, all(l, from))
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	q2, err := pebble.Open(pebble.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer q2.Close()
	if b, d := q2.Stats("ep"); b != backlog || d != dead {
		t.Fatalf("reopened: backlog %d, dead %d; the queue before counted %d, %d", b, d, backlog, dead)
	}
	l2 := lane(t, q2)
	for i, from := range []uint64{0, 17, 49, 50} {
		got := all(l2, from)
		if !slices.EqualFunc(got, live[i], func(a, b hooks.Head) bool {
			return a.Key == b.Key && a.Attempts == b.Attempts && a.More == b.More && string(a.Body) == string(b.Body)
		}) {
			t.Fatalf("Heads(from %d) reopened = %+v\nbefore = %+v", from, got, live[i])
		}
	}
	if len(live[0]) == 0 || backlog == 0 || dead == 0 {
		t.Fatalf("the run left %d heads, backlog %d, dead %d: it exercised too little", len(live[0]), backlog, dead)
	}
}

// lane returns the queue's lane of endpoint "ep", served until the test
// ends.
func lane(t *testing.T, q hooks.Queue) hooks.Lane {
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan hooks.Lane, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		q.Serve(ctx, []string{"ep"}, func(ctx context.Context, _ string, l hooks.Lane) {
			got <- l
			<-ctx.Done()
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return <-got
}
