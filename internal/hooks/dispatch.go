package hooks

import (
	"context"
	"sync"
	"time"
)

// scanLimit bounds the heads one read of a lane hands out.
const scanLimit = 1024

// Slots bound the conversations attempted at once across the lanes of one
// endpoint (or of the pusher); a slot freed wakes every lane's loop.
// Safe for concurrent use.
type Slots struct {
	sem chan struct{}

	mu        sync.Mutex
	listeners map[int]func()
	lastID    int
}

// NewSlots returns n slots (at least 1).
func NewSlots(n int) *Slots {
	return &Slots{sem: make(chan struct{}, max(n, 1)), listeners: map[int]func(){}}
}

func (s *Slots) free() int { return cap(s.sem) - len(s.sem) }

func (s *Slots) acquire() bool {
	select {
	case s.sem <- struct{}{}:
		return true
	default:
		return false
	}
}

// release frees a slot and tells the loops.
func (s *Slots) release() {
	<-s.sem
	s.mu.Lock()
	fs := make([]func(), 0, len(s.listeners))
	for _, f := range s.listeners {
		fs = append(fs, f)
	}
	s.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

// listen calls f whenever a slot frees, until the returned func is called.
func (s *Slots) listen(f func()) func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastID++
	id := s.lastID
	s.listeners[id] = f
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.listeners, id)
	}
}

// Dispatcher is the delivery loop over a Queue's lanes that the webhooks
// and the pusher share: it hands out each lane's due heads, at most one
// attempt in flight per conversation and Slots across the lanes, and
// waits out what an attempt asks (a backoff) before the conversation's
// next one. What an attempt is, and what it records in the queue (Done,
// Retry, Bury), is the caller's.
type Dispatcher struct {
	Slots *Slots
	// Settle: a head is due this long after it was queued.
	Settle time.Duration
	// Batch: a loop reads its lane only once this many slots are free
	// (at least 1, at most the slots); reading per freed slot can cost
	// more than the attempts under load.
	Batch int
	// OnError reports a failed read of a lane (nil: ignored).
	OnError func(err error)
}

// Run runs lane l's loop until ctx ends or the lane is lost (Err), and
// returns once its attempts have finished. attempt makes one attempt at
// hd and returns when the conversation may go on (zero: now); one that
// returns after ctx ended leaves the conversation as it is in the queue.
func (d *Dispatcher) Run(ctx context.Context, l Lane, attempt func(ctx context.Context, hd Head) time.Time) {
	lp := &loop{Lane: l, d: d, attempt: attempt, wake: make(chan struct{}, 1), convs: map[uint64]convState{}}
	defer lp.wg.Wait()
	defer d.Slots.listen(lp.poke)()
	batch := max(1, min(d.Batch, cap(d.Slots.sem)))
	timer := time.NewTimer(0)
	defer timer.Stop()
	for l.Err() == nil {
		wait := time.Second
		if free := d.Slots.free(); free >= batch {
			wait = lp.dispatch(ctx, min(free, scanLimit))
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-lp.wake:
		case <-l.Changed():
		case <-timer.C:
		}
	}
}

// loop is one lane's delivery state: the conversations it has an attempt
// in flight for or waiting.
type loop struct {
	Lane
	d       *Dispatcher
	attempt func(context.Context, Head) time.Time
	wake    chan struct{}
	wg      sync.WaitGroup

	// mu guards convs and next; it is never held while calling the
	// lane (whose Heads calls skip, which takes it).
	mu    sync.Mutex
	convs map[uint64]convState
	next  uint64 // conversation the next read starts at
}

type convState struct {
	busy  bool
	until time.Time // no attempt before
}

func (l *loop) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// dispatch reads up to limit heads and starts the due ones while slots
// are free; it returns how long the loop may sleep unless woken.
func (l *loop) dispatch(ctx context.Context, limit int) time.Duration {
	now := time.Now()
	wait := time.Second
	l.mu.Lock()
	from := l.next
	l.mu.Unlock()
	heads, err := l.Heads(ctx, from, limit, func(conv uint64) bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		st, ok := l.convs[conv]
		if !ok {
			return false
		}
		if !st.busy && st.until.After(now) {
			wait = min(wait, st.until.Sub(now))
		}
		return st.busy || st.until.After(now)
	})
	if err != nil && ctx.Err() == nil && l.d.OnError != nil {
		l.d.OnError(err)
	}
	for _, hd := range heads {
		l.mu.Lock()
		if due := hd.Queued.Add(l.d.Settle); due.After(now) {
			l.convs[hd.Conv] = convState{until: due}
			l.next = hd.Conv + 1
			l.mu.Unlock()
			time.AfterFunc(due.Sub(now), l.poke)
			continue
		}
		if !l.d.Slots.acquire() {
			l.mu.Unlock()
			break // every slot is taken; a release pokes
		}
		l.convs[hd.Conv] = convState{busy: true}
		l.next = hd.Conv + 1
		l.mu.Unlock()
		l.wg.Go(func() {
			defer l.d.Slots.release()
			l.run(ctx, hd)
		})
	}
	return wait
}

// run makes one attempt at hd and holds the conversation until it may go
// on.
func (l *loop) run(ctx context.Context, hd Head) {
	until := l.attempt(ctx, hd)
	l.mu.Lock()
	if until.IsZero() || ctx.Err() != nil {
		delete(l.convs, hd.Conv)
	} else {
		l.convs[hd.Conv] = convState{until: until}
		time.AfterFunc(time.Until(until), l.poke)
	}
	l.mu.Unlock()
	l.poke()
}
