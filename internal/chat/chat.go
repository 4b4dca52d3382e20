// Package chat is the stateless chat service: it validates a request
// (membership, roles, end-to-end checks, limits), allocates seq and
// persists through the store, acknowledges the sender only after the
// durable write, keeps read and delivered positions, and hands every
// stored message to the fan-out (internal/fanout), which owns what
// follows: recipients, pushes, rows, compensation and the consumers of a
// stored message. Its own frames (receipts, typing, notices) go out
// through the fan-out's Push.
// It keeps no per-user state between requests, so any number of chat
// processes can serve the same users.
//
// Service methods are safe for concurrent use. A request's independent
// store reads may overlap on goroutines the request waits for; the
// service starts no other goroutine (RunPositions runs on its caller's).
package chat

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/parley-im/parley/internal/attach"
	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/kt"
	"github.com/parley-im/parley/internal/search"
	"github.com/parley-im/parley/internal/settings"
	"github.com/parley-im/parley/internal/snowflake"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// Read position scopes.
const (
	ReadPerUser   = "user"
	ReadPerDevice = "device"
)

// Config tunes the service. Each field with a yaml tag is a server setting
// under chat. (package settings): its key, help and, from DefaultConfig,
// its default are declared here and nowhere else.
type Config struct {
	Limits protocol.Limits `yaml:"-"` // the protocol limits (cmd/parley: limits.*)

	SnapshotRangeLimit int           `yaml:"snapshot_range_limit" help:"a conversation behind by at most this many messages gets the whole range in a sync"`
	SnapshotLatest     int           `yaml:"snapshot_latest" help:"a conversation further behind gets only this many latest messages in a sync"`
	HistoryDefault     int           `yaml:"history_default" help:"messages in a history answer when the request gives no limit"`
	RecallWindow       time.Duration `yaml:"recall_window" help:"how long after sending a message may be recalled or edited"`
	ReadScope          string        `yaml:"read_scope" help:"read position per user (all devices) or per device: user or device"`
	// Fan-out tiers (fanout.Tiers, given to the fan-out by Tiers): groups
	// with fewer than SmallBelow members get write fan-out to every
	// member's row; up to LargeAbove, rows only for members online;
	// beyond, no rows at all. Hysteresis (a fraction) keeps a group near a
	// threshold from flapping: it moves down a tier only once it is that
	// fraction below the threshold.
	SmallBelow int     `yaml:"small_below" help:"groups with fewer members get write fan-out to every member"`
	LargeAbove int     `yaml:"large_above" help:"groups with more members get no per-member rows (read fan-out)"`
	Hysteresis float64 `yaml:"hysteresis" help:"fraction below a threshold a group must fall to move down a tier"`
	// InlineRows: small groups of at most this many members get their
	// rows written in the message's own atomic write (store.Append.Rows)
	// instead of by the fan-out after it; 0: direct conversations only
	// (which always do).
	InlineRows int `yaml:"inline_rows" help:"groups of at most this many members get their rows written with the message itself (0: direct conversations only)"`
	// EveryoneInterval is the least time between two @everyone of a group.
	EveryoneInterval time.Duration `yaml:"everyone_interval" help:"least time between two @everyone in one group"`
	// TypingInterval is the least time between two typing notices of a
	// user in a conversation; more are dropped.
	TypingInterval time.Duration `yaml:"typing_interval" help:"least time between two typing notices of a user in a conversation"`
	// PositionFlush is how often delivered positions, kept in memory, are
	// written to the store (RunPositions); a crash loses at most this much
	// of them (never a message).
	PositionFlush time.Duration `yaml:"position_flush" help:"how often delivered positions are written to the store (a crash loses at most this much of them)"`
	// One-time prekeys handed out per PrekeyPeriod, in bursts of up to
	// the bound: PrekeysPerRequester to one user (whichever devices they
	// fetch), PrekeysPerDevice from one device (whoever fetches). Past
	// either, keys_bundle answers the device's bundle without one-time
	// keys (signed prekey and last-resort KEM key, limited: true), so a
	// stranger, or many, cannot drain a device's one-time keys.
	PrekeysPerRequester int           `yaml:"prekeys_per_requester" help:"one-time prekeys handed out to one user per prekey_period"`
	PrekeysPerDevice    int           `yaml:"prekeys_per_device" help:"one-time prekeys handed out from one device per prekey_period"`
	PrekeyPeriod        time.Duration `yaml:"prekey_period" help:"the period of prekeys_per_requester and prekeys_per_device"`
	// PushPerDevice bounds a device's push registrations (push_register
	// answers too_many_registrations past it).
	PushPerDevice int `yaml:"push_registrations_per_device" help:"push registrations (APNs, FCM, Web Push tokens) one device may hold"`
	// Read receipts of one message (read_by) read every eligible
	// member's read position: groups of more than ReadByMaxMembers
	// members are refused (too_large), and the readers are named only up
	// to ReadByNames eligible members.
	ReadByMaxMembers int `yaml:"read_by_max_members" help:"read_by answers for conversations of at most this many members (each answer reads one position per member)"`
	ReadByNames      int `yaml:"read_by_names" help:"read_by names the readers when at most this many members can see the message (0: never)"`
	// MaxFanoutLag sheds sends: while the oldest message waiting for
	// fan-out on this process has waited longer than this since its ACK,
	// a send is answered overloaded (nothing stored) with a retry_after_ms
	// of the excess, so delivery stays within about this bound of the ACKs
	// instead of falling further behind. Conversations whose fan-out is
	// retrying after a failure (an engine outage) do not count. 0: never
	// shed.
	MaxFanoutLag time.Duration `yaml:"max_fanout_lag" help:"shed sends with overloaded while this process's fan-out is this far behind its ACKs (0: never)"`
	// Reactions is the set of emoji a react frame may add, separated by
	// spaces; ReactionsPerUser bounds one user's emojis on one message.
	Reactions        string `yaml:"reactions" help:"the emoji a reaction may be, separated by spaces"`
	ReactionsPerUser int    `yaml:"reactions_per_user" help:"reactions one user may add to one message"`
}

// DefaultConfig returns the defaults: a sync sends whole ranges up to 200
// messages, else the latest 50.
func DefaultConfig() Config {
	return Config{
		Limits:             protocol.DefaultLimits,
		SnapshotRangeLimit: 200,
		SnapshotLatest:     50,
		HistoryDefault:     50,
		RecallWindow:       24 * time.Hour,
		ReadScope:          ReadPerUser,
		SmallBelow:         200,
		LargeAbove:         2000,
		Hysteresis:         0.1,
		InlineRows:         16,
		EveryoneInterval:   time.Minute,
		TypingInterval:     2 * time.Second,
		PositionFlush:      5 * time.Second,
		// A device keeps up to 1,000 one-time keys of each kind and
		// uploads more below 10: 20 an hour per device is far more than
		// new sessions need and what its uploads easily replace; 100 an
		// hour per user covers a new member's first message to a large
		// group's devices mostly with one-time keys.
		PrekeysPerRequester: 100,
		PrekeysPerDevice:    20,
		PrekeyPeriod:        time.Hour,
		// An app with one token per provider it builds for, and room to
		// register a rotated token before removing the old one.
		PushPerDevice: 4,
		// The medium tier's ceiling: a large group's answer would read
		// thousands of positions per hover.
		ReadByMaxMembers: 2000,
		ReadByNames:      200,
		// Measured overload (160 pairs on 2 cores) had delivery 0.6 s
		// behind the ACK at the median: 5 s is far past any healthy lag.
		MaxFanoutLag: 5 * time.Second,
		// The reactions every peer offers first.
		Reactions:        DefaultReactions,
		ReactionsPerUser: 3,
	}
}

// Validate reports every setting the service cannot run with, by key (a
// *settings.Error).
func (c Config) Validate() error {
	var p settings.Problems
	p.Check(c.SnapshotRangeLimit > 0, "snapshot_range_limit", "must be positive, got %d", c.SnapshotRangeLimit)
	p.Check(c.SnapshotLatest > 0 && c.SnapshotLatest <= c.SnapshotRangeLimit, "snapshot_latest", "must be in 1..snapshot_range_limit (%d), got %d", c.SnapshotRangeLimit, c.SnapshotLatest)
	p.Check(c.HistoryDefault > 0 && c.HistoryDefault <= c.Limits.MaxHistory, "history_default", "must be in 1..limits.max_history (%d), got %d", c.Limits.MaxHistory, c.HistoryDefault)
	p.Check(c.RecallWindow > 0, "recall_window", "must be positive, got %v", c.RecallWindow)
	p.Check(c.ReadScope == ReadPerUser || c.ReadScope == ReadPerDevice, "read_scope", "%q is not %s or %s", c.ReadScope, ReadPerUser, ReadPerDevice)
	p.Check(c.SmallBelow >= 3 && c.LargeAbove >= c.SmallBelow, "small_below", "need 3 <= small_below <= large_above, got %d and %d", c.SmallBelow, c.LargeAbove)
	p.Check(c.Hysteresis >= 0 && c.Hysteresis < 1, "hysteresis", "must be in [0, 1), got %v", c.Hysteresis)
	p.Check(c.InlineRows >= 0, "inline_rows", "must not be negative, got %d", c.InlineRows)
	p.Check(c.EveryoneInterval >= 0, "everyone_interval", "must not be negative, got %v", c.EveryoneInterval)
	p.Check(c.TypingInterval >= 0, "typing_interval", "must not be negative, got %v", c.TypingInterval)
	p.Check(c.PositionFlush > 0, "position_flush", "must be positive, got %v", c.PositionFlush)
	p.Check(c.PrekeysPerRequester > 0, "prekeys_per_requester", "must be positive, got %d", c.PrekeysPerRequester)
	p.Check(c.PrekeysPerDevice > 0, "prekeys_per_device", "must be positive, got %d", c.PrekeysPerDevice)
	p.Check(c.PrekeyPeriod > 0, "prekey_period", "must be positive, got %v", c.PrekeyPeriod)
	p.Check(c.PushPerDevice >= 1 && c.PushPerDevice <= 64, "push_registrations_per_device", "must be within 1-64, got %d", c.PushPerDevice)
	p.Check(c.ReadByMaxMembers >= 1, "read_by_max_members", "must be positive, got %d", c.ReadByMaxMembers)
	p.Check(c.ReadByNames >= 0 && c.ReadByNames <= c.ReadByMaxMembers, "read_by_names", "must be in 0..read_by_max_members (%d), got %d", c.ReadByMaxMembers, c.ReadByNames)
	p.Check(c.MaxFanoutLag >= 0, "max_fanout_lag", "must not be negative (0: never shed), got %v", c.MaxFanoutLag)
	set := strings.Fields(c.Reactions)
	p.Check(len(set) >= 1 && len(set) <= maxReactionSet, "reactions", "must name 1-%d emoji, got %d", maxReactionSet, len(set))
	for _, e := range set {
		p.Check(len(e) <= protocol.MaxEmojiBytes && utf8.ValidString(e), "reactions", "%q is over %d bytes or not UTF-8", e, protocol.MaxEmojiBytes)
	}
	p.Check(c.ReactionsPerUser >= 1 && c.ReactionsPerUser <= store.MaxReactionsPerUser, "reactions_per_user", "must be within 1-%d, got %d", store.MaxReactionsPerUser, c.ReactionsPerUser)
	return p.Err("chat")
}

// Tiers are the fan-out tiers the configuration sets, for fanout.Deps.
func (c Config) Tiers() fanout.Tiers {
	return fanout.Tiers{SmallBelow: c.SmallBelow, LargeAbove: c.LargeAbove, Hysteresis: c.Hysteresis}
}

// Observer receives the service's measurements; nil fields are skipped
// (the fan-out's are fanout.Observer).
type Observer struct {
	Stored      func(d time.Duration) // request received → durable
	StoreFailed func(op string)
	Snapshot    func(convs int)
	// Shed counts a send answered overloaded because the fan-out was
	// behind by more than MaxFanoutLag.
	Shed func()
}

// Fanout is what the service needs of the fan-out (fanout.Fanout).
type Fanout interface {
	// Enqueue takes a stored message for fan-out after its ACK.
	Enqueue(j fanout.Job)
	// Wait returns once the fan-out of conv up to seq has run (or ctx
	// ends).
	Wait(ctx context.Context, conv, seq uint64)
	// Push sends a frame without a seq to users' devices, best effort.
	Push(ctx context.Context, users []string, f *protocol.Frame) int
	// Tier returns a conversation's tier, keeping the online index in
	// step; TierFor decides a tier without recording it.
	Tier(ctx context.Context, cv store.Conversation) uint8
	TierFor(cur uint8, n int) uint8
	// Joined and Left keep the online index in step with memberships.
	Joined(conv uint64, members []store.Member)
	Left(conv uint64, users []string)
	// LoadLag is how long the oldest message waiting for fan-out here
	// has waited since its ACK, over the conversations not retrying
	// after a failure.
	LoadLag() time.Duration
}

// Service is the chat logic.
type Service struct {
	cfg    Config
	store  store.Store
	ids    *snowflake.Generator
	now    func() time.Time
	log    *slog.Logger
	obs    Observer
	limits Limiter
	fan    Fanout
	pos    *positions      // delivered positions (positions.go)
	kt     *kt.Log         // nil: key transparency off (kt.go)
	attach *attach.Service // nil: attachments off
	// search is the full-text index (nil: search frames answer
	// search_unavailable), searchLimits its query limits.
	search       search.Index
	searchLimits search.Limits
}

// Limiter allows one event per key per interval (@everyone per group,
// typing per user and conversation), and n events per period in bursts of
// up to n (one-time prekeys per requester and per target device). The
// default is in-process; cluster mode shares one in Redis so the limit
// holds across chat processes.
type Limiter interface {
	Allow(ctx context.Context, key string, every time.Duration) (ok bool, retryAfter time.Duration, err error)
	// Take takes one of key's n tokens, refilled at n per period.
	Take(ctx context.Context, key string, n int, per time.Duration) (ok bool, retryAfter time.Duration, err error)
}

// Deps are the engines the service runs on.
type Deps struct {
	Store    store.Store
	IDs      *snowflake.Generator
	Now      func() time.Time
	Logger   *slog.Logger
	Observer Observer
	Limiter  Limiter // nil: in-process
	// Fanout takes every stored message after its ACK and pushes the
	// service's frames.
	Fanout Fanout
	// KT is the key transparency log on the same store (nil: off).
	KT *kt.Log
	// Attach is the attachment service on the same store (nil:
	// attachments off; the attachment frames answer invalid_argument).
	Attach *attach.Service
	// Search is the search index (nil: none) and SearchLimits the limits
	// of a query (zero: search.DefaultLimits).
	Search       search.Index
	SearchLimits search.Limits
}

// New returns a service. It starts no goroutines.
func New(cfg Config, d Deps) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d.Store == nil || d.IDs == nil || d.Fanout == nil {
		return nil, errors.New("chat: store, ids and fan-out are required")
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Limiter == nil {
		d.Limiter = newLimiter(d.Now)
	}
	if d.SearchLimits == (search.Limits{}) {
		d.SearchLimits = search.DefaultLimits
	}
	return &Service{cfg: cfg, store: d.Store, ids: d.IDs, now: d.Now, log: d.Logger,
		obs: d.Observer, limits: d.Limiter, fan: d.Fanout, pos: newPositions(), kt: d.KT, attach: d.Attach,
		search: d.Search, searchLimits: d.SearchLimits}, nil
}

// MovingMsg is the message of the overloaded error that answers a write
// to a conversation this process does not (or no longer) own in cluster
// mode; the gateway retries such a write on the new owner.
const MovingMsg = "the conversation is moving between chat processes; retry"

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
	case errors.Is(err, store.ErrNotOwner):
		// Cluster mode: the conversation is moving to another chat
		// process; nothing was acknowledged.
		return &protocol.Error{Code: protocol.CodeOverloaded, Msg: MovingMsg, RetryAfter: 200}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return protocol.Errorf(protocol.CodeStoreUnavailable, "%s: timed out", op)
	}
	if s.obs.StoreFailed != nil {
		s.obs.StoreFailed(op)
	}
	s.log.Error("store failed", "op", op, "err", err)
	return protocol.Errorf(protocol.CodeStoreUnavailable, "%s failed; nothing was stored, retry", op)
}
