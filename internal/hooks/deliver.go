package hooks

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/parley-im/parley/webhook"
)

func (ep *endpoint) acquire() bool {
	select {
	case ep.sem <- struct{}{}:
		return true
	default:
		return false
	}
}

// release frees a slot and tells the delivery loops.
func (ep *endpoint) release() {
	<-ep.sem
	ep.listenMu.Lock()
	fs := make([]func(), 0, len(ep.listeners))
	for _, f := range ep.listeners {
		fs = append(fs, f)
	}
	ep.listenMu.Unlock()
	for _, f := range fs {
		f()
	}
}

// listen calls f whenever a slot frees, until the returned func is called.
func (ep *endpoint) listen(f func()) func() {
	ep.listenMu.Lock()
	defer ep.listenMu.Unlock()
	ep.listenID++
	id := ep.listenID
	ep.listeners[id] = f
	return func() {
		ep.listenMu.Lock()
		defer ep.listenMu.Unlock()
		delete(ep.listeners, id)
	}
}

// scanLimit bounds the conversations one scan hands out.
const scanLimit = 1024

// Run delivers until ctx ends: one loop per lane the queue hands out.
func (h *Hooks) Run(ctx context.Context) {
	byName := make(map[string]*endpoint, len(h.eps))
	for _, ep := range h.eps {
		byName[ep.Name] = ep
	}
	h.q.Serve(ctx, h.names, func(ctx context.Context, name string, l Lane) {
		if ep := byName[name]; ep != nil {
			h.deliverLane(ctx, ep, l)
		}
	})
}

// lane is a delivery loop's state: the conversations it has an attempt in
// flight for or waiting.
type lane struct {
	Lane
	wake chan struct{}

	mu    sync.Mutex
	convs map[uint64]*convState
	next  uint64 // conversation the next scan starts at
}

type convState struct {
	busy  bool
	until time.Time // no attempt before
}

func (l *lane) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// deliverLane hands out l's due heads, at most one attempt in flight per
// conversation and the endpoint's Concurrency across its lanes, until ctx
// ends or the lane is lost; it returns once its attempts have finished.
func (h *Hooks) deliverLane(ctx context.Context, ep *endpoint, q Lane) {
	l := &lane{Lane: q, wake: make(chan struct{}, 1), convs: map[uint64]*convState{}}
	var wg sync.WaitGroup
	defer wg.Wait()
	unlisten := ep.listen(l.poke)
	defer unlisten()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for l.Err() == nil {
		now := time.Now()
		wait := time.Second
		if free := cap(ep.sem) - len(ep.sem); free > 0 {
			l.mu.Lock()
			from := l.next
			l.mu.Unlock()
			heads, err := l.Heads(ctx, from, min(free, scanLimit), func(conv uint64) bool {
				l.mu.Lock()
				defer l.mu.Unlock()
				st := l.convs[conv]
				if st == nil {
					return false
				}
				if !st.busy && st.until.After(now) {
					wait = min(wait, st.until.Sub(now))
				}
				return st.busy || st.until.After(now)
			})
			if err != nil && ctx.Err() == nil {
				h.log.Error("webhooks: reading the queue failed", "endpoint", ep.Name, "err", err)
			}
			for _, hd := range heads {
				l.mu.Lock()
				if due := hd.Queued.Add(h.settle); due.After(now) {
					l.convs[hd.Conv] = &convState{until: due}
					l.next = hd.Conv + 1
					l.mu.Unlock()
					time.AfterFunc(due.Sub(now), l.poke)
					continue
				}
				if !ep.acquire() {
					l.mu.Unlock()
					break // every slot of the endpoint is taken; a release pokes
				}
				l.convs[hd.Conv] = &convState{busy: true}
				l.next = hd.Conv + 1
				l.mu.Unlock()
				wg.Go(func() {
					defer ep.release()
					h.deliver(ctx, ep, l, hd)
				})
			}
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-l.wake:
		case <-l.Changed():
		case <-timer.C:
		}
	}
}

// deliver makes one attempt at hd and records its outcome.
func (h *Hooks) deliver(ctx context.Context, ep *endpoint, l *lane, hd Head) {
	hd.Attempts++
	err := h.post(ctx, ep, hd)
	if ctx.Err() != nil && err != nil {
		l.mu.Lock()
		delete(l.convs, hd.Conv)
		l.mu.Unlock()
		return // stopping: the event stays queued, its attempt not counted
	}
	var until time.Time
	switch {
	case err == nil:
		if qerr := l.Done(ctx, hd); qerr != nil {
			h.log.Error("webhooks: clearing a delivered event failed; it will be sent again", "endpoint", ep.Name, "err", qerr)
		}
		ep.delivered.Add(1)
	case hd.Attempts >= h.cfg.MaxAttempts:
		ep.failed.Add(1)
		h.log.Error("webhook failed for the last time; moved to the dead letters", "endpoint", ep.Name,
			"conv", hd.Conv, "seq", hd.Seq, "type", webhook.Types[hd.Type], "attempts", hd.Attempts, "err", err)
		if qerr := l.Bury(ctx, hd, err.Error()); qerr != nil {
			h.log.Error("webhooks: dead-lettering failed; retrying", "endpoint", ep.Name, "err", qerr)
			until = time.Now().Add(h.cfg.MaxBackoff)
		}
	default:
		ep.failed.Add(1)
		back := min(h.cfg.MinBackoff<<min(hd.Attempts-1, 30), h.cfg.MaxBackoff)
		until = time.Now().Add(back)
		h.log.Warn("webhook attempt failed; retrying", "endpoint", ep.Name, "conv", hd.Conv, "seq", hd.Seq,
			"type", webhook.Types[hd.Type], "attempt", hd.Attempts, "in", back, "err", err)
		if qerr := l.Retry(ctx, hd); qerr != nil {
			h.log.Error("webhooks: recording an attempt failed", "endpoint", ep.Name, "err", qerr)
		}
	}
	l.mu.Lock()
	if until.IsZero() {
		delete(l.convs, hd.Conv)
	} else {
		l.convs[hd.Conv] = &convState{until: until}
		// Wake when the backoff ends.
		time.AfterFunc(time.Until(until), l.poke)
	}
	l.mu.Unlock()
	l.poke()
}

// post sends one attempt; nil means the receiver answered 2xx.
func (h *Hooks) post(ctx context.Context, ep *endpoint, hd Head) error {
	rctx, cancel := context.WithTimeout(ctx, ep.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, ep.URL, bytes.NewReader(hd.Body))
	if err != nil {
		return err
	}
	now := time.Now()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "parley-webhooks/1")
	req.Header.Set(webhook.HeaderID, webhook.ID(hd.Conv, hd.Seq, webhook.Types[hd.Type]))
	req.Header.Set(webhook.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	req.Header.Set(webhook.HeaderSignature, webhook.Sign(ep.secret, now, hd.Body))
	req.Header.Set(webhook.HeaderAttempt, strconv.Itoa(hd.Attempts))
	resp, err := ep.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}
