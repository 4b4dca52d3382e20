// Package chat is the stateless chat service: it validates a request,
// allocates seq and persists through the store (M7, M10), acknowledges the
// sender only after the durable write, and routes pushes through the session
// registry and the bus to the gateways that hold the recipients (M4, M6).
// It keeps no per-user state between requests, so any number of chat
// processes can serve the same users.
//
// Service methods are safe for concurrent use.
package chat

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/parley-im/parley/internal/bus"
	"github.com/parley-im/parley/internal/registry"
	"github.com/parley-im/parley/internal/snowflake"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// Read position scopes (M24).
const (
	ReadPerUser   = "user"
	ReadPerDevice = "device"
)

// Config tunes the service. Zero fields take the defaults of DefaultConfig.
type Config struct {
	Limits             protocol.Limits
	SnapshotRangeLimit int           // gap ≤ this: the whole range
	SnapshotLatest     int           // gap > range limit: only this many latest
	HistoryDefault     int           // history limit when the request gives none
	RecallWindow       time.Duration // edit and recall allowed this long after sending
	ReadScope          string        // ReadPerUser or ReadPerDevice
}

// DefaultConfig holds the seed's numbers: ranges up to 200, else the latest 50.
func DefaultConfig() Config {
	return Config{
		Limits:             protocol.DefaultLimits,
		SnapshotRangeLimit: 200,
		SnapshotLatest:     50,
		HistoryDefault:     50,
		RecallWindow:       24 * time.Hour,
		ReadScope:          ReadPerUser,
	}
}

// Validate reports a configuration the service cannot run with.
func (c Config) Validate() error {
	switch {
	case c.SnapshotRangeLimit <= 0:
		return errors.New("chat: snapshot range limit must be positive")
	case c.SnapshotLatest <= 0 || c.SnapshotLatest > c.SnapshotRangeLimit:
		return errors.New("chat: snapshot latest must be in 1..snapshot range limit")
	case c.HistoryDefault <= 0 || c.HistoryDefault > c.Limits.MaxHistory:
		return errors.New("chat: history default must be in 1..max history")
	case c.RecallWindow <= 0:
		return errors.New("chat: recall window must be positive")
	case c.ReadScope != ReadPerUser && c.ReadScope != ReadPerDevice:
		return fmt.Errorf("chat: read scope %q is not %q or %q", c.ReadScope, ReadPerUser, ReadPerDevice)
	}
	return nil
}

// Observer receives the service's measurements; nil fields are skipped.
type Observer struct {
	Stored      func(d time.Duration) // request received → durable
	StoreFailed func(op string)
	Pushed      func(n int)
	PushFailed  func()
	Snapshot    func(convs int)
}

// Service is the chat logic.
type Service struct {
	cfg   Config
	store store.Store
	reg   registry.Registry
	bus   bus.Bus
	ids   *snowflake.Generator
	now   func() time.Time
	log   *slog.Logger
	obs   Observer
}

// Deps are the engines the service runs on.
type Deps struct {
	Store    store.Store
	Registry registry.Registry
	Bus      bus.Bus
	IDs      *snowflake.Generator
	Now      func() time.Time
	Logger   *slog.Logger
	Observer Observer
}

// New returns a service. It starts no goroutines.
func New(cfg Config, d Deps) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d.Store == nil || d.Registry == nil || d.Bus == nil || d.IDs == nil {
		return nil, errors.New("chat: store, registry, bus and ids are required")
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{cfg: cfg, store: d.Store, reg: d.Registry, bus: d.Bus, ids: d.IDs, now: d.Now, log: d.Logger, obs: d.Observer}, nil
}

// storeErr turns a store failure into the client-facing error. Conditions
// the client can act on keep their meaning; anything else means the engine
// failed and nothing was done.
func (s *Service) storeErr(op string, err error) *protocol.Error {
	var pe *protocol.Error
	switch {
	case errors.As(err, &pe):
		return pe
	case errors.Is(err, store.ErrNotMember):
		return protocol.Errorf(protocol.CodeNotMember, "not a member of this conversation")
	case errors.Is(err, store.ErrNotFound):
		return protocol.Errorf(protocol.CodeNotFound, "not found")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return protocol.Errorf(protocol.CodeStoreUnavailable, "%s: timed out", op)
	}
	if s.obs.StoreFailed != nil {
		s.obs.StoreFailed(op)
	}
	s.log.Error("store failed", "op", op, "err", err)
	return protocol.Errorf(protocol.CodeStoreUnavailable, "%s failed; nothing was stored, retry", op)
}
