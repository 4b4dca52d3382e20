// Package churn drives a chat process through many distinct
// conversations over time, for the churn benchmark of docs/benchmarks.md
// ("Bounded memory"): each conversation is touched once — a direct
// conversation opened, a message sent, its delivery acknowledged and a
// typing notice sent — so every per-conversation structure of the chat
// tier and the store sees a conversation it never sees again. A process
// whose memory is bounded keeps a flat RSS however many go by.
//
// Run calls the chat service in process (chat.Service.Handle), without a
// gateway: the gateway keeps nothing per conversation.
package churn

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parley-im/parley/protocol"
)

// Handler is the chat tier's entry point (chat.Service.Handle).
type Handler interface {
	Handle(ctx context.Context, c protocol.Caller, f *protocol.Frame, reply func(*protocol.Frame))
}

// Config sets up a run.
type Config struct {
	// Conversations is how many distinct conversations to touch.
	Conversations int
	// Workers touch conversations concurrently. Default 32.
	Workers int
	// Prefix starts every user id, so runs on shared engines never meet.
	Prefix string
	// SampleEvery calls Sample after every so many conversations (from
	// the worker that finished the last of them; calls never overlap).
	SampleEvery int
	Sample      func(done int)
	// Retry bounds the time a conversation's request is retried for after
	// a retryable answer (overloaded while a cluster partition moves between
	// owners; store_unavailable or timeout when the engines fall behind),
	// as a client retries: the same frame, so a send keeps its
	// client_msg_id and is stored once. Default 10 s.
	Retry time.Duration

	retries *atomic.Int64
	steps   *[4]atomic.Int64 // ns spent in each step (Result.Steps)
}

// The steps of a conversation, in Result.Steps.
const (
	StepOpen = iota
	StepSend
	StepDelivered
	StepTyping
)

// Result is what a run did.
type Result struct {
	Conversations int
	Elapsed       time.Duration
	// Retries counts the requests answered with a retryable error and
	// repeated.
	Retries int64
	// Steps is the time spent in each step (StepOpen...), summed over the
	// conversations, retries included.
	Steps [4]time.Duration
}

// Run touches cfg.Conversations distinct conversations through h.
func Run(ctx context.Context, h Handler, cfg Config) (Result, error) {
	if cfg.Workers <= 0 {
		cfg.Workers = 32
	}
	if cfg.Retry <= 0 {
		cfg.Retry = 10 * time.Second
	}
	if cfg.retries == nil {
		cfg.retries = new(atomic.Int64)
	}
	if cfg.steps == nil {
		cfg.steps = new([4]atomic.Int64)
	}
	start := time.Now()
	var (
		next, done atomic.Int64
		sampleMu   sync.Mutex
		errMu      sync.Mutex
		firstErr   error
		wg         sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range cfg.Workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= cfg.Conversations || ctx.Err() != nil {
					return
				}
				if err := touch(ctx, h, cfg, i); err != nil {
					errMu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("conversation %d: %w", i, err)
					}
					errMu.Unlock()
					cancel()
					return
				}
				if d := int(done.Add(1)); cfg.Sample != nil && cfg.SampleEvery > 0 && d%cfg.SampleEvery == 0 {
					sampleMu.Lock()
					cfg.Sample(d)
					sampleMu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	res := Result{Conversations: int(done.Load()), Elapsed: time.Since(start), Retries: cfg.retries.Load()}
	for i := range res.Steps {
		res.Steps[i] = time.Duration(cfg.steps[i].Load())
	}
	return res, firstErr
}

// touch opens conversation i, sends a message, acknowledges its delivery
// and sends a typing notice.
func touch(ctx context.Context, h Handler, cfg Config, i int) error {
	a := protocol.Caller{User: fmt.Sprintf("%sa%d", cfg.Prefix, i), Device: "d"}
	b := protocol.Caller{User: fmt.Sprintf("%sb%d", cfg.Prefix, i), Device: "d"}
	t0 := time.Now()
	step := func(i int) {
		if cfg.steps != nil {
			now := time.Now()
			cfg.steps[i].Add(int64(now.Sub(t0)))
			t0 = now
		}
	}
	conv, err := call(ctx, h, cfg, a, &protocol.Frame{Type: protocol.TypeOpenDirect, RID: "1", Peer: b.User})
	if err != nil {
		return fmt.Errorf("open_direct: %w", err)
	}
	step(StepOpen)
	if conv.Conv == nil {
		return fmt.Errorf("open_direct answered %s without a conversation", conv.Type)
	}
	id := conv.Conv.ConvID
	ack, err := call(ctx, h, cfg, a, &protocol.Frame{Type: protocol.TypeSend, RID: "2", ConvID: id,
		ClientMsgID: fmt.Sprint("c", i), Kind: protocol.KindText, Body: "hello"})
	if err != nil {
		return fmt.Errorf("send: %w", err)
	}
	step(StepSend)
	if _, err := call(ctx, h, cfg, b, &protocol.Frame{Type: protocol.TypeDelivered, RID: "3", ConvID: id, Seq: ack.Seq}); err != nil {
		return fmt.Errorf("delivered: %w", err)
	}
	step(StepDelivered)
	if _, err := call(ctx, h, cfg, a, &protocol.Frame{Type: protocol.TypeTyping, ConvID: id}); err != nil {
		return fmt.Errorf("typing: %w", err)
	}
	step(StepTyping)
	return nil
}

// call runs f and returns its answer (nil for a frame that has none),
// retrying while the answer is a retryable error: after retry_after_ms
// when the server gives one, else with a backoff doubling from 10 ms to 1 s.
func call(ctx context.Context, h Handler, cfg Config, c protocol.Caller, f *protocol.Frame) (*protocol.Frame, error) {
	deadline := time.Now().Add(cfg.Retry)
	backoff := 10 * time.Millisecond
	for {
		var resp *protocol.Frame
		h.Handle(ctx, c, f, func(r *protocol.Frame) { resp = r })
		if resp == nil || resp.Type != protocol.TypeError {
			return resp, nil
		}
		if !resp.Code.Retryable() || time.Now().After(deadline) {
			return nil, fmt.Errorf("%s: %s", resp.Code, resp.Error)
		}
		if cfg.retries != nil {
			cfg.retries.Add(1)
		}
		wait := time.Duration(resp.RetryAfter) * time.Millisecond
		if wait <= 0 {
			wait, backoff = backoff, min(2*backoff, time.Second)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(max(wait, 10*time.Millisecond)):
		}
	}
}

// Again touches conversation i of an earlier run once more: its first
// message must read back at seq 1 and a new one must get seq 2, so a
// conversation whose state was evicted came back with its history and
// its seq high-water mark.
func Again(ctx context.Context, h Handler, cfg Config, i int) error {
	if cfg.Retry <= 0 {
		cfg.Retry = 10 * time.Second
	}
	a := protocol.Caller{User: fmt.Sprintf("%sa%d", cfg.Prefix, i), Device: "d"}
	b := fmt.Sprintf("%sb%d", cfg.Prefix, i)
	conv, err := call(ctx, h, cfg, a, &protocol.Frame{Type: protocol.TypeOpenDirect, RID: "1", Peer: b})
	if err != nil || conv.Conv == nil {
		return fmt.Errorf("open_direct: %v (%v)", err, conv)
	}
	id := conv.Conv.ConvID
	hist, err := call(ctx, h, cfg, a, &protocol.Frame{Type: protocol.TypeHistory, RID: "2", ConvID: id, Limit: 10})
	if err != nil {
		return fmt.Errorf("history: %w", err)
	}
	if len(hist.Messages) != 1 || hist.Messages[0].Seq != 1 || hist.Messages[0].Body != "hello" {
		return fmt.Errorf("history = %+v, want the first message at seq 1", hist.Messages)
	}
	ack, err := call(ctx, h, cfg, a, &protocol.Frame{Type: protocol.TypeSend, RID: "3", ConvID: id,
		ClientMsgID: fmt.Sprint("again", i), Kind: protocol.KindText, Body: "again"})
	if err != nil {
		return fmt.Errorf("send: %w", err)
	}
	if ack.Seq != 2 {
		return fmt.Errorf("second message got seq %d, want 2", ack.Seq)
	}
	return nil
}
