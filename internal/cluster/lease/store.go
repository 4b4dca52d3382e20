package lease

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Store is where partition leases and the chat processes' membership
// live: the seam between Owner's policy (who wants which partition, when
// to stop writing) and an engine. Two implement it: Redis (NewRedisStore;
// one primary, replication asynchronous) and NATS JetStream KV
// (OpenKVStore; replicated by Raft). Both pass the same conformance tests
// (owner_test.go).
//
// Every method is one round trip or a few in parallel. A lease is the
// pair (node, epoch); a partition's epochs grow strictly with every new
// lease and with every Reepoch, whatever the store lost.
type Store interface {
	// Announce records node as live for ttl and returns the live nodes.
	Announce(ctx context.Context, node string, ttl time.Duration) ([]string, error)
	// Leave removes node from the live set (a clean stop).
	Leave(ctx context.Context, node string) error
	// Holders returns, for each of the n partitions, the node holding its
	// lease, "" when it is free (never taken, released or expired).
	Holders(ctx context.Context, n int, ttl time.Duration) ([]string, error)
	// Acquire takes free partition p for node for ttl under a new epoch;
	// ok false when it is held.
	Acquire(ctx context.Context, p int, node string, ttl time.Duration) (epoch uint64, ok bool, err error)
	// Renew extends node's leases (partition → epoch) by ttl. The result
	// says per partition true (renewed) or false (lost: held by another
	// or at another epoch); a partition missing from it is unknown (its
	// error is in err).
	Renew(ctx context.Context, node string, held map[int]uint64, ttl time.Duration) (map[int]bool, error)
	// Reepoch moves node's lease of p from epoch to a new, higher one with
	// a fresh ttl; ok false if p is no longer node's at epoch.
	Reepoch(ctx context.Context, p int, node string, epoch uint64, ttl time.Duration) (next uint64, ok bool, err error)
	// Release gives up node's leases (partition → epoch) still held at
	// those epochs, so they are free at once.
	Release(ctx context.Context, node string, leases map[int]uint64) error
	// Confirm reports whether p's lease is node's at epoch now, and else
	// what it is ("node/epoch", "" when free).
	Confirm(ctx context.Context, p int, node string, epoch uint64) (ok bool, current string, err error)
}

// durable is implemented by a store whose acknowledged grants and
// renewals are never lost (replicated by consensus) and which grants a
// lease to another process only after it has gone unchanged for the TTL,
// counted from after its last renewal was written. On such a store a
// holder needs no round trip to confirm a write: a write that completed
// before the holder's local deadline (3/4 of the TTL after it sent its
// last acknowledged renewal) completed before anyone could take the
// partition (Owner.Confirm).
type durable interface {
	// GrantsDurable reports whether the store has that property.
	GrantsDurable() bool
}

func leaseValue(node string, epoch uint64) string {
	return node + "/" + strconv.FormatUint(epoch, 10)
}

// parseLease splits "node/epoch" ("" node: free).
func parseLease(v string) (node string, epoch uint64, ok bool) {
	i := strings.LastIndexByte(v, '/')
	if i < 0 {
		return "", 0, false
	}
	e, err := strconv.ParseUint(v[i+1:], 10, 64)
	if err != nil {
		return "", 0, false
	}
	return v[:i], e, true
}

// RedisStore keeps the leases in Redis. The key <ns>:part:<p> holds
// "<node>/<epoch>" with a TTL; <ns>:partepoch:<p> the partition's last
// epoch. A new lease's epoch is max(last + 1, Redis time in ms), so epochs
// grow strictly even when a Redis restart loses the counter (as long as
// Redis's clock does not go back). Members are in the sorted set
// <ns>:chatnodes (score: expiry in ms). Every check is one script run on
// the primary; what a failover does to them is in docs/decisions.md
// ("Partition leases on a replicated engine").
type RedisStore struct {
	rdb goredis.UniversalClient
	ns  string
}

// NewRedisStore returns the Redis lease store of namespace ns.
func NewRedisStore(rdb goredis.UniversalClient, ns string) *RedisStore {
	return &RedisStore{rdb: rdb, ns: ns}
}

func (r *RedisStore) key(p int) string      { return r.ns + ":part:" + strconv.Itoa(p) }
func (r *RedisStore) epochKey(p int) string { return r.ns + ":partepoch:" + strconv.Itoa(p) }
func (r *RedisStore) nodesKey() string      { return r.ns + ":chatnodes" }

// nextEpochLua sets e to the partition's next epoch and records it in
// KEYS[2]: above every epoch granted before, and at least Redis's clock in
// milliseconds, so epochs grow across Redis restarts that lose KEYS[2].
// Acquiring a lease and re-epoching one share it.
const nextEpochLua = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local e = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1, now)
redis.call('SET', KEYS[2], string.format('%d', e))`

var (
	acquireScript = goredis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end` + nextEpochLua + `
redis.call('SET', KEYS[1], ARGV[1] .. '/' .. string.format('%d', e), 'PX', ARGV[2])
return string.format('%d', e)`)
	renewScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0`)
	reepochScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end` + nextEpochLua + `
redis.call('SET', KEYS[1], ARGV[2] .. '/' .. string.format('%d', e), 'PX', ARGV[3])
return string.format('%d', e)`)
	releaseScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)
)

// Announce implements Store.
func (r *RedisStore) Announce(ctx context.Context, node string, ttl time.Duration) ([]string, error) {
	ms := time.Now().UnixMilli()
	pipe := r.rdb.TxPipeline()
	pipe.ZAdd(ctx, r.nodesKey(), goredis.Z{Score: float64(ms + ttl.Milliseconds()), Member: node})
	pipe.ZRemRangeByScore(ctx, r.nodesKey(), "-inf", strconv.FormatInt(ms, 10))
	live := pipe.ZRangeByScore(ctx, r.nodesKey(), &goredis.ZRangeBy{Min: strconv.FormatInt(ms, 10), Max: "+inf"})
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	return live.Val(), nil
}

// Leave implements Store.
func (r *RedisStore) Leave(ctx context.Context, node string) error {
	return r.rdb.ZRem(ctx, r.nodesKey(), node).Err()
}

// Holders implements Store: one MGET.
func (r *RedisStore) Holders(ctx context.Context, n int, _ time.Duration) ([]string, error) {
	keys := make([]string, n)
	for p := range keys {
		keys[p] = r.key(p)
	}
	vals, err := r.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, err
	}
	out := make([]string, n)
	for p, v := range vals {
		s, _ := v.(string)
		out[p], _, _ = parseLease(s)
	}
	return out, nil
}

// Acquire implements Store.
func (r *RedisStore) Acquire(ctx context.Context, p int, node string, ttl time.Duration) (uint64, bool, error) {
	v, err := acquireScript.Run(ctx, r.rdb, []string{r.key(p), r.epochKey(p)}, node, ttl.Milliseconds()).Result()
	if err != nil {
		return 0, false, err
	}
	s, ok := v.(string)
	if !ok {
		return 0, false, nil // taken meanwhile
	}
	epoch, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("bad epoch %q from redis", s)
	}
	return epoch, true, nil
}

// Renew implements Store: one pipeline.
func (r *RedisStore) Renew(ctx context.Context, node string, held map[int]uint64, ttl time.Duration) (map[int]bool, error) {
	pipe := r.rdb.Pipeline()
	cmds := make(map[int]*goredis.Cmd, len(held))
	for p, e := range held {
		cmds[p] = renewScript.Eval(ctx, pipe, []string{r.key(p)}, leaseValue(node, e), ttl.Milliseconds())
	}
	_, _ = pipe.Exec(ctx)
	out := make(map[int]bool, len(held))
	var errs []error
	for p, c := range cmds {
		n, err := c.Int64()
		if err != nil {
			errs = append(errs, fmt.Errorf("partition %d: %w", p, err))
			continue
		}
		out[p] = n == 1
	}
	return out, errors.Join(errs...)
}

// Reepoch implements Store.
func (r *RedisStore) Reepoch(ctx context.Context, p int, node string, epoch uint64, ttl time.Duration) (uint64, bool, error) {
	v, err := reepochScript.Run(ctx, r.rdb, []string{r.key(p), r.epochKey(p)}, leaseValue(node, epoch), node, ttl.Milliseconds()).Result()
	if err != nil {
		return 0, false, err
	}
	s, ok := v.(string)
	if !ok {
		return 0, false, nil
	}
	next, err := strconv.ParseUint(s, 10, 64)
	if err != nil || next <= epoch {
		return 0, false, fmt.Errorf("bad new epoch %q", s)
	}
	return next, true, nil
}

// Release implements Store.
func (r *RedisStore) Release(ctx context.Context, node string, leases map[int]uint64) error {
	pipe := r.rdb.Pipeline()
	for p, e := range leases {
		releaseScript.Eval(ctx, pipe, []string{r.key(p)}, leaseValue(node, e))
	}
	_, err := pipe.Exec(ctx)
	return err
}

// Confirm implements Store: one GET.
func (r *RedisStore) Confirm(ctx context.Context, p int, node string, epoch uint64) (bool, string, error) {
	v, err := r.rdb.Get(ctx, r.key(p)).Result()
	if errors.Is(err, goredis.Nil) {
		v, err = "", nil
	}
	if err != nil {
		return false, "", err
	}
	return v == leaseValue(node, epoch), v, nil
}
