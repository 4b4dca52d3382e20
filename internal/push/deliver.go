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

// Run sends until ctx ends: one loop per lane the queue hands out (the
// webhooks' dispatcher, hooks.Dispatcher).
func (p *Pusher) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { p.runHeld(ctx) })
	d := &hooks.Dispatcher{Slots: p.slots, Settle: p.cfg.Burst,
		// Read a lane once a quarter of the slots is free, not for each.
		Batch:   p.cfg.Concurrency / 4,
		OnError: func(err error) { p.log.Error("push: reading the queue failed", "err", err) }}
	p.q.Serve(ctx, []string{Endpoint}, func(ctx context.Context, _ string, q hooks.Lane) {
		l := &lane{Lane: q, answered: map[hooks.Key]map[string]bool{}}
		d.Run(ctx, q, func(ctx context.Context, hd hooks.Head) time.Time { return p.attempt(ctx, l, hd) })
	})
}

// lane is the pusher's state of one lane: the registrations an event in
// progress has had an answer for, so its retry does not send to them
// again.
type lane struct {
	hooks.Lane

	mu       sync.Mutex
	answered map[hooks.Key]map[string]bool
}

// attempt makes one attempt at hd: a notification to every registration
// of its users not answered yet. It returns when the conversation may go
// on (zero: now).
func (p *Pusher) attempt(ctx context.Context, l *lane, hd hooks.Head) time.Time {
	var ev event
	if err := json.Unmarshal(hd.Body, &ev); err != nil {
		if qerr := l.Bury(ctx, hd, "push: unreadable event: "+err.Error()); qerr != nil {
			return time.Now().Add(p.cfg.MaxBackoff)
		}
		return time.Time{}
	}
	if p.late(ev) {
		// Produced after a later message of the conversation was
		// notified: that notification, with the same collapse id and
		// counting this message, stands for it.
		if err := l.Done(ctx, hd); err != nil {
			p.log.Error("push: clearing a late event failed", "err", err)
		}
		p.collapsed.Add(1)
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
		if len(regs) == 0 {
			continue
		}
		if reason, err := p.quiet(ctx, user, ev); err != nil {
			pending, lastErr = true, err
			continue
		} else if reason != quietNone {
			// Counted once per event and user, whatever its retries.
			if k := "quiet " + user; !answered[k] {
				answered[k] = true
				p.quieted.add(reason)
			}
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
			ok, coalesced := p.limit.take(key, p.now())
			if !ok {
				p.limit.hold(key, user, n, p.now())
				answered[key] = true
				continue
			}
			n.coalesced = coalesced
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
		p.notified(ev)
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
