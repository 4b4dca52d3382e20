// Package pebble is Parley's embedded store: store.Store on a local
// cockroachdb/pebble LSM, the default backend of a single-process server.
//
// # Key layout
//
// Keys mirror the wide-column schema of the Cassandra adapter
// (internal/store/cassandra), which stores the same rows. Integers are fixed-width big-endian (they sort); user ids
// ([A-Za-z0-9._@-]{1,64}) are terminated by 0x00 unless they are the last
// component. Values are a version byte plus varints and length-prefixed
// strings (codec.go).
//
//	table  key                                  value                                wide-column equivalent
//	M      M | conv | bucket u32 | ^msgid        message (all fields)                 messages, partition (conv, bucket), clustering msg_id DESC
//	S      S | conv | seq                        bucket u32 | msgid u64               seq index of a conversation
//	C      C | conv                              kind, created, last_seq, members,    conversations
//	                                             name, tier
//	B      B | conv | user                       role, join_seq, leave_seq, muted     members, partition conv
//	U      U | user 0 | conv                     kind, join_seq, last_seq,            user_conversations, partition user (write fan-out target)
//	                                             leave_seq, mention_seq
//	K      K | conv | coalesce_key               latest seq with that key             coalesce_latest, partition conv
//	D      D | lo 0 hi (sorted pair)             conv                                 direct_pairs
//	I      I | conv | sender 0 client_msg_id     seq                                  idempotency
//	R      R | user 0 | conv [| device]          read seq                             read_positions
//	V      V | user 0 | conv                     delivered seq                        delivered_positions
//	H      H | conv | target | edit seq          the target as it was before that edit  message versions (a former member reads the body as of its leave_seq)
//	E, P   E2E key directory                     see keydir.go                        e2e_devices, e2e_prekeys
//	L, Y   key transparency log                  see kt.go                            kt_leaves, kt_keys
//	F, G,  attachment records, their listings    see attach.go                        attachments, attachments_by_conv,
//	W, Q   and their owners' usage                                                    attachments_due, attachment_usage
//
// bucket = ServerTime (unix ms) / BucketWidth: a busy conversation spreads
// over many partitions, and ^msgid makes the newest message of a bucket sort
// first. Every seq query walks the S index and point-reads the M rows.
//
// # Durability and seq allocation
//
// Each conversation in use has an in-memory state (convState) whose mutex
// serialises its writers. Append allocates seq = last_seq+1 and applies one
// batch (M, S, C, I, the K row of a coalescible message, and the rewritten
// target of an edit or recall) with ApplyNoSyncWait while holding that
// mutex, so WAL order equals seq order and a crash can only lose a suffix,
// never leave a hole or let a seq be reused. A Pebble batch applies all or
// nothing, so an edit, its event, the rewritten target, the coalesce record
// and the outbox entry are one atomic step (the Cassandra adapter needs an
// order of writes that readers resolve instead; see its package comment).
// The fsync is awaited after the
// mutex is released, so concurrent appends, also to one conversation, share
// fsyncs (group commit). Membership changes (B, U and C rows) are decided
// under the same mutex, so joins and leaves fall between two seqs.
//
// Write fan-out (UpdateRows, rows.go) is apart from Append: it raises U rows
// under the conversation's rows lock only, never lowers them, and shares
// fsyncs the same way. Fan-out failing never touches the stored message.
//
// Pebble makes a batch readable before its WAL fsync completes. Readers
// therefore never look past the conversation's durable watermark (the
// highest seq whose fsync finished), an edit's rewritten target is hidden
// behind its pre-edit image until the edit is durable, and a state message
// is only superseded by a later one of its coalesce key that is durable
// (coalesce.go), so no client can see a message, or lose a state's body, by
// a write a crash could take back.
//
// Read and delivered positions are written without fsync: losing one on a
// crash only re-shows a badge or re-sends a delivered mark, and they are
// written on every read receipt, so syncing them would cost one fsync each.
//
// # Bounded memory
//
// States live in a bounded cache (internal/store/statecache): at most
// Config.ConvStates, and none unused for longer than Config.ConvIdle. Every
// call pins the state it uses; a state is evicted only when nobody pins it
// and it is quiescent — everything applied is durable, no append is in
// flight and no pre-edit or coalesce image is pending — so a state loaded
// again from the C row (seq high-water mark, tier, @everyone) is the state
// that went. Membership caches are refilled from the B and U rows;
// idempotency and coalesce records are on disk. Readers that peek at a
// state without pinning it (Conversation, Member, Members) read only what
// an evicted state keeps as it was when it went.
//
// # Concurrency
//
// Store is safe for concurrent use. Open hands it out behind store.Check,
// which admits each call (context, Close, Broken) and checks its arguments
// before a method here runs: the methods trust theirs, and Close waits for
// the calls in progress. Lock order: the seam's gate (read side, per call)
// → direct-pair stripe → convState.mu → convState.rowsMu → convState.ov.mu
// → Store.idMark.mu (idmark.go); attMu and ktMu are taken alone; the state cache's lock is taken before a
// state's (its eviction TryLocks convState.mu) and held for no I/O;
// position stripes are leaves.
package pebble

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	cpebble "github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/parley-im/parley/internal/pebblelog"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/statecache"
)

// Config configures Open.
type Config struct {
	// Dir is the database directory (on FS).
	Dir string
	// FS is the filesystem; nil means the OS disk. Tests use vfs.NewMem().
	FS vfs.FS
	// BucketWidth is the time span of one message partition. Default 240h.
	BucketWidth time.Duration
	// Logger receives the store's and pebble's logs. Default: discard.
	Logger *slog.Logger
	// CacheSize is pebble's block cache in bytes. Default 64 MiB.
	CacheSize int64
	// ConvStates bounds the conversations whose state stays in memory
	// (the least recently used idle ones go first). Default 65536.
	ConvStates int
	// ConvIdle evicts a conversation's state after this long unused.
	// Default 10 minutes; negative: only ConvStates bounds them.
	ConvIdle time.Duration
}

const (
	defaultBucketWidth = 240 * time.Hour
	defaultCacheSize   = 64 << 20
)

// withDefaults returns c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.BucketWidth == 0 {
		c.BucketWidth = defaultBucketWidth
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.CacheSize == 0 {
		c.CacheSize = defaultCacheSize
	}
	return c
}

// Validate reports a configuration Open would refuse.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Dir == "":
		return errors.New("pebble: config: Dir is required")
	case c.BucketWidth < time.Millisecond:
		return fmt.Errorf("pebble: config: BucketWidth %v is below 1ms", c.BucketWidth)
	case c.CacheSize < 0:
		return fmt.Errorf("pebble: config: CacheSize %d is negative", c.CacheSize)
	case c.ConvStates < 0:
		return fmt.Errorf("pebble: config: ConvStates %d is negative", c.ConvStates)
	}
	return nil
}

// logKeyErr is the log attribute key of an error.
const logKeyErr = "err"

var (
	syncWrite   = cpebble.Sync
	noSyncWrite = cpebble.NoSync
)

const (
	directStripes   = 64
	positionStripes = 256
)

// Store is store.Store on pebble.
type Store struct {
	db       *cpebble.DB
	log      *slog.Logger
	bucketMS int64
	seed     maphash.Seed

	closeOnce sync.Once
	closeErr  error

	// convs holds the states of recently used conversations, at most
	// Config.ConvStates of them (see "Bounded memory"). Two live states for
	// one conversation would allocate the same seq twice, so a state goes
	// only when unpinned and quiescent (statecache, convState.quiescent).
	convs *statecache.Cache[convState, *convState]

	// directLocks serialise Direct per user pair (striped).
	directLocks [directStripes]sync.Mutex
	// posLocks serialise read-modify-write of positions (striped by key).
	posLocks [positionStripes]sync.Mutex
	// keyLocks serialise the writes to one device's E2E keys (keydir.go).
	keyLocks [keyStripes]sync.Mutex
	// ktMu serialises the key transparency log's conditional writes (kt.go).
	ktMu sync.Mutex
	// pushMu serialises the push registrations' changes (push.go).
	pushMu sync.Mutex
	// attMu serialises the attachment records' writes (attach.go).
	attMu sync.Mutex

	// broken is set once a WAL fsync failed; after that no write is
	// acknowledged because its durability can no longer be known.
	broken atomic.Pointer[error]

	// idMark lets an append skip the msg-id uniqueness lookup (idmark.go).
	idMark idMark
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the store in cfg.Dir, behind the seam's
// checks (store.Check).
func Open(ctx context.Context, cfg Config) (store.Store, error) {
	s, err := open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return store.Check("pebble", s), nil
}

// open opens the engine itself: its methods trust their arguments and may
// not be called after Close (Open's store.Check sees to both).
func open(ctx context.Context, cfg Config) (*Store, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("pebble: open: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	cache := cpebble.NewCache(cfg.CacheSize)
	defer cache.Unref() // the DB holds its own reference
	opts := &cpebble.Options{
		FS:                 cfg.FS,
		Cache:              cache,
		Logger:             pebblelog.New(cfg.Logger, "pebble"),
		FormatMajorVersion: cpebble.FormatNewest,
	}
	// Bloom filters on every level: most point lookups an append makes
	// (the idempotency key, a seq's message) are for keys that are not
	// there, and without a filter each probes every sstable that could
	// hold the key.
	for i := range opts.Levels {
		opts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	db, err := cpebble.Open(cfg.Dir, opts)
	if err != nil {
		return nil, fmt.Errorf("pebble: open %s: %w", cfg.Dir, err)
	}
	s := &Store{
		db:       db,
		log:      cfg.Logger,
		bucketMS: cfg.BucketWidth.Milliseconds(),
		seed:     maphash.MakeSeed(),
	}
	s.convs = statecache.New(statecache.Config{Max: cfg.ConvStates, Idle: cfg.ConvIdle}, (*convState).quiescent)
	if err := s.loadIDMark(); err != nil {
		return nil, errors.Join(fmt.Errorf("pebble: open %s: %w", cfg.Dir, err), db.Close())
	}
	return s, nil
}

// Close closes the database; store.Check calls it once the calls in
// progress have returned. Closing twice is a no-op.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		if err := s.db.Close(); err != nil {
			s.closeErr = fmt.Errorf("pebble: close: %w", err)
		}
	})
	return s.closeErr
}

// Broken returns the WAL sync failure after which the store takes no more
// writes (store.Broken), nil while there is none.
func (s *Store) Broken() error {
	if p := s.broken.Load(); p != nil {
		return *p
	}
	return nil
}

// fail records a WAL sync failure; see Store.broken.
func (s *Store) fail(err error) {
	if s.broken.CompareAndSwap(nil, &err) {
		s.log.Error("pebble: WAL sync failed; refusing further writes", logKeyErr, err)
	}
}

// get returns a copy of the value at key, or found=false.
func (s *Store) get(key []byte) (val []byte, found bool, err error) {
	v, closer, err := s.db.Get(key)
	if errors.Is(err, cpebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	val = append([]byte(nil), v...)
	if err := closer.Close(); err != nil {
		return nil, false, err
	}
	return val, true, nil
}

// exists reports whether key is present without copying its value.
func (s *Store) exists(key []byte) (bool, error) {
	_, closer, err := s.db.Get(key)
	if errors.Is(err, cpebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, closer.Close()
}

// scan calls fn for each key/value with the given prefix, in key order. The
// slices are only valid during the call.
func (s *Store) scan(prefix []byte, fn func(k, v []byte) error) error {
	it, err := s.db.NewIter(&cpebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return err
	}
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err == nil {
			err = fn(it.Key(), v)
		}
		if err != nil {
			return errors.Join(err, it.Close())
		}
	}
	return it.Close()
}

// Checkpoint writes a consistent copy of the database to dir, which must
// not exist, while it keeps serving: sstables are hard-linked where the
// file system allows, the WAL is flushed first so every write acknowledged
// before the call is in the copy. The copy opens as a database of its own.
func (s *Store) Checkpoint(dir string) error {
	if err := s.db.Checkpoint(dir, cpebble.WithFlushedWAL()); err != nil {
		return fmt.Errorf("pebble: checkpoint %s: %w", dir, err)
	}
	return nil
}
