package hooks

import (
	"context"
	"encoding/json"
	"time"
)

// Key orders one endpoint's events of a conversation: they are delivered
// in (Seq, Type) order, Type being the index of the event's type in
// webhook.Types.
type Key struct {
	Conv, Seq uint64
	Type      uint8
}

// Less reports whether k is delivered before o (same conversation).
func (k Key) Less(o Key) bool { return k.Seq < o.Seq || k.Seq == o.Seq && k.Type < o.Type }

// Event is one event queued for one endpoint; Body is the request body.
type Event struct {
	Endpoint string
	Key
	Body []byte
}

// Head is the first pending event of a conversation, as a Lane hands it
// out.
type Head struct {
	Key
	Body []byte
	// Attempts made so far (as the queue counts them: see the engine).
	Attempts int
	// Queued is when the event entered the queue as this process sees it;
	// it is due Options.Settle later.
	Queued time.Time
	// More: another event of the conversation is queued behind this one
	// (as far as the lane knows when it hands the head out).
	More bool
}

// DeadLetter is an event given up after its last attempt. Engines store it
// as this JSON record (docs/webhooks.md).
type DeadLetter struct {
	Attempts int             `json:"attempts"`
	Error    string          `json:"error"`
	At       int64           `json:"at"` // unix ms
	Event    json.RawMessage `json:"event"`
}

// Queue is the durable queue of webhook events, the seam between the
// delivery loop here and its engines: internal/hooks/pebble (embedded, a
// database of its own) and internal/hooks/jetstream (cluster mode, streams
// every chat process shares, each partition delivered by its owner). Both
// pass the conformance suite internal/hooks/hookstest. Its methods are
// safe for concurrent use.
type Queue interface {
	// Put stores evs durably: nil means every one is stored. An event
	// queued already (same endpoint and key, e.g. a repeated fan-out) is
	// stored once.
	Put(ctx context.Context, evs []Event) error
	// Serve calls deliver for every lane of the endpoints' events that
	// this process delivers, each on a goroutine of its own, until ctx
	// ends; it returns once every deliver has. A deliver returns when its
	// ctx ends or its lane's Err is set; the engine then opens the lane
	// again while it is still this process's.
	Serve(ctx context.Context, endpoints []string, deliver func(ctx context.Context, endpoint string, l Lane))
	// Stats returns the endpoint's queued events and dead letters.
	Stats(endpoint string) (backlog, dead int64)
	// Dead lists the endpoint's dead letters, oldest first.
	Dead(ctx context.Context, endpoint string) ([]DeadLetter, error)
	// Close releases the queue, after Serve has returned.
	Close() error
}

// Lane is a share of one endpoint's events that one delivery loop hands
// out: every event of a conversation is in the same lane. A head stays
// the conversation's head until Done or Bury (or until an earlier event of
// the conversation arrives late); the caller makes at most one attempt at
// a time per conversation.
type Lane interface {
	// Heads returns the head of each conversation, starting at
	// conversation from and wrapping around, at most limit, passing over
	// the conversations skip names. A head is current as of the call.
	Heads(ctx context.Context, from uint64, limit int, skip func(conv uint64) bool) ([]Head, error)
	// Done removes a delivered head.
	Done(ctx context.Context, h Head) error
	// Retry records a failed attempt (h.Attempts counts it).
	Retry(ctx context.Context, h Head) error
	// Bury moves h to the dead letters.
	Bury(ctx context.Context, h Head, cause string) error
	// Changed is signalled when events arrive or the lane is lost.
	Changed() <-chan struct{}
	// Err is non-nil once the lane is no longer this process's: its
	// loop stops taking heads (attempts in flight finish) and returns.
	Err() error
}
