package push

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Who is notified, beyond who was offline: a member who muted the
// conversation is not (unless the message mentions them by name), a user
// in do-not-disturb is not, and a device gets at most Config.DeviceRate
// notifications per DeviceInterval. A notification over the device's
// rate is held, not dropped: the device's next one — a later message's,
// or the held one itself once the device has room again — is sent with
// coalesced counting the ones it stands for.

// Reasons a user's notification is not sent.
const (
	quietNone  = ""
	quietMuted = "muted"
	quietDND   = "dnd"
)

// quiet says why user gets no notification of ev now (quietNone: it
// does). Do-not-disturb holds even for a mention; a mute does not.
func (p *Pusher) quiet(ctx context.Context, user string, ev event) (string, error) {
	now := p.now()
	until, err := p.st.ConvMute(ctx, user, ev.Conv)
	if err != nil {
		return quietNone, err
	}
	if until > now.UnixMilli() && !slices.Contains(ev.Mentioned, user) {
		return quietMuted, nil
	}
	d, err := p.st.DND(ctx, user)
	if err != nil {
		return quietNone, err
	}
	if d.On(now) {
		return quietDND, nil
	}
	return quietNone, nil
}

// suppressed counts users' notifications not sent, by reason.
type suppressed struct{ muted, dnd atomic.Int64 }

func (s *suppressed) add(reason string) {
	switch reason {
	case quietMuted:
		s.muted.Add(1)
	case quietDND:
		s.dnd.Add(1)
	}
}

// limiter is the per-device rate limit: a token bucket of rate tokens
// refilled rate per every for each registration (provider and token),
// and the notification held for it while it is empty.
type limiter struct {
	rate  int
	every time.Duration
	wake  chan struct{}
	held  atomic.Int64 // notifications held, since start

	mu struct {
		sync.Mutex
		devs map[string]*device
	}
}

type device struct {
	tokens float64
	at     time.Time // tokens as of at
	hold   *holding  // nil: nothing held
}

// holding is a device's held notification: the latest one over its rate,
// standing for count held in all.
type holding struct {
	user     string
	n        note
	count    int
	due      time.Time
	attempts int
}

func newLimiter(rate int, every time.Duration) *limiter {
	l := &limiter{rate: rate, every: every, wake: make(chan struct{}, 1)}
	l.mu.devs = map[string]*device{}
	return l
}

// refill brings d's tokens to now.
func (l *limiter) refill(d *device, now time.Time) {
	if el := now.Sub(d.at); el > 0 {
		d.tokens = min(float64(l.rate), d.tokens+float64(l.rate)*el.Seconds()/l.every.Seconds())
		d.at = now
	}
}

func (l *limiter) dev(key string, now time.Time) *device {
	d := l.mu.devs[key]
	if d == nil {
		d = &device{tokens: float64(l.rate), at: now}
		l.mu.devs[key] = d
	}
	l.refill(d, now)
	return d
}

// take spends one of key's tokens for a notification now: ok false when
// there is none (hold it), else coalesced is how many held notifications
// the one sent stands for (the held one is dropped: this one replaces it).
func (l *limiter) take(key string, now time.Time) (ok bool, coalesced int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := l.dev(key, now)
	if d.tokens < 1 {
		return false, 0
	}
	d.tokens--
	if d.hold != nil {
		coalesced, d.hold = d.hold.count, nil
	}
	return true, coalesced
}

// hold keeps n as key's held notification, replacing an earlier one (it
// then stands for that one too), due once key has a token again.
func (l *limiter) hold(key, user string, n note, now time.Time) {
	l.held.Add(1)
	l.mu.Lock()
	d := l.dev(key, now)
	count := 1
	if d.hold != nil {
		count += d.hold.count
	}
	wait := time.Duration((1 - d.tokens) * float64(l.every) / float64(l.rate))
	d.hold = &holding{user: user, n: n, count: count, due: now.Add(wait)}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// due takes the held notifications due at now (spending their tokens)
// and returns when the next one is; it forgets the devices with a full
// bucket and nothing held.
func (l *limiter) due(now time.Time) (out []*holding, next time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for key, d := range l.mu.devs {
		l.refill(d, now)
		h := d.hold
		switch {
		case h == nil:
			if d.tokens >= float64(l.rate) {
				delete(l.mu.devs, key)
			}
		case !h.due.After(now) && d.tokens >= 1:
			d.tokens--
			d.hold = nil
			out = append(out, h)
		default:
			at := h.due
			if room := now.Add(time.Duration((1 - d.tokens) * float64(l.every) / float64(l.rate))); room.After(at) {
				at = room
			}
			if next.IsZero() || at.Before(next) {
				next = at
			}
		}
	}
	return out, next
}

// rehold puts back a held notification whose send is to be retried at
// due, unless a newer one took its place.
func (l *limiter) rehold(key string, h *holding, due time.Time) {
	l.mu.Lock()
	d := l.dev(key, due)
	if d.hold == nil {
		h.due = due
		d.hold = h
	} else {
		d.hold.count += h.count
	}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// runHeld sends the held notifications as their devices have room again,
// until ctx ends. Each is checked again first: nothing is sent for a
// conversation the user has read past it, muted, or while in
// do-not-disturb.
func (p *Pusher) runHeld(ctx context.Context) {
	l := p.limit
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	// Held sends are bounded on their own: the lanes' slots are the
	// dispatcher's.
	sem := make(chan struct{}, p.cfg.Concurrency)
	for {
		hs, next := l.due(p.now())
		for _, h := range hs {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Go(func() {
				defer func() { <-sem }()
				p.sendHeld(ctx, h)
			})
		}
		wait := l.every
		if !next.IsZero() {
			wait = max(time.Millisecond, min(wait, next.Sub(p.now())))
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-l.wake:
		case <-timer.C:
		}
	}
}

func (p *Pusher) sendHeld(ctx context.Context, h *holding) {
	n, key := h.n, h.n.reg.Provider+" "+h.n.reg.Token
	ev := event{Conv: n.conv, Seq: n.seq}
	if reason, err := p.quiet(ctx, h.user, ev); err != nil || reason != quietNone {
		if err != nil {
			p.log.Warn("push: a held notification's preferences could not be read; dropped", "user", h.user, "err", err)
		}
		return
	}
	if read, err := p.st.Read(ctx, h.user, "", n.conv); err == nil && read >= n.seq {
		return // read since: nothing to show
	}
	count, badge, err := p.unread(ctx, h.user, ev)
	if err == nil {
		n.count, n.badge = count, badge
	}
	n.coalesced = h.count - 1
	prov := p.provs[n.reg.Provider]
	if prov == nil {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	res := prov.send(rctx, n)
	cancel()
	if ctx.Err() != nil {
		return
	}
	c := p.stats[n.reg.Provider]
	switch res.outcome {
	case sent:
		c.sent.Add(1)
	case gone:
		c.removed.Add(1)
		if err := p.st.PushDrop(ctx, n.reg.Provider, n.reg.Token, n.reg.UpdatedAt); err != nil {
			p.log.Warn("push: removing an unregistered token failed", "provider", n.reg.Provider, "err", err)
		}
	case failed:
		c.failed.Add(1)
		p.log.Warn("push: held notification refused; not retried", "provider", n.reg.Provider, "user", h.user, "err", res.err)
	case retry:
		c.failed.Add(1)
		if h.attempts++; h.attempts >= p.cfg.MaxAttempts {
			p.log.Error("push: held notification failed for the last time; dropped", "provider", n.reg.Provider, "user", h.user, "err", res.err)
			return
		}
		back := max(min(p.cfg.MinBackoff<<min(h.attempts-1, 30), p.cfg.MaxBackoff), res.after)
		p.limit.rehold(key, h, p.now().Add(back))
	}
}

// Suppressed counts users' notifications not sent because the user muted
// the conversation, or was in do-not-disturb.
func (p *Pusher) Suppressed() (muted, dnd int64) { return p.quieted.muted.Load(), p.quieted.dnd.Load() }

// RateLimited counts notifications a device's rate limit held (each sent
// later, standing for the held ones, or replaced by a later one that was).
func (p *Pusher) RateLimited() int64 { return p.limit.held.Load() }
