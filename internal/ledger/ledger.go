// Package ledger is the compensation ledger of group fan-out: when a
// conversation-row write or a push fails after the message is stored, the
// failure is recorded durably as a task (conversation, seq, member range)
// and retried with backoff until it succeeds or is given up. The stored
// message is never rolled back; a task only re-applies idempotent work.
//
// Ledger is the seam, declared here with its Task and Policy; each engine
// is a package of its own: internal/ledger/pebble for the embedded mode (a
// small database of its own next to the store) and internal/ledger/
// jetstream for cluster mode. Both follow one Policy and pass one
// conformance suite (internal/ledger/ledgertest):
//
//   - Record stores a task durably; it is due at once.
//   - Run hands each due task to the handler, with Attempts set to the
//     attempt's number (1 for the first) and a ctx bounded by
//     Policy.Timeout. Delivery is at least once: handlers must be
//     idempotent.
//   - A failed attempt is retried after Policy.Backoff(attempt). After
//     Policy.MaxAttempts failed attempts the task is dead: out of the
//     backlog, listed by Dead with its last error.
//   - Every started attempt counts, including one cut short by a stop or a
//     crash: the task runs again after a restart (JetStream: after Timeout
//     for a crashed consumer), and dies if that was its last attempt. A
//     task that cannot be decoded dies at once.
//
// Both engines are safe for concurrent use.
package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Task kinds.
const (
	KindRows = "rows" // write fan-out: UpdateRows(conv, seq, users, mention)
	KindPush = "push" // push of a stored message to users on a node
)

// Task is one piece of fan-out work to redo.
type Task struct {
	ID      uint64   `json:"id"`
	Kind    string   `json:"kind"`
	Conv    uint64   `json:"conv"`
	Seq     uint64   `json:"seq"`
	Users   []string `json:"users"`
	Mention bool     `json:"mention,omitempty"`
	Node    string   `json:"node,omitempty"`
	// Attempts is the number of the attempt a handler runs (1 for the
	// first); on a dead task, the attempts made.
	Attempts int   `json:"attempts"`
	NextAt   int64 `json:"next_at"` // unix ms (Pebble)
	// Error is a dead task's last error.
	Error string `json:"error,omitempty"`
}

// Handler redoes a task; an error schedules another attempt.
type Handler func(ctx context.Context, t Task) error

// Ledger records failed fan-out work and retries it (see the package
// comment for the behaviour every engine shares).
type Ledger interface {
	// Record stores t durably; its ID, Attempts, NextAt and Error are
	// the ledger's. A kind other than KindRows and KindPush is refused
	// (ErrKind).
	Record(ctx context.Context, t Task) error
	// Run retries due tasks with h until ctx ends.
	Run(ctx context.Context, h Handler) error
	// Backlog is the number of tasks neither completed nor dead, as
	// last counted (JetStream: polled every 2 s, and shared by every
	// process of the deployment).
	Backlog() int
	// Dead lists at most max dead tasks, oldest first.
	Dead(ctx context.Context, max int) ([]Task, error)
}

// ErrKind: Record was given a task of an unknown kind, which no Run
// would ever handle.
var ErrKind = errors.New("ledger: unknown task kind")

// ValidKind reports whether Run handles tasks of kind.
func ValidKind(kind string) bool { return kind == KindRows || kind == KindPush }

// Kinds are the task kinds, in the order engines list them.
var Kinds = []string{KindRows, KindPush}

// Policy is the retry policy of every engine.
type Policy struct {
	// A task's attempt n fails → the next one after
	// MinBackoff·2^(n-1), at most MaxBackoff. Defaults 100ms and 1m.
	MinBackoff, MaxBackoff time.Duration
	// MaxAttempts bounds the attempts of a task; after the last one
	// fails the task is dead. Default 16 (about 7 minutes of retries
	// with the default backoff).
	MaxAttempts int
	// Timeout bounds one attempt: the handler's ctx ends after it, and
	// JetStream redelivers a crashed consumer's task after it. Default
	// 30s.
	Timeout time.Duration
}

// WithDefaults fills the zero fields.
func (p Policy) WithDefaults() Policy {
	if p.MinBackoff <= 0 {
		p.MinBackoff = 100 * time.Millisecond
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = time.Minute
	}
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = 16
	}
	if p.Timeout <= 0 {
		p.Timeout = 30 * time.Second
	}
	return p
}

// Validate reports a policy no engine can follow.
func (p Policy) Validate() error {
	d := p.WithDefaults()
	if d.MaxBackoff < d.MinBackoff {
		return fmt.Errorf("ledger: policy: MaxBackoff %s below MinBackoff %s", d.MaxBackoff, d.MinBackoff)
	}
	return nil
}

// Backoff is the wait after a task's attempt-th failure (attempt ≥ 1).
func (p Policy) Backoff(attempt int) time.Duration {
	p = p.WithDefaults()
	d := p.MinBackoff
	for i := 1; i < attempt && d < p.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, p.MaxBackoff)
}
