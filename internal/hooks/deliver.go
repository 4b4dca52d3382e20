package hooks

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/parley-im/parley/webhook"
)

// Run delivers until ctx ends: one loop per lane the queue hands out.
func (h *Hooks) Run(ctx context.Context) {
	byName := make(map[string]*endpoint, len(h.eps))
	for _, ep := range h.eps {
		byName[ep.Name] = ep
	}
	h.q.Serve(ctx, h.names, func(ctx context.Context, name string, l Lane) {
		ep := byName[name]
		if ep == nil {
			return
		}
		d := &Dispatcher{Slots: ep.slots, Settle: h.settle, OnError: func(err error) {
			h.log.Error("webhooks: reading the queue failed", "endpoint", ep.Name, "err", err)
		}}
		d.Run(ctx, l, func(ctx context.Context, hd Head) time.Time { return h.deliver(ctx, ep, l, hd) })
	})
}

// deliver makes one attempt at hd, records its outcome and returns when
// the conversation may go on (zero: now).
func (h *Hooks) deliver(ctx context.Context, ep *endpoint, l Lane, hd Head) time.Time {
	hd.Attempts++
	err := h.post(ctx, ep, hd)
	if ctx.Err() != nil && err != nil {
		return time.Time{} // stopping: the event stays queued, its attempt not counted
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
	return until
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
