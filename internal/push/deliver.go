package push

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/parley-im/parley/internal/hooks"
)

// Run sends until ctx ends: one loop per lane the queue hands out.
func (p *Pusher) Run(ctx context.Context) {
	p.q.Serve(ctx, []string{Endpoint}, func(ctx context.Context, _ string, l hooks.Lane) { p.serveLane(ctx, l) })
}

type lane struct {
	hooks.Lane
	wake chan struct{}

	mu    sync.Mutex
	convs map[uint64]*convState
	next  uint64
	// answered are the registrations an event in progress has had an
	// answer for, so its retry does not send to them again.
	answered map[hooks.Key]map[string]bool
}

type convState struct {
	busy  bool
	until time.Time
}

func (l *lane) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

const scanLimit = 1024

// serveLane hands out l's due heads, one attempt at a time per
// conversation and Config.Concurrency in all, until ctx ends or the lane
// is lost.
func (p *Pusher) serveLane(ctx context.Context, q hooks.Lane) {
	l := &lane{Lane: q, wake: make(chan struct{}, 1), convs: map[uint64]*convState{}, answered: map[hooks.Key]map[string]bool{}}
	var wg sync.WaitGroup
	defer wg.Wait()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for l.Err() == nil {
		now := time.Now()
		wait := time.Second
		// Scan once a quarter of the slots is free, not for each: a scan
		// walks the queue, and under load one per freed slot costs more
		// than the sends.
		if free := cap(p.sem) - len(p.sem); free > 0 && free >= cap(p.sem)/4 {
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
				p.log.Error("push: reading the queue failed", "err", err)
			}
			for _, hd := range heads {
				l.mu.Lock()
				if due := hd.Queued.Add(p.cfg.Burst); due.After(now) {
					l.convs[hd.Conv] = &convState{until: due}
					l.next = hd.Conv + 1
					l.mu.Unlock()
					time.AfterFunc(due.Sub(now), l.poke)
					continue
				}
				select {
				case p.sem <- struct{}{}:
				default:
					l.mu.Unlock()
					goto waitLoop
				}
				l.convs[hd.Conv] = &convState{busy: true}
				l.next = hd.Conv + 1
				l.mu.Unlock()
				wg.Go(func() {
					defer func() { <-p.sem; l.poke() }()
					p.deliver(ctx, l, hd)
				})
			}
		}
	waitLoop:
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

// deliver makes one attempt at hd: a notification to every registration
// of its users not answered yet.
func (p *Pusher) deliver(ctx context.Context, l *lane, hd hooks.Head) {
	until := p.attempt(ctx, l, hd)
	l.mu.Lock()
	if until.IsZero() || ctx.Err() != nil {
		delete(l.convs, hd.Conv)
	} else {
		l.convs[hd.Conv] = &convState{until: until}
		time.AfterFunc(time.Until(until), l.poke)
	}
	l.mu.Unlock()
	l.poke()
}

// attempt returns when the conversation may go on (zero: now).
func (p *Pusher) attempt(ctx context.Context, l *lane, hd hooks.Head) time.Time {
	var ev event
	if err := json.Unmarshal(hd.Body, &ev); err != nil {
		if qerr := l.Bury(ctx, hd, "push: unreadable event: "+err.Error()); qerr != nil {
			return time.Now().Add(p.cfg.MaxBackoff)
		}
		return time.Time{}
	}
	if hd.More {
		// A later message of the conversation is queued: it stands for
		// this one, unless the conversation has been collapsing for
		// CollapseMax already.
		p.mu.Lock()
		start, ok := p.since[ev.Conv]
		if !ok {
			start = time.Now()
			p.since[ev.Conv] = start
		}
		p.mu.Unlock()
		if time.Since(start) < p.cfg.CollapseMax {
			if err := l.Done(ctx, hd); err != nil {
				p.log.Error("push: clearing a collapsed event failed", "err", err)
			}
			p.collapsed.Add(1)
			return time.Time{}
		}
	}
	hd.Attempts++
	l.mu.Lock()
	answered := l.answered[hd.Key]
	if answered == nil {
		answered = map[string]bool{}
		l.answered[hd.Key] = answered
	}
	l.mu.Unlock()
	var pending bool
	var after time.Duration
	var lastErr error
	for _, user := range ev.Users {
		regs, err := p.st.PushRegs(ctx, user)
		if err != nil {
			pending, lastErr = true, err
			continue
		}
		var counted bool
		var count, badge int
		for _, r := range regs {
			key := r.Provider + " " + r.Token
			prov := p.provs[r.Provider]
			if prov == nil || answered[key] {
				continue
			}
			if !counted {
				if count, badge, err = p.unread(ctx, user, ev); err != nil {
					pending, lastErr = true, err
					break
				}
				counted = true
			}
			n := note{reg: r, conv: ev.Conv, seq: ev.Seq, msgID: ev.MsgID, e2e: ev.E2E, group: ev.Group, sender: ev.Sender, text: ev.Text, count: count, badge: badge}
			if p.Lag != nil && ev.At > 0 {
				p.Lag(time.Since(time.UnixMilli(ev.At)))
			}
			rctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
			res := prov.send(rctx, n)
			cancel()
			if ctx.Err() != nil {
				return time.Time{} // stopping: the event stays queued, this attempt not counted
			}
			c := p.stats[r.Provider]
			switch res.outcome {
			case sent:
				c.sent.Add(1)
				answered[key] = true
			case gone:
				c.removed.Add(1)
				answered[key] = true
				if err := p.st.PushDrop(ctx, r.Provider, r.Token, r.UpdatedAt); err != nil {
					p.log.Warn("push: removing an unregistered token failed", "provider", r.Provider, "err", err)
				}
			case failed:
				c.failed.Add(1)
				answered[key] = true
				p.log.Warn("push: notification refused; not retried", "provider", r.Provider, "user", user, "err", res.err)
			case retry:
				c.failed.Add(1)
				pending, lastErr = true, res.err
				after = max(after, res.after)
			}
		}
	}
	if !pending {
		l.mu.Lock()
		delete(l.answered, hd.Key)
		l.mu.Unlock()
		p.mu.Lock()
		delete(p.since, ev.Conv)
		p.mu.Unlock()
		if err := l.Done(ctx, hd); err != nil {
			p.log.Error("push: clearing a sent event failed; it will be sent again", "err", err)
		}
		return time.Time{}
	}
	if lastErr == nil {
		lastErr = errors.New("push: attempt failed")
	}
	if hd.Attempts >= p.cfg.MaxAttempts {
		p.log.Error("push: notification failed for the last time; moved to the dead letters", "conv", ev.Conv, "seq", ev.Seq, "attempts", hd.Attempts, "err", lastErr)
		l.mu.Lock()
		delete(l.answered, hd.Key)
		l.mu.Unlock()
		if err := l.Bury(ctx, hd, lastErr.Error()); err != nil {
			return time.Now().Add(p.cfg.MaxBackoff)
		}
		return time.Time{}
	}
	back := max(min(p.cfg.MinBackoff<<min(hd.Attempts-1, 30), p.cfg.MaxBackoff), after)
	p.log.Warn("push: attempt failed; retrying", "conv", ev.Conv, "seq", ev.Seq, "attempt", hd.Attempts, "in", back, "err", lastErr)
	if err := l.Retry(ctx, hd); err != nil {
		p.log.Error("push: recording an attempt failed", "err", err)
	}
	return time.Now().Add(back)
}

// unread returns the user's unread messages of ev's conversation (at
// least 1: ev's message) and of every conversation (the badge).
func (p *Pusher) unread(ctx context.Context, user string, ev event) (count, badge int, err error) {
	rows, err := p.st.UserConversations(ctx, user)
	if err != nil {
		return 0, 0, fmt.Errorf("conversations: %w", err)
	}
	found := false
	for _, r := range rows {
		if r.LeaveSeq != 0 {
			continue
		}
		last := r.LastSeq
		if r.ConvID == ev.Conv {
			last, found = max(last, ev.Seq), true
		}
		read, err := p.st.Read(ctx, user, "", r.ConvID)
		if err != nil {
			return 0, 0, fmt.Errorf("read position: %w", err)
		}
		if last > read {
			badge += int(last - read)
			if r.ConvID == ev.Conv {
				count = int(last - read)
			}
		}
	}
	if !found {
		badge++
	}
	return max(count, 1), max(badge, 1), nil
}
