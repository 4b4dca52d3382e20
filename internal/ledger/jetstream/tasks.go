package jetstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	natsio "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	pnats "github.com/parley-im/parley/internal/bus/nats"
)

// queueConfig tunes the task queue.
type queueConfig struct {
	// Stream is the JetStream stream holding pending tasks. Default
	// "PARLEY_TASKS"; failed tasks go to Stream+"_DEAD".
	Stream string
	// Subject prefixes task subjects: a task of kind k is stored under
	// <Subject>.k, a dead one under <DeadSubject>.k. Defaults
	// "parley.tasks" and "parley.dead".
	Subject, DeadSubject string
	// Replicas of both streams: 1 on a single server, 3 on a cluster.
	// Default 1.
	Replicas int
	// MaxAge drops tasks never consumed, dead ones included. Default 7 days.
	MaxAge time.Duration
	// AckWait is how long a handler may run, and how long a task taken by
	// a consumer that crashed waits before it is delivered again. Default 30s.
	AckWait time.Duration
	// MaxDeliver bounds the attempts per task; after the last failure (or
	// a crash in the last attempt) the task moves to the dead stream.
	// Default 8.
	MaxDeliver int
	// A failed task is retried after BackoffBase·2^(attempt-1), at most
	// BackoffMax. Defaults 1s and 1m.
	BackoffBase, BackoffMax time.Duration
	// Prefetch is how many tasks a consumer holds ahead of its handler.
	// Default 8.
	Prefetch int
	// Logger receives failed and dead tasks. Default discards.
	Logger *slog.Logger
}

func (c *queueConfig) withDefaults() queueConfig {
	out := *c
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	if out.Stream == "" {
		out.Stream = "PARLEY_TASKS"
	}
	if out.Subject == "" {
		out.Subject = "parley.tasks"
	}
	if out.DeadSubject == "" {
		out.DeadSubject = "parley.dead"
	}
	if out.Replicas == 0 {
		out.Replicas = 1
	}
	def(&out.MaxAge, 7*24*time.Hour)
	def(&out.AckWait, 30*time.Second)
	def(&out.BackoffBase, time.Second)
	def(&out.BackoffMax, time.Minute)
	if out.MaxDeliver == 0 {
		out.MaxDeliver = 8
	}
	if out.Prefetch == 0 {
		out.Prefetch = 8
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return out
}

// Validate reports a configuration the queue cannot use.
func (c *queueConfig) Validate() error {
	d := c.withDefaults()
	switch {
	case !pnats.ValidName(d.Stream):
		return fmt.Errorf("ledger: jetstream: tasks config: bad stream name %q", d.Stream)
	case d.Subject == d.DeadSubject:
		return errors.New("ledger: jetstream: tasks config: Subject and DeadSubject must differ")
	case d.Replicas < 1 || d.Replicas > 5:
		return fmt.Errorf("ledger: jetstream: tasks config: Replicas %d not in 1..5", d.Replicas)
	case d.MaxAge < 0 || d.AckWait <= 0 || d.BackoffBase <= 0 || d.BackoffMax < d.BackoffBase:
		return errors.New("ledger: jetstream: tasks config: durations must be positive and BackoffMax ≥ BackoffBase")
	case d.MaxDeliver < 1 || d.Prefetch < 1:
		return errors.New("ledger: jetstream: tasks config: MaxDeliver and Prefetch must be positive")
	}
	return nil
}

// taskQueue is a durable at-least-once task queue on JetStream. Each kind is a
// work queue with one durable consumer shared by every process that
// consumes it, so a task goes to one handler at a time. Handlers must be
// idempotent: a task whose ack was lost runs again.
type taskQueue struct {
	js  jetstream.JetStream
	cfg queueConfig
}

// openQueue creates (or updates) the task stream and its dead-letter stream.
// The caller owns nc.
func openQueue(ctx context.Context, nc *natsio.Conn, cfg queueConfig) (*taskQueue, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("ledger: jetstream: tasks: %w", err)
	}
	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:     cfg.Stream,
		Subjects: []string{cfg.Subject + ".>"},
		// A work queue deletes each task once acknowledged.
		Retention: jetstream.WorkQueuePolicy,
		Storage:   jetstream.FileStorage,
		Replicas:  cfg.Replicas,
		MaxAge:    cfg.MaxAge,
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: jetstream: tasks: stream %s: %w", cfg.Stream, err)
	}
	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:     cfg.Stream + "_DEAD",
		Subjects: []string{cfg.DeadSubject + ".>"},
		Storage:  jetstream.FileStorage,
		Replicas: cfg.Replicas,
		MaxAge:   cfg.MaxAge,
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: jetstream: tasks: stream %s_DEAD: %w", cfg.Stream, err)
	}
	return &taskQueue{js: js, cfg: cfg}, nil
}

// enqueue stores a task of kind; it returns nil once the stream has it. It
// fails at once with pnats.ErrDisconnected while the client is reconnecting, so
// the task is not left in the client's buffer. Any other error leaves it
// unknown whether the task was stored: a caller that retries must accept a
// duplicate, which idempotent handlers absorb.
func (t *taskQueue) enqueue(ctx context.Context, kind string, payload []byte) error {
	if !pnats.ValidName(kind) {
		return fmt.Errorf("ledger: jetstream: enqueue: bad kind %q", kind)
	}
	if !t.js.Conn().IsConnected() {
		return fmt.Errorf("ledger: jetstream: enqueue %s: %w", kind, pnats.ErrDisconnected)
	}
	if _, err := t.js.Publish(ctx, t.cfg.Subject+"."+kind, payload); err != nil {
		return fmt.Errorf("ledger: jetstream: enqueue %s: %w", kind, err)
	}
	return nil
}

// publishOnce stores m under JetStream message id id: published again
// with the same id within the stream's duplicate window (two minutes), it
// is stored once.
func (t *taskQueue) publishOnce(ctx context.Context, m *natsio.Msg, id string) error {
	if !t.js.Conn().IsConnected() {
		return pnats.ErrDisconnected
	}
	_, err := t.js.PublishMsg(ctx, m, jetstream.WithMsgID(id))
	return err
}

// errPermanent, wrapped in a handler's error, moves the task to the dead
// stream at once: retrying cannot help (e.g. an undecodable payload).
var errPermanent = errors.New("ledger: jetstream: task failed permanently")

// delivery is one attempt at a task.
type delivery struct {
	Data    []byte
	Attempt int    // 1 for the first; every delivery counts, crashed ones included
	Seq     uint64 // the task's sequence in the stream: its id
}

// consume runs handler on tasks of kind, one at a time, until ctx ends; it
// returns nil then, or an error if it could not start. A nil result acks
// the task; an error retries it after a backoff, up to MaxDeliver attempts,
// then moves it to the dead stream. Each handler call gets AckWait to run.
// Call consume from several goroutines or processes to run handlers in
// parallel. Tasks it holds when ctx ends are handed back at once.
func (t *taskQueue) consume(ctx context.Context, kind string, handler func(ctx context.Context, payload []byte) error) error {
	return t.consumeDeliveries(ctx, kind, func(ctx context.Context, d delivery) error { return handler(ctx, d.Data) })
}

// consumeDeliveries is consume with each attempt's number and the task's
// sequence.
func (t *taskQueue) consumeDeliveries(ctx context.Context, kind string, handler func(ctx context.Context, d delivery) error) error {
	if !pnats.ValidName(kind) {
		return fmt.Errorf("ledger: jetstream: consume: bad kind %q", kind)
	}
	cons, err := t.js.CreateOrUpdateConsumer(ctx, t.cfg.Stream, jetstream.ConsumerConfig{
		Durable:       kind,
		FilterSubject: t.cfg.Subject + "." + kind,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       t.cfg.AckWait,
		// One more than the attempts: a task whose last attempt crashed
		// comes back once, to be moved to the dead stream.
		MaxDeliver:    t.cfg.MaxDeliver + 1,
		MaxAckPending: 1000,
	})
	if err != nil {
		return fmt.Errorf("ledger: jetstream: consume %s: %w", kind, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(t.cfg.Prefetch))
	if err != nil {
		return fmt.Errorf("ledger: jetstream: consume %s: %w", kind, err)
	}
	var held []jetstream.Msg
	for ctx.Err() == nil {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if ctx.Err() != nil {
			if err == nil {
				held = append(held, msg)
			}
			break
		}
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || errors.Is(err, natsio.ErrConnectionClosed) {
				return fmt.Errorf("ledger: jetstream: consume %s: %w", kind, err)
			}
			// Transient (e.g. a server restart); the iterator recovers.
			t.cfg.Logger.Warn("task pull failed", "kind", kind, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		if !t.run(ctx, kind, msg, handler) {
			held = append(held, msg)
		}
	}
	// Hand back what this consumer holds so another need not wait AckWait.
	// The pull must be gone from the server first: a task handed back while
	// it still waits would come straight back here and be stranded.
	it.Drain()
	_ = t.js.Conn().FlushTimeout(time.Second)
	for {
		msg, err := it.Next(jetstream.NextMaxWait(time.Second))
		if err != nil {
			break
		}
		held = append(held, msg)
	}
	for _, m := range held {
		_ = m.Nak()
	}
	return nil
}

// run handles one task. It returns false, leaving the task unanswered, when
// the handler failed because consume is stopping.
func (t *taskQueue) run(ctx context.Context, kind string, msg jetstream.Msg, handler func(context.Context, delivery) error) bool {
	d := delivery{Data: msg.Data(), Attempt: 1}
	if md, err := msg.Metadata(); err == nil {
		d.Attempt, d.Seq = int(md.NumDelivered), md.Sequence.Stream
	}
	if d.Attempt > t.cfg.MaxDeliver {
		// The last attempt's consumer crashed: no more attempts.
		t.bury(ctx, kind, msg, d.Attempt-1, errors.New("last attempt interrupted"))
		return true
	}
	hctx, cancel := context.WithTimeout(ctx, t.cfg.AckWait)
	err := handler(hctx, d)
	cancel()
	switch {
	case err == nil:
		if aerr := msg.Ack(); aerr != nil {
			t.cfg.Logger.Warn("task ack failed; it will run again", "kind", kind, "err", aerr)
		}
	case d.Attempt >= t.cfg.MaxDeliver, errors.Is(err, errPermanent):
		// Even when stopping: handed back, it would only die.
		t.bury(ctx, kind, msg, d.Attempt, err)
	case ctx.Err() != nil:
		return false
	default:
		t.cfg.Logger.Warn("task failed; will retry", "kind", kind, "attempt", d.Attempt, "err", err)
		_ = msg.NakWithDelay(t.backoff(uint64(d.Attempt)))
	}
	return true
}

func (t *taskQueue) backoff(attempt uint64) time.Duration {
	d := t.cfg.BackoffBase
	for i := uint64(1); i < attempt && d < t.cfg.BackoffMax; i++ {
		d *= 2
	}
	return min(d, t.cfg.BackoffMax)
}

// Headers of a dead task.
const (
	headerError    = "Parley-Error"
	headerAttempts = "Parley-Attempts"
	headerSeq      = "Parley-Seq"
)

// bury moves a task out of the queue after its last attempt, keeping it in
// the dead stream for an operator. If that fails the task, unanswered,
// comes back once more after AckWait (MaxDeliver+1) to be buried again;
// after that it stays pending without deliveries until MaxAge.
func (t *taskQueue) bury(ctx context.Context, kind string, msg jetstream.Msg, attempts int, cause error) {
	t.cfg.Logger.Error("task failed for the last time; moving it to the dead stream",
		"kind", kind, "attempts", attempts, "err", cause)
	dead := &natsio.Msg{Subject: t.cfg.DeadSubject + "." + kind, Data: msg.Data(), Header: natsio.Header{}}
	dead.Header.Set(headerError, cause.Error())
	dead.Header.Set(headerAttempts, strconv.Itoa(attempts))
	if md, err := msg.Metadata(); err == nil {
		dead.Header.Set(headerSeq, strconv.FormatUint(md.Sequence.Stream, 10))
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := t.js.PublishMsg(pctx, dead); err != nil {
		t.cfg.Logger.Error("dead-letter publish failed", "kind", kind, "err", err)
		return
	}
	if err := msg.Term(); err != nil {
		t.cfg.Logger.Warn("task term failed", "kind", kind, "err", err)
	}
}

// deadTask is a task in the dead stream.
type deadTask struct {
	Kind     string
	Data     []byte
	Error    string
	Attempts int
	Seq      uint64 // its sequence in the task stream
}

// dead lists at most max dead tasks, oldest first.
func (t *taskQueue) dead(ctx context.Context, max int) ([]deadTask, error) {
	s, err := t.js.Stream(ctx, t.cfg.Stream+"_DEAD")
	if err != nil {
		return nil, fmt.Errorf("ledger: jetstream: dead: %w", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("ledger: jetstream: dead: %w", err)
	}
	var out []deadTask
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && len(out) < max && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // deleted
		}
		if err != nil {
			return nil, fmt.Errorf("ledger: jetstream: dead: %w", err)
		}
		d := deadTask{Kind: strings.TrimPrefix(m.Subject, t.cfg.DeadSubject+"."), Data: m.Data, Error: m.Header.Get(headerError)}
		d.Attempts, _ = strconv.Atoi(m.Header.Get(headerAttempts))
		d.Seq, _ = strconv.ParseUint(m.Header.Get(headerSeq), 10, 64)
		out = append(out, d)
	}
	return out, nil
}

// pending is the number of tasks stored and not yet acknowledged.
func (t *taskQueue) pending(ctx context.Context) (uint64, error) {
	s, err := t.js.Stream(ctx, t.cfg.Stream)
	if err != nil {
		return 0, fmt.Errorf("ledger: jetstream: pending: %w", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("ledger: jetstream: pending: %w", err)
	}
	return info.State.Msgs, nil
}
