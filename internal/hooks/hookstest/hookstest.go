// Package hookstest is the conformance suite of the webhook queue
// (hooks.Queue): what every engine promises the delivery loop, and the
// webhooks' delivery tests (retries, stalls, dead letters, restarts,
// order while producing, a hand-over between processes) run through
// internal/hooks on that engine. internal/hooks/pebble runs it on disk and
// internal/hooks/jetstream on a real NATS JetStream.
//
// The queue's promises:
//
//   - Put is durable once it returns, and an event queued twice (same
//     endpoint and key) is stored once.
//   - Serve hands out lanes; a conversation's events are in one lane, and
//     its head is its first pending event in (seq, type) order, whatever
//     order they were put in. Heads starts at conversation from, wraps
//     around, stops at limit and passes over what skip names.
//   - Done removes the head, Retry records its attempts, Bury moves it to
//     the dead letters with its attempts and cause; Stats counts what is
//     queued and dead per endpoint.
//   - Changed is signalled when events arrive.
//   - What was neither done nor buried is handed out again by the next
//     process on the same storage.
package hookstest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/hooks"
)

// Instance is one process's queue.
type Instance struct {
	Queue hooks.Queue
	// Close releases what the queue runs on (the NATS connection) after
	// Queue.Close; nil if nothing.
	Close func()
}

func (in Instance) close() {
	if in.Close != nil {
		in.Close()
	}
}

// Open prepares storage of the test's own and returns a function opening
// a process's queue on it; each call is a new process, after the last one
// was closed.
type Open func(t testing.TB) func() Instance

// Run runs the suite.
func Run(t *testing.T, open Open) {
	for _, tc := range []struct {
		name string
		f    func(*testing.T, Open)
	}{
		{"OrderPerConversation", testOrderPerConversation},
		{"PutTwiceStoredOnce", testPutTwice},
		{"RetryAndBury", testRetryAndBury},
		{"HeadsFromLimitSkip", testHeadsFromLimitSkip},
		{"HandedOutAgainAfterReopen", testReopen},
		{"Changed", testChanged},
		{"DeliveryFailStallRecover", testDeliveryFailStallRecover},
		{"DeadLetter", testDeadLetter},
		{"QueueSurvivesRestart", testQueueSurvivesRestart},
		{"OfflinePreviewAndE2E", testOfflinePreviewAndE2E},
		{"OrderWhileProducing", testOrderWhileProducing},
		{"HandOver", testHandOver},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, open) })
	}
}

var ctx = context.Background()

// served collects the lanes a queue's Serve hands out.
type served struct {
	mu      sync.Mutex
	lanes   map[string][]hooks.Lane
	changed map[string]int
}

// serve runs q.Serve until the returned stop is called (or the test ends).
func serve(t *testing.T, q hooks.Queue, endpoints ...string) (*served, func()) {
	s := &served{lanes: map[string][]hooks.Lane{}, changed: map[string]int{}}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		q.Serve(sctx, endpoints, func(ctx context.Context, ep string, l hooks.Lane) {
			s.mu.Lock()
			s.lanes[ep] = append(s.lanes[ep], l)
			s.mu.Unlock()
			defer func() {
				s.mu.Lock()
				s.lanes[ep] = slices.DeleteFunc(s.lanes[ep], func(x hooks.Lane) bool { return x == l })
				s.mu.Unlock()
			}()
			for {
				select {
				case <-ctx.Done():
					return
				case <-l.Changed():
					if l.Err() != nil {
						return
					}
					s.mu.Lock()
					s.changed[ep]++
					s.mu.Unlock()
				}
			}
		})
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Error("Serve did not return within 10s of its context's end")
			}
		})
	}
	t.Cleanup(stop)
	return s, stop
}

// laneHead is a head and the lane that handed it out.
type laneHead struct {
	hooks.Head
	lane hooks.Lane
}

func none(uint64) bool { return false }

// heads polls the endpoint's lanes until they hand out n heads in all
// (events reach some engines' lanes asynchronously), in conversation
// order.
func (s *served) heads(t *testing.T, ep string, n int) []laneHead {
	t.Helper()
	var got []laneHead
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got = got[:0]
		s.mu.Lock()
		lanes := slices.Clone(s.lanes[ep])
		s.mu.Unlock()
		for _, l := range lanes {
			hs, err := l.Heads(ctx, 0, 1<<20, none)
			if err != nil {
				t.Fatalf("Heads: %v", err)
			}
			for _, h := range hs {
				got = append(got, laneHead{h, l})
			}
		}
		if len(got) == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("endpoint %s: %d heads, want %d", ep, len(got), n)
		}
	}
	slices.SortFunc(got, func(a, b laneHead) int { return cmp.Compare(a.Conv, b.Conv) })
	return got
}

// waitStats waits for the endpoint's Stats (some engines count shared
// streams, polled).
func waitStats(t *testing.T, q hooks.Queue, ep string, backlog, dead int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		b, d := q.Stats(ep)
		if b == backlog && d == dead {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Stats(%s) = backlog %d, dead %d; want %d, %d", ep, b, d, backlog, dead)
		}
	}
}

func ev(ep string, conv, seq uint64, typ uint8) hooks.Event {
	return hooks.Event{Endpoint: ep, Key: hooks.Key{Conv: conv, Seq: seq, Type: typ}, Body: fmt.Appendf(nil, `{"ep":%q,"conv":%d,"seq":%d,"type":%d}`, ep, conv, seq, typ)}
}

func put(t *testing.T, q hooks.Queue, evs ...hooks.Event) {
	t.Helper()
	if err := q.Put(ctx, evs); err != nil {
		t.Fatalf("Put: %v", err)
	}
}

// instance opens one process's queue, closed when the test ends (or by
// the returned func, once).
func instance(t *testing.T, proc func() Instance) (hooks.Queue, func()) {
	in := proc()
	var once sync.Once
	closeIt := func() {
		once.Do(func() {
			if err := in.Queue.Close(); err != nil {
				t.Error(err)
			}
			in.close()
		})
	}
	t.Cleanup(closeIt)
	return in.Queue, closeIt
}

func wantHead(t *testing.T, h laneHead, e hooks.Event) {
	t.Helper()
	if h.Key != e.Key || string(h.Body) != string(e.Body) {
		t.Fatalf("head %+v %s, want %+v %s", h.Key, h.Body, e.Key, e.Body)
	}
}

// Events put out of order come out in (seq, type) order per conversation,
// each endpoint apart.
func testOrderPerConversation(t *testing.T, open Open) {
	q, _ := instance(t, open(t))
	before := time.Now()
	a12, a11, a10, a20, b50 := ev("a", 1, 2, 0), ev("a", 1, 1, 1), ev("a", 1, 1, 0), ev("a", 2, 1, 0), ev("b", 1, 5, 0)
	put(t, q, a12, a11)
	put(t, q, a10, a20, b50)
	waitStats(t, q, "a", 4, 0)
	waitStats(t, q, "b", 1, 0)
	s, _ := serve(t, q, "a", "b")
	hs := s.heads(t, "a", 2)
	wantHead(t, hs[0], a10)
	wantHead(t, hs[1], a20)
	for _, h := range hs {
		if h.Attempts != 0 || h.Queued.Before(before.Add(-time.Second)) || h.Queued.After(time.Now()) {
			t.Fatalf("fresh head: attempts %d, queued %s (put at %s)", h.Attempts, h.Queued, before)
		}
	}
	// More tells a head with events of its conversation behind it.
	if !hs[0].More || hs[1].More {
		t.Fatalf("More of a head with two behind: %v, of one alone: %v", hs[0].More, hs[1].More)
	}
	if b := s.heads(t, "b", 1)[0]; b.More {
		t.Fatal("More of an endpoint's only event")
	}
	wantHead(t, s.heads(t, "b", 1)[0], b50)
	for i, next := range []hooks.Event{a11, a12} {
		if err := hs[0].lane.Done(ctx, hs[0].Head); err != nil {
			t.Fatal(err)
		}
		hs = s.heads(t, "a", 2)
		wantHead(t, hs[0], next)
		if hs[0].More != (i == 0) {
			t.Fatalf("More of %+v: %v", next.Key, hs[0].More)
		}
	}
	for _, h := range hs {
		if err := h.lane.Done(ctx, h.Head); err != nil {
			t.Fatal(err)
		}
	}
	s.heads(t, "a", 0)
	waitStats(t, q, "a", 0, 0)
	waitStats(t, q, "b", 1, 0)
}

// An event put again (a repeated fan-out) is one event.
func testPutTwice(t *testing.T, open Open) {
	q, _ := instance(t, open(t))
	e := ev("a", 3, 1, 0)
	put(t, q, e)
	put(t, q, e)
	s, _ := serve(t, q, "a")
	h := s.heads(t, "a", 1)[0]
	put(t, q, e)
	waitStats(t, q, "a", 1, 0)
	if err := h.lane.Done(ctx, h.Head); err != nil {
		t.Fatal(err)
	}
	s.heads(t, "a", 0)
	time.Sleep(300 * time.Millisecond) // a second copy would show by now
	s.heads(t, "a", 0)
	waitStats(t, q, "a", 0, 0)
}

// Retry records attempts; Bury moves the head to the dead letters and
// the conversation's next event is its head.
func testRetryAndBury(t *testing.T, open Open) {
	q, _ := instance(t, open(t))
	e1, e2 := ev("a", 4, 1, 0), ev("a", 4, 2, 0)
	put(t, q, e1, e2)
	s, _ := serve(t, q, "a")
	h := s.heads(t, "a", 1)[0]
	for n := 1; n <= 2; n++ {
		h.Attempts = n
		if err := h.lane.Retry(ctx, h.Head); err != nil {
			t.Fatal(err)
		}
		if h = s.heads(t, "a", 1)[0]; h.Attempts != n || h.Key != e1.Key {
			t.Fatalf("after Retry %d: head %+v with %d attempts", n, h.Key, h.Attempts)
		}
	}
	h.Attempts = 3
	if err := h.lane.Bury(ctx, h.Head, "status 500"); err != nil {
		t.Fatal(err)
	}
	wantHead(t, s.heads(t, "a", 1)[0], e2)
	waitStats(t, q, "a", 1, 1)
	dead, err := q.Dead(ctx, "a")
	if err != nil || len(dead) != 1 {
		t.Fatalf("Dead = %+v, %v; want one", dead, err)
	}
	if d := dead[0]; d.Attempts != 3 || d.Error != "status 500" || string(d.Event) != string(e1.Body) || d.At == 0 {
		t.Fatalf("dead letter %+v, want 3 attempts, the cause and the event", d)
	}
	if other, err := q.Dead(ctx, "b"); err != nil || len(other) != 0 {
		t.Fatalf("Dead(b) = %+v, %v; want none", other, err)
	}
}

// Heads per lane: from, wrap-around, limit and skip.
func testHeadsFromLimitSkip(t *testing.T, open Open) {
	q, _ := instance(t, open(t))
	for c := uint64(1); c <= 12; c++ {
		put(t, q, ev("a", c*1_000_003, 1, 0))
	}
	s, _ := serve(t, q, "a")
	all := s.heads(t, "a", 12)
	byLane := map[hooks.Lane][]uint64{}
	for _, h := range all {
		byLane[h.lane] = append(byLane[h.lane], h.Conv)
	}
	convs := func(hs []hooks.Head) []uint64 {
		var out []uint64
		for _, h := range hs {
			out = append(out, h.Conv)
		}
		return out
	}
	for l, cs := range byLane {
		got, err := l.Heads(ctx, 0, 1, none)
		if err != nil || !slices.Equal(convs(got), cs[:1]) {
			t.Fatalf("Heads(from 0, limit 1) = %v, %v; want %v", convs(got), err, cs[:1])
		}
		got, _ = l.Heads(ctx, 0, len(cs), func(c uint64) bool { return c == cs[0] })
		if !slices.Equal(convs(got), cs[1:]) {
			t.Fatalf("Heads(skip %d) = %v, want %v", cs[0], convs(got), cs[1:])
		}
		if len(cs) < 2 {
			continue
		}
		got, _ = l.Heads(ctx, cs[1], len(cs), none)
		if want := append(slices.Clone(cs[1:]), cs[0]); !slices.Equal(convs(got), want) {
			t.Fatalf("Heads(from %d) = %v, want %v (wrapping around)", cs[1], convs(got), want)
		}
		got, _ = l.Heads(ctx, cs[len(cs)-1]+1, len(cs), none)
		if !slices.Equal(convs(got), cs) {
			t.Fatalf("Heads(from past the last) = %v, want %v", convs(got), cs)
		}
	}
}

// What a process neither delivered nor buried, the next one hands out.
func testReopen(t *testing.T, open Open) {
	proc := open(t)
	q, closeQ := instance(t, proc)
	e1, e2, f1 := ev("a", 5, 1, 0), ev("a", 5, 2, 0), ev("a", 6, 1, 0)
	put(t, q, e1, e2, f1)
	s, stop := serve(t, q, "a")
	hs := s.heads(t, "a", 2)
	if err := hs[1].lane.Done(ctx, hs[1].Head); err != nil {
		t.Fatal(err)
	}
	hs[0].Attempts = 1
	if err := hs[0].lane.Retry(ctx, hs[0].Head); err != nil {
		t.Fatal(err)
	}
	stop()
	closeQ()

	q2, _ := instance(t, proc)
	waitStats(t, q2, "a", 2, 0)
	s2, _ := serve(t, q2, "a")
	h := s2.heads(t, "a", 1)[0]
	wantHead(t, h, e1)
	if err := h.lane.Done(ctx, h.Head); err != nil {
		t.Fatal(err)
	}
	wantHead(t, s2.heads(t, "a", 1)[0], e2)
}

// A lane hears of events put for its endpoint.
func testChanged(t *testing.T, open Open) {
	q, _ := instance(t, open(t))
	s, _ := serve(t, q, "a")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s.mu.Lock()
		n := len(s.lanes["a"])
		s.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no lane served within 10s")
		}
	}
	s.mu.Lock()
	was := s.changed["a"]
	s.mu.Unlock()
	put(t, q, ev("a", 7, 1, 0))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s.mu.Lock()
		n := s.changed["a"]
		s.mu.Unlock()
		if n > was {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("Changed not signalled within 10s of a Put")
		}
	}
}
