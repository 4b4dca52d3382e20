package lease

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	natsio "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// KVStore keeps the leases in a NATS JetStream key-value bucket, which
// JetStream replicates by Raft (Replicas 3 on a NATS cluster): a write is
// acknowledged once a majority of the bucket's replicas has it, so losing
// one node loses no lease and no epoch, and a partitioned minority cannot
// grant one.
//
// Keys: part.<p> holds "<node>/<epoch>" ("/<epoch>" once released) and is
// never deleted, so the partition's last epoch is always there; every
// change is a compare-and-set on the key's revision (the stream sequence
// of its last write). node.<hex name> is a member's heartbeat. Nothing
// expires on the server: like a Kubernetes Lease, a lease or heartbeat is
// over when its key has not changed for the TTL on the observer's own
// clock, counted from when the observer saw its last revision (which is
// after its writer sent it). A holder stops writing 3/4 of the TTL after
// it sent its last renewal that the bucket acknowledged, so it has
// stopped before anyone can take the partition, with only the clocks'
// rates assumed to agree. Taking a lease is a compare-and-set against the
// revision the taker saw: a renewal it missed makes the take fail.
//
// Every process watches the bucket (one ordered consumer), so Holders and
// the membership are read from memory; Confirm reads the key from the
// stream leader.
type KVStore struct {
	kv     jetstream.KeyValue
	nc     *natsio.Conn
	stream string // KV_<bucket>
	prefix string // $KV.<bucket>.
	w      jetstream.KeyWatcher

	mu   sync.Mutex
	ents map[string]kvEnt
	// mine: the revision of this process's last write of each partition
	// lease it holds.
	mine map[int]uint64
}

type kvEnt struct {
	val  string
	rev  uint64
	seen time.Time // when this revision was first seen here
	gone bool      // deleted (a member that left)
}

// KVConfig configures a KVStore.
type KVConfig struct {
	// Bucket is the KV bucket's name (created if missing).
	Bucket string
	// Replicas of the bucket: 3 on a NATS cluster.
	Replicas int
}

// OpenKVStore creates or binds the bucket and starts watching it; it
// returns once the watch has delivered the bucket's current contents.
// GrantsDurable implements durable: a write the bucket acknowledged is on
// a majority of its replicas, and a lease is taken only by a
// compare-and-set against a revision unchanged for the TTL.
func (s *KVStore) GrantsDurable() bool { return true }

// Close stops the watch.
func OpenKVStore(ctx context.Context, nc *natsio.Conn, cfg KVConfig) (*KVStore, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("lease: jetstream: %w", err)
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: cfg.Bucket, History: 1, Replicas: cfg.Replicas, Storage: jetstream.FileStorage,
		Description: "Parley partition leases and chat process heartbeats",
	})
	if err != nil {
		return nil, fmt.Errorf("lease: kv bucket %s: %w", cfg.Bucket, err)
	}
	s := &KVStore{kv: kv, nc: nc, stream: "KV_" + cfg.Bucket, prefix: "$KV." + cfg.Bucket + ".",
		ents: map[string]kvEnt{}, mine: map[int]uint64{}}
	w, err := kv.WatchAll(context.Background())
	if err != nil {
		return nil, fmt.Errorf("lease: watch kv bucket %s: %w", cfg.Bucket, err)
	}
	s.w = w
	ready := make(chan struct{})
	go s.watch(ready)
	select {
	case <-ready:
	case <-ctx.Done():
		_ = w.Stop()
		return nil, fmt.Errorf("lease: watch kv bucket %s: %w", cfg.Bucket, ctx.Err())
	}
	return s, nil
}

// Close stops the watch.
func (s *KVStore) Close() error { return s.w.Stop() }

func (s *KVStore) watch(ready chan struct{}) {
	once := sync.OnceFunc(func() { close(ready) })
	for e := range s.w.Updates() {
		if e == nil {
			once() // the current contents are in
			continue
		}
		s.observe(e.Key(), string(e.Value()), e.Revision(), e.Operation() != jetstream.KeyValuePut)
	}
}

// observe records a revision of key seen now, if newer than the one held.
func (s *KVStore) observe(key, val string, rev uint64, gone bool) kvEnt {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.ents[key]
	if ok && cur.rev >= rev {
		return cur
	}
	e := kvEnt{val: val, rev: rev, seen: time.Now(), gone: gone}
	s.ents[key] = e
	return e
}

func (s *KVStore) ent(key string) (kvEnt, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.ents[key]
	return e, ok
}

func partKey(p int) string         { return "part." + strconv.Itoa(p) }
func memberKey(node string) string { return "node." + hex.EncodeToString([]byte(node)) }

// live reports whether e is a current lease or heartbeat.
func (e kvEnt) live(ttl time.Duration) bool {
	return !e.gone && time.Since(e.seen) < ttl
}

// Announce implements Store: a heartbeat write; the members are those
// whose heartbeat changed within ttl.
func (s *KVStore) Announce(ctx context.Context, node string, ttl time.Duration) ([]string, error) {
	key := memberKey(node)
	rev, err := s.kv.Put(ctx, key, []byte(strconv.FormatInt(time.Now().UnixMilli(), 10)))
	if err != nil {
		return nil, err
	}
	s.observe(key, "", rev, false)
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k, e := range s.ents {
		h, ok := strings.CutPrefix(k, "node.")
		if !ok || !e.live(ttl) {
			continue
		}
		if name, err := hex.DecodeString(h); err == nil {
			out = append(out, string(name))
		}
	}
	return out, nil
}

// Leave implements Store.
func (s *KVStore) Leave(ctx context.Context, node string) error {
	return s.kv.Delete(ctx, memberKey(node))
}

// Holders implements Store, from the watched copy.
func (s *KVStore) Holders(_ context.Context, n int, ttl time.Duration) ([]string, error) {
	out := make([]string, n)
	s.mu.Lock()
	defer s.mu.Unlock()
	for p := range out {
		if e, ok := s.ents[partKey(p)]; ok && e.live(ttl) {
			out[p], _, _ = parseLease(e.val)
		}
	}
	return out, nil
}

// cas writes val to partition p's key if its revision is still rev; it
// returns the new revision, or ok false (and refreshes the copy) when the
// key moved on.
func (s *KVStore) cas(ctx context.Context, p int, val string, rev uint64) (uint64, bool, error) {
	key := partKey(p)
	next, err := s.kv.Update(ctx, key, []byte(val), rev)
	if errors.Is(err, jetstream.ErrKeyExists) {
		if cur, err := s.last(ctx, key); err == nil {
			s.observe(key, cur.val, cur.rev, false)
		}
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	s.observe(key, val, next, false)
	return next, true, nil
}

// Acquire implements Store: a compare-and-set against the revision seen,
// at epoch max(last + 1, the clock in ms).
func (s *KVStore) Acquire(ctx context.Context, p int, node string, ttl time.Duration) (uint64, bool, error) {
	e, _ := s.ent(partKey(p))
	holder, last, _ := parseLease(e.val)
	if e.rev != 0 && holder != "" && e.live(ttl) {
		return 0, false, nil
	}
	epoch := max(last+1, uint64(time.Now().UnixMilli()))
	rev, ok, err := s.cas(ctx, p, leaseValue(node, epoch), e.rev)
	if err != nil || !ok {
		return 0, false, err
	}
	s.mu.Lock()
	s.mine[p] = rev
	s.mu.Unlock()
	return epoch, true, nil
}

// mineAt returns the revision of node's lease of p at epoch, checking the
// leader's copy when this process's own revision is no longer the last
// (a write of unknown outcome that went through).
func (s *KVStore) mineAt(ctx context.Context, p int, node string, epoch uint64) (uint64, bool, error) {
	s.mu.Lock()
	rev, ok := s.mine[p]
	s.mu.Unlock()
	e, _ := s.ent(partKey(p))
	if ok && e.rev == rev && e.val == leaseValue(node, epoch) {
		return rev, true, nil
	}
	cur, err := s.last(ctx, partKey(p))
	if err != nil {
		return 0, false, err
	}
	s.observe(partKey(p), cur.val, cur.rev, false)
	if cur.val != leaseValue(node, epoch) {
		return 0, false, nil
	}
	return cur.rev, true, nil
}

// Renew implements Store: one compare-and-set per lease, in parallel.
func (s *KVStore) Renew(ctx context.Context, node string, held map[int]uint64, _ time.Duration) (map[int]bool, error) {
	var (
		mu   sync.Mutex
		out  = make(map[int]bool, len(held))
		errs []error
		wg   sync.WaitGroup
	)
	for p, epoch := range held {
		wg.Go(func() {
			ok, err := s.rewrite(ctx, p, node, epoch, leaseValue(node, epoch))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("partition %d: %w", p, err))
				return
			}
			out[p] = ok
		})
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// rewrite writes val over node's lease of p at epoch; ok false if the
// lease is no longer that.
func (s *KVStore) rewrite(ctx context.Context, p int, node string, epoch uint64, val string) (bool, error) {
	for range 2 {
		rev, ok, err := s.mineAt(ctx, p, node, epoch)
		if err != nil || !ok {
			return false, err
		}
		next, ok, err := s.cas(ctx, p, val, rev)
		if err != nil {
			return false, err
		}
		if ok {
			s.mu.Lock()
			if holder, _, _ := parseLease(val); holder == "" {
				delete(s.mine, p)
			} else {
				s.mine[p] = next
			}
			s.mu.Unlock()
			return true, nil
		}
		// Moved on since: look again (it may be this process's own write).
	}
	return false, nil
}

// Reepoch implements Store.
func (s *KVStore) Reepoch(ctx context.Context, p int, node string, epoch uint64, _ time.Duration) (uint64, bool, error) {
	next := max(epoch+1, uint64(time.Now().UnixMilli()))
	ok, err := s.rewrite(ctx, p, node, epoch, leaseValue(node, next))
	if err != nil || !ok {
		return 0, false, err
	}
	return next, true, nil
}

// Release implements Store: each lease rewritten as free ("/<epoch>").
func (s *KVStore) Release(ctx context.Context, node string, leases map[int]uint64) error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for p, epoch := range leases {
		wg.Go(func() {
			if _, err := s.rewrite(ctx, p, node, epoch, leaseValue("", epoch)); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Confirm implements Store: the key read from the stream's leader (not a
// direct get, which any replica may answer from an older state).
func (s *KVStore) Confirm(ctx context.Context, p int, node string, epoch uint64) (bool, string, error) {
	cur, err := s.last(ctx, partKey(p))
	if err != nil {
		return false, "", err
	}
	s.observe(partKey(p), cur.val, cur.rev, false)
	return cur.val == leaseValue(node, epoch), cur.val, nil
}

// last reads key's last revision through the stream leader
// ($JS.API.STREAM.MSG.GET); a missing key is the zero kvEnt.
func (s *KVStore) last(ctx context.Context, key string) (kvEnt, error) {
	req, _ := json.Marshal(struct {
		LastFor string `json:"last_by_subj"`
	}{s.prefix + key})
	msg, err := s.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+s.stream, req)
	if err != nil {
		return kvEnt{}, err
	}
	var resp struct {
		Message *struct {
			Seq  uint64 `json:"seq"`
			Data []byte `json:"data"`
		} `json:"message"`
		Error *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return kvEnt{}, fmt.Errorf("lease: kv get %s: %w", key, err)
	}
	if resp.Error != nil {
		if resp.Error.Code == 404 {
			return kvEnt{}, nil
		}
		return kvEnt{}, fmt.Errorf("lease: kv get %s: %s (%d)", key, resp.Error.Description, resp.Error.ErrCode)
	}
	if resp.Message == nil {
		return kvEnt{}, fmt.Errorf("lease: kv get %s: empty answer", key)
	}
	return kvEnt{val: string(resp.Message.Data), rev: resp.Message.Seq}, nil
}
