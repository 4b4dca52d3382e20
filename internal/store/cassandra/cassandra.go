// Package cassandra is store.Store on Apache Cassandra or ScyllaDB: the
// backend of a Parley deployment that runs several chat processes.
//
// # Tables (keyspace from Config; created by Migrate)
//
//	messages            ((conv_id, bucket), message_id DESC)  the single copy of each body
//	message_seq         ((conv_id, seq_block), seq)            seq index: seq → (bucket, message_id)
//	coalesce_latest     (conv_id, key)                         latest seq of a coalesce key
//	conversations       (conv_id)                              kind, name, members, tier, last_seq hint
//	members             (conv_id, user_id)                     role, join_seq, leave_seq, muted; static fence (owner's epoch)
//	user_conversations  (user_id, conv_id)                     rows: join/leave, last_seq, mention_seq
//	direct_pairs        ((user_lo, user_hi))                   conv_id of a 1:1 conversation
//	idempotency         ((conv_id, sender, client_msg_id))     message_id, bucket, start_seq
//	read_positions      (user_id, conv_id, device)             seq ("" device: per user)
//	delivered_positions (user_id, conv_id)                     seq
//	schema_migrations   (version)                              applied migrations
//
// bucket = ServerTime / BucketWidth and seq_block = seq / SeqBlock, so no
// partition grows without bound. Every seq query walks message_seq and then
// reads the bodies of one bucket with a single IN query.
//
// # Seq allocation
//
// An append writes its body first (a body no slot points to is invisible),
// then claims its seq with a lightweight transaction
// `INSERT INTO message_seq ... IF NOT EXISTS` at last+1, where last is a
// seq known to be claimed (this process's hint, else the conversation's
// last_seq hint). On conflict it reads the index upward and tries the next
// free slot. A slot is tried only when every lower one is known to be
// claimed, so seqs stay dense with any number of processes, and a claimed
// slot is never rewritten, so no seq is reused after a crash: a process
// with a stale hint (a restarted or partitioned one) is fenced by the
// transaction itself. When a claim's outcome is unknown (timeout), the slot
// is read at SERIAL, which finishes any Paxos round in progress, and the
// read decides. Within one process a per-conversation mutex orders the
// claims, so the transactions of one process never contend.
//
// conversations.last_seq, the last_seq and mention_seq of user rows,
// coalesce_latest.seq and the read and delivered positions are
// max-registers: written USING TIMESTAMP seq, so the highest seq wins
// whatever order the writes arrive in, with no read and no transaction
// (UpdateRows is one such write per current member). Conversation.LastSeq
// is read from the hint and then from the index (the hint may lag a crashed
// appender).
//
// # Owned appends
//
// With Config.Lease (cluster mode), the seq allocation above is replaced:
// the conversation's partition is held by one process under a lease with
// a fencing epoch, and that process allocates seqs in memory and writes
// them with plain statements (owned.go). On first use under an epoch (or
// generation g ≤ 499 within it, after a write of unknown outcome; past
// that the lease moves to a new epoch, Lease.Reepoch) it loads the
// top and writes a range tombstone over the seqs above it in the next
// seq's message_seq partition at timestamp epoch·1000+2g, and writes the
// idempotency records of the last batch below the top again (a writer
// that died between its slots and its records left them without); its
// slots go in one single-partition batch at epoch·1000+2g+1, batched per
// conversation (up to 64, within one message_seq partition); it confirms
// the lease (Lease.Confirm) before acknowledging and only then writes the
// idempotency records (which then carry the seq), outbox entries, read
// positions (Append.ReadBy), hints and rows. The appends of a pipeline
// (store.Turn: one connection's sends) queue in the order of their turns,
// each taking its turn once queued, so the next can join the batch after
// the one being written (TakesTurns).
// A stale owner's late slots are shadowed by the newer owner's fence or
// lose to its later timestamps, an idempotency record counts only if its
// slot holds its message, and a process that sees a newer epoch's top slot
// or fails a confirmation never writes under that epoch again.
// docs/decisions.md "Conversation ownership" has the argument.
//
// # Direct pairs
//
// Without a lease, Direct claims direct_pairs with `INSERT ... IF NOT
// EXISTS` (newDirect, direct). With Config.Lease only the owner of the
// partition of store.DirectKey runs it (ErrNotOwner elsewhere): it writes
// the pair row with a plain write at its epoch's timestamp, rewrites a row
// of an older epoch at its own the first time it answers it, and confirms
// the lease before answering; a pair write of unknown outcome moves the
// pair to its next generation (direct.go has the argument;
// TestStaleOwnerDirectFenced).
//
// # Memberships
//
// Joins, leaves, role and mute changes run under the conversation's mutex
// (so within a process they fall between two seq claims, as in
// store/pebble) and are conditional batches of up to 128 member rows (one
// partition: one Paxos round per batch, the batches one after the other),
// each row conditioned on the membership read (join_seq, leave_seq, or no
// row), so processes cannot interleave them; each user's conversation row
// follows as one single-partition batch. The member count moves by
// compare-and-set. A leave is decided as the top of the index: another
// process may claim a higher seq and fan it out before the leave is
// written, so a former member's row is read with last_seq and mention_seq
// capped at its leave_seq.
//
// With Config.Lease the changes are the owner's and fenced like its
// appends: the owner loads the conversation first (takeConv writes its
// epoch into the members partition's static fence column, as does the
// creation of a conversation in a partition it owns), the batches are also
// conditioned on fence = its epoch, and the lease is confirmed before the
// change is acknowledged. A stale owner's change is refused once a newer
// owner has loaded the conversation (store.ErrNotOwner, nothing written),
// and one that landed before is never acknowledged and is what the newer
// owner reads (TestStaleOwnerMembershipFenced).
//
// # Idempotency
//
// (conv, sender, client_msg_id) is claimed with `INSERT ... IF NOT EXISTS`
// recording the message id and start_seq, a seq below which the message
// cannot be. Exactly one message can own the record. A duplicate (in any
// process) looks for the owner's message in the index from start_seq up and,
// if it is not there yet, claims a slot for it itself: every claimer of one
// message walks the same slots in the same order, so the message lands in
// exactly one slot even when its owner crashed or is still at work. The
// owner wrote the body before the record, so a helper never lacks it.
//
// # Edits and recalls
//
// An edit or recall and its event are all or nothing for readers, by an
// order of writes that readers resolve (the target and the event live in
// different partitions, so no single-partition batch holds both):
//
//  1. Append.Check runs under the conversation's mutex, and the target's
//     new version is written as *pending* in its edit column, with the
//     event's msg id and seq (owned appends) or the seq it starts at
//     (transactional), by `UPDATE ... IF rev = <rev read>`, so two
//     processes cannot both rewrite one version;
//  2. the event's body, then its slot (the commit point);
//  3. the pending version is promoted to the committed one (compare-and-
//     set again); the coalesce key and the last_seq hint follow.
//
// A reader that finds a pending version applies it only if a slot holds
// its event (one slot read, only for such rows), so it sees the event and
// the rewritten target together or neither, whatever step a crash stops
// at. A writer starts a batch only once the previous one's effects are
// written (or, when they failed, after loading the top again), so only
// the last batch below the top can lack them: an owner that loads a
// conversation's top written by another writer (or after such a failure)
// finishes that batch (finishLast, sweep) — promotes its targets, raises
// its coalesce keys and the hint, as it writes its idempotency records. A
// pending version whose event never got a slot is dropped by the next
// edit of the message (an owner's fence keeps that event from ever
// showing; a transactional writer may still be claiming, so an edit over
// a pending version younger than 30 s is refused as a conflict).
// TestEditAllOrNothing injects a crash between each two steps.
// Edits write only the rev and edit columns, which plain writes never
// touch, so Paxos and client timestamps never compete for one cell.
//
// A message's body is written before its slot; a body whose slot never
// counts is invisible. An owner deletes a duplicate's body at once and
// the bodies of a batch whose slot write failed or was not confirmed at
// its next load, after its fence (orphans.go); a crashed process's such
// bodies, and a transactional append's after a failed claim, stay.
// message_edits (what former members read, AsOf) is written after the
// event, best effort.
//
// # Coalesced state messages
//
// coalesce_latest holds the highest seq per (conv, coalesce key), raised
// after the slot; reads blank the body of a keyed message below it, or
// below a later message of its key on the same page. A crash between slot
// and raise leaves a reader of the older state alone seeing it
// unsuperseded until the next owner's load sweeps (transactional appends:
// until the key's next message).
//
// Pebble (store/pebble) needs none of this: an append's message, slot,
// rewritten target, coalesce key and outbox entry go in one atomic batch.
//
// # Consistency and durability
//
// Reads and plain writes use Config.Consistency (QUORUM; LOCAL_QUORUM with
// several data centres), transactions Config.SerialConsistency (SERIAL or
// LOCAL_SERIAL) with their commit at Consistency. Append returns after its
// slot is committed at Consistency; durability on each replica is the
// commit log's: scripts/engines/cassandra.sh runs it in batch mode, which
// acknowledges a write after its fsync, and with Paxos v2, which halves the
// round trips of a transaction. A slot visible to a reader is
// committed, so no reader sees a message that a crash could take back. The
// last_seq hint is written after the slot: a crash in between leaves it
// behind, which costs the next reader one more index probe.
//
// Plain writes use the coordinator's timestamp (not the client's); Paxos
// uses the coordinator's clock too, so on one coordinator plain writes and
// transactions order. The cells both kinds write (members rows) are written
// under the conversation's mutex; across coordinators their order is as good
// as the nodes' clock sync, the usual Cassandra caveat.
//
// # Concurrency
//
// Store is safe for concurrent use, also by several processes on one
// keyspace. Open hands it out behind store.Check, which admits each call
// (context, Close) and checks its arguments before a method here runs: the
// methods trust theirs, and Close waits for the calls in progress. Lock order: the seam's gate (read side, per call)
// → direct-pair stripe → convState.mu; Store.convs.mu and
// Store.pairFails.mu are leaves (the latter calls only Lease.Epoch).
package cassandra

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/statecache"
)

// Config configures Open and Migrate.
type Config struct {
	// Hosts are contact points, "host" or "host:port" (port 9042 if none).
	Hosts []string
	// Keyspace holds Parley's tables. Default "parley".
	Keyspace string
	// Consistency of reads and writes: QUORUM (default), LOCAL_QUORUM, ONE,
	// LOCAL_ONE, ALL or EACH_QUORUM (writes only).
	Consistency string
	// SerialConsistency of lightweight transactions: SERIAL (default) or
	// LOCAL_SERIAL.
	SerialConsistency string
	// ReplicationFactor of the keyspace Migrate creates (SimpleStrategy).
	// Default 1, for development; a keyspace that exists is left alone.
	ReplicationFactor int
	// Timeout of one request. Default 5s.
	Timeout time.Duration
	// ConnectTimeout of one connection attempt. Default 5s.
	ConnectTimeout time.Duration
	// BucketWidth is the time span of one messages partition. Default 240h.
	// It must not change once messages are stored.
	BucketWidth time.Duration
	// SeqBlock is the number of seqs in one message_seq partition. Default
	// 1024. It must not change once messages are stored.
	SeqBlock uint64
	// Logger receives the store's and the driver's logs. Default: discard.
	Logger *slog.Logger
	// Lease, if set, makes appends owned: this process writes only the
	// conversations whose partition it holds, allocates their seqs in
	// memory and writes them with plain statements fenced by the lease's
	// epoch (see "Owned appends"). Every process appending to a keyspace
	// must use the same mode.
	Lease Lease
	// ConvStates bounds the conversations whose state stays in memory
	// (the least recently used idle ones go first). Default 65536.
	ConvStates int
	// ConvIdle evicts a conversation's state after this long unused.
	// Default 10 minutes; negative: only ConvStates bounds them.
	ConvIdle time.Duration
}

const (
	defaultKeyspace    = "parley"
	defaultTimeout     = 5 * time.Second
	defaultBucketWidth = 240 * time.Hour
	defaultSeqBlock    = 1024
)

var keyspaceName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,47}$`)

// withDefaults returns c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.Keyspace == "" {
		c.Keyspace = defaultKeyspace
	}
	if c.Consistency == "" {
		c.Consistency = "QUORUM"
	}
	if c.SerialConsistency == "" {
		c.SerialConsistency = "SERIAL"
	}
	if c.ReplicationFactor == 0 {
		c.ReplicationFactor = 1
	}
	if c.Timeout == 0 {
		c.Timeout = defaultTimeout
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = defaultTimeout
	}
	if c.BucketWidth == 0 {
		c.BucketWidth = defaultBucketWidth
	}
	if c.SeqBlock == 0 {
		c.SeqBlock = defaultSeqBlock
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// consistencies parses the consistency levels of c (with defaults).
func (c Config) consistencies() (rw, serial gocql.Consistency, err error) {
	rw, err = gocql.ParseConsistencyWrapper(c.Consistency)
	if err != nil {
		return 0, 0, fmt.Errorf("cassandra: config: Consistency: %w", err)
	}
	switch rw {
	case gocql.Serial, gocql.LocalSerial, gocql.Any:
		return 0, 0, fmt.Errorf("cassandra: config: Consistency %s cannot serve reads and writes", rw)
	}
	serial, err = gocql.ParseConsistencyWrapper(c.SerialConsistency)
	if err != nil {
		return 0, 0, fmt.Errorf("cassandra: config: SerialConsistency: %w", err)
	}
	if serial != gocql.Serial && serial != gocql.LocalSerial {
		return 0, 0, fmt.Errorf("cassandra: config: SerialConsistency %s is not SERIAL or LOCAL_SERIAL", serial)
	}
	return rw, serial, nil
}

// Validate reports a configuration Open or Migrate would refuse.
func (c Config) Validate() error {
	c = c.withDefaults()
	if _, _, err := c.consistencies(); err != nil {
		return err
	}
	switch {
	case len(c.Hosts) == 0:
		return errors.New("cassandra: config: Hosts is required")
	case !keyspaceName.MatchString(c.Keyspace):
		return fmt.Errorf("cassandra: config: Keyspace %q is not [a-z][a-z0-9_]{0,47}", c.Keyspace)
	case c.ReplicationFactor < 1:
		return fmt.Errorf("cassandra: config: ReplicationFactor %d is below 1", c.ReplicationFactor)
	case c.Timeout < 0 || c.ConnectTimeout < 0:
		return errors.New("cassandra: config: negative timeout")
	case c.BucketWidth < time.Millisecond:
		return fmt.Errorf("cassandra: config: BucketWidth %v is below 1ms", c.BucketWidth)
	case c.ConvStates < 0:
		return fmt.Errorf("cassandra: config: ConvStates %d is negative", c.ConvStates)
	case c.SeqBlock < 2 || c.SeqBlock > 1<<20:
		return fmt.Errorf("cassandra: config: SeqBlock %d is outside [2, 2^20]", c.SeqBlock)
	}
	for _, h := range c.Hosts {
		if strings.TrimSpace(h) == "" {
			return errors.New("cassandra: config: empty host")
		}
	}
	return nil
}

// Log attribute keys.
const (
	logKeyComponent = "component"
	logKeyErr       = "err"
	logKeyConv      = "conv"
	logKeySeq       = "seq"
)

const directStripes = 64

// Store is store.Store on Cassandra.
type Store struct {
	sess     *gocql.Session
	log      *slog.Logger
	cons     gocql.Consistency
	serial   gocql.Consistency
	bucketMS int64
	block    uint64
	lease    Lease // nil: transactional appends
	// commit groups the owned path's plain writes (commit.go).
	commit *committer

	closeOnce sync.Once

	// convs holds the states of recently used conversations, at most
	// Config.ConvStates. The mutex in a state orders this process's seq
	// claims, and an owner's state carries its epoch and top, so a state
	// goes only when unpinned and quiescent (statecache, Store.quiescent);
	// an owner's evicted conversation loads its top again under its
	// current epoch and fences above it before its next write.
	convs *statecache.Cache[convState, *convState]

	// directLocks serialise Direct per user pair (striped) within the
	// process; across processes, direct_pairs' transaction does it, or
	// with Lease the pair's owner alone runs it (direct.go).
	directLocks [directStripes]sync.Mutex
	// pairFails: owned pairs with a write of unknown outcome (direct.go).
	pairFails pairFailures

	// paxos counts the transactions and SERIAL reads made (Transactions).
	paxos atomic.Uint64

	// faultHook: tests only (fault).
	faultHook atomic.Pointer[func(point string) error]

	// ob is the fan-out outbox's state (outbox.go).
	ob outboxState
}

var _ store.Networked = (*Store)(nil)

// newCluster returns the driver configuration for cfg (with defaults).
func newCluster(cfg Config, keyspace string) (*gocql.ClusterConfig, error) {
	rw, serial, err := cfg.consistencies()
	if err != nil {
		return nil, err
	}
	cluster := gocql.NewCluster(cfg.Hosts...)
	cluster.Keyspace = keyspace
	cluster.Consistency = rw
	cluster.SerialConsistency = serial
	cluster.Timeout = cfg.Timeout
	cluster.ConnectTimeout = cfg.ConnectTimeout
	cluster.Logger = driverLogger{cfg.Logger.With(logKeyComponent, "gocql")}
	// Plain writes take the coordinator's clock, as Paxos ballots do, so a
	// chat process whose clock runs ahead cannot shadow a later
	// transaction's write to the same cell.
	cluster.DefaultTimestamp = false
	// Only statements marked idempotent (plain reads and upserts) retry;
	// transactions settle an unknown outcome themselves.
	cluster.RetryPolicy = &gocql.ExponentialBackoffRetryPolicy{NumRetries: 3, Min: 50 * time.Millisecond, Max: time.Second}
	// Every frame is written at once. The driver's default holds each
	// frame up to 200 µs for others to share its write(2); on a busy host
	// the timer and the flusher goroutine wake late, and a round trip
	// measured 1.3–1.6 ms instead of 0.2 ms (tools/cassfloor -coalesce), in
	// every one of an append's round trips in a row.
	cluster.WriteCoalesceWaitTime = 0
	return cluster, nil
}

// Open connects to the keyspace of cfg, which Migrate must have brought to
// the schema this package uses. The store is behind the seam's checks
// (store.Check); it is a store.Networked.
func Open(ctx context.Context, cfg Config) (store.Store, error) {
	s, err := open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return store.Check("cassandra", s), nil
}

// open connects the engine itself: its methods trust their arguments and
// may not be called after Close (Open's store.Check sees to both).
func open(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("cassandra: open: %w", err)
	}
	cluster, err := newCluster(cfg, cfg.Keyspace)
	if err != nil {
		return nil, err
	}
	sess, err := cluster.CreateSession()
	if err != nil {
		return nil, fmt.Errorf("cassandra: open %s: %w", cfg.Keyspace, err)
	}
	v, err := schemaVersion(ctx, sess)
	if err == nil && v != latestVersion {
		err = fmt.Errorf("schema version %d, want %d: run `parley migrate`", v, latestVersion)
	}
	if err != nil {
		sess.Close()
		return nil, fmt.Errorf("cassandra: open %s: %w", cfg.Keyspace, err)
	}
	s := &Store{
		sess:     sess,
		log:      cfg.Logger,
		cons:     cluster.Consistency,
		serial:   cluster.SerialConsistency,
		bucketMS: cfg.BucketWidth.Milliseconds(),
		block:    cfg.SeqBlock,
		lease:    cfg.Lease,
	}
	s.commit = newCommitter(s)
	s.convs = statecache.New(statecache.Config{Max: cfg.ConvStates, Idle: cfg.ConvIdle}, s.quiescent)
	return s, nil
}

// Networked tells the chat service that reads cross the network, so it
// overlaps independent ones.
func (s *Store) Networked() bool { return true }

// Close closes the session; store.Check calls it once the calls in
// progress have returned. Closing twice is a no-op.
func (s *Store) Close() error {
	s.closeOnce.Do(s.sess.Close)
	return nil
}

// q returns an idempotent statement at the store's consistency: plain
// reads and upserts may be retried by the driver.
func (s *Store) q(ctx context.Context, stmt string, args ...any) *gocql.Query {
	return s.sess.Query(stmt, args...).WithContext(ctx).Consistency(s.cons).Idempotent(true)
}

// lwt returns a lightweight transaction. It is not idempotent: its
// callers resolve an unknown outcome themselves by a SERIAL read.
func (s *Store) lwt(ctx context.Context, stmt string, args ...any) *gocql.Query {
	s.paxos.Add(1)
	return s.sess.Query(stmt, args...).WithContext(ctx).Consistency(s.cons).SerialConsistency(s.serial)
}

// serialRead returns a read at SERIAL consistency: it completes any Paxos
// round in progress on the partition, so it tells the outcome of a
// transaction whose answer was lost.
func (s *Store) serialRead(ctx context.Context, stmt string, args ...any) *gocql.Query {
	s.paxos.Add(1)
	return s.sess.Query(stmt, args...).WithContext(ctx).Consistency(s.serial).Idempotent(true)
}

// Transactions returns how many lightweight transactions and SERIAL
// reads (each a Paxos round) this store has made since Open (tests and
// benchmarks).
func (s *Store) Transactions() uint64 { return s.paxos.Load() }

// i64 and u64 map Parley's unsigned ids and seqs onto CQL bigint.
func i64(v uint64) int64 { return int64(v) }
func u64(v int64) uint64 { return uint64(v) }

// driverLogger routes the driver's logs to slog.
type driverLogger struct{ l *slog.Logger }

func (d driverLogger) attrs(fields []gocql.LogField) []any {
	out := make([]any, 0, 2*len(fields))
	for _, f := range fields {
		out = append(out, f.Name, f.Value.Any())
	}
	return out
}

func (d driverLogger) Error(msg string, fields ...gocql.LogField) {
	d.l.Error(msg, d.attrs(fields)...)
}

func (d driverLogger) Warning(msg string, fields ...gocql.LogField) {
	d.l.Warn(msg, d.attrs(fields)...)
}

func (d driverLogger) Info(msg string, fields ...gocql.LogField) {
	d.l.Info(msg, d.attrs(fields)...)
}

func (d driverLogger) Debug(msg string, fields ...gocql.LogField) {
	d.l.Debug(msg, d.attrs(fields)...)
}
