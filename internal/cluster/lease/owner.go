package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Conversation ownership. Conversations map to partitions (Partition);
// each partition is held by one chat process at a time under a lease in
// Redis with a fencing epoch. The key <ns>:part:<p> holds "<node>/<epoch>"
// with a TTL; <ns>:partepoch:<p> the partition's last epoch. A new lease's
// epoch is max(last + 1, Redis time in ms), so epochs grow strictly even
// when a Redis restart loses the counter (as long as Redis's clock does not
// go back). Chat processes announce themselves in the sorted set
// <ns>:chatnodes (score: expiry in ms); each wants the partitions it ranks
// first for by rendezvous hashing among the live ones, takes them when
// free, gives up those another live process ranks first for, and takes
// any partition that stayed free for two rounds (so every partition finds
// an owner while views of the membership differ).
//
// A holder stops writing under a lease a quarter of the TTL before it
// could have expired in Redis (counted from when its last renewal was
// sent), and the store confirms the epoch in Redis after each write
// before acknowledging it (cassandra.Lease), so a stalled holder never
// gets a write acknowledged after another took over.

// DefaultPartitions and DefaultLeaseTTL are the defaults of OwnerConfig.
const (
	DefaultPartitions = 64
	DefaultLeaseTTL   = 3 * time.Second
)

// Partition maps a conversation to one of n partitions. Every process of
// a deployment must use the same n.
func Partition(conv uint64, n int) int {
	// Mixed: Snowflake ids' low bits are a per-millisecond counter.
	return int(mix(conv+0x9e3779b97f4a7c15) % uint64(n))
}

// OwnerConfig configures an Owner.
type OwnerConfig struct {
	Namespace string
	Node      string
	// Partitions is the number of partitions (default 64); it must be the
	// same in every process of the deployment.
	Partitions int
	// LeaseTTL of a partition lease (default 3s). A dead owner's
	// partitions are taken over within about LeaseTTL + LeaseTTL/3.
	LeaseTTL time.Duration
	Logger   *slog.Logger
}

// ErrLeaseLost is returned by Confirm when the partition's lease is no
// longer this process's at the epoch.
var ErrLeaseLost = errors.New("lease: partition lease lost")

// Owner holds this process's partition leases. It implements
// cassandra.Lease.
type Owner struct {
	rdb goredis.UniversalClient
	cfg OwnerConfig
	log *slog.Logger

	remu  sync.Mutex // Reepoch
	mu    sync.Mutex
	held  map[int]*lease
	free  map[int]int // partition → consecutive rounds seen free
	watch []func(p int, held bool)
}

type lease struct {
	epoch uint64
	until time.Time // stop writing at this time unless renewed
}

// NewOwner returns an Owner; Run takes and keeps the leases.
func NewOwner(rdb goredis.UniversalClient, cfg OwnerConfig) *Owner {
	if cfg.Partitions <= 0 {
		cfg.Partitions = DefaultPartitions
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Owner{rdb: rdb, cfg: cfg, log: cfg.Logger, held: map[int]*lease{}, free: map[int]int{}}
}

// Watch registers f, called when this process takes (held true) or gives
// up a partition, and at once for the partitions held now. Calls may come
// from several goroutines and, racing, out of order: f should look at
// Holds rather than trust held.
func (o *Owner) Watch(f func(p int, held bool)) {
	o.mu.Lock()
	o.watch = append(o.watch, f)
	now := make([]int, 0, len(o.held))
	for p := range o.held {
		now = append(now, p)
	}
	o.mu.Unlock()
	for _, p := range now {
		f(p, true)
	}
}

// Holds reports whether this process holds partition p and may write
// under it.
func (o *Owner) Holds(p int) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	l := o.held[p]
	return l != nil && time.Now().Before(l.until)
}

// Partitions is the configured number of partitions.
func (o *Owner) Partitions() int { return o.cfg.Partitions }

// Epoch implements cassandra.Lease.
func (o *Owner) Epoch(conv uint64) (uint64, bool) {
	p := Partition(conv, o.cfg.Partitions)
	o.mu.Lock()
	defer o.mu.Unlock()
	l := o.held[p]
	if l == nil || !time.Now().Before(l.until) {
		return 0, false
	}
	return l.epoch, true
}

// Confirm implements cassandra.Lease: one GET of the partition's key.
func (o *Owner) Confirm(ctx context.Context, conv, epoch uint64) error {
	p := Partition(conv, o.cfg.Partitions)
	v, err := o.rdb.Get(ctx, o.key(p)).Result()
	if errors.Is(err, goredis.Nil) {
		v, err = "", nil
	}
	if err != nil {
		return fmt.Errorf("lease: confirm partition %d: %w", p, err)
	}
	if v != o.value(epoch) {
		o.drop(p, epoch)
		return fmt.Errorf("%w: partition %d is %q, not %q", ErrLeaseLost, p, v, o.value(epoch))
	}
	return nil
}

// Reepoch implements cassandra.Lease: if partition p of conv is still
// this process's at epoch in Redis, it is re-claimed at once at a new
// epoch (max(last + 1, Redis time in ms), as a new lease's) with a fresh
// TTL, in one script; Epoch returns the new epoch from then on. A lease
// this process already moved to a newer epoch returns that one; a lease
// found held by another node or at another epoch is given up (ok false).
func (o *Owner) Reepoch(ctx context.Context, conv, epoch uint64) (uint64, bool, error) {
	p := Partition(conv, o.cfg.Partitions)
	o.remu.Lock() // one re-claim at a time: conversations of p may all ask
	defer o.remu.Unlock()
	o.mu.Lock()
	l := o.held[p]
	cur := uint64(0)
	if l != nil && time.Now().Before(l.until) {
		cur = l.epoch
	}
	o.mu.Unlock()
	switch {
	case cur > epoch:
		return cur, true, nil
	case cur < epoch:
		return 0, false, nil
	}
	sent := time.Now()
	ttl := o.cfg.LeaseTTL
	v, err := reepochScript.Run(ctx, o.rdb, []string{o.key(p), o.epochKey(p)}, o.value(epoch), o.cfg.Node, ttl.Milliseconds()).Result()
	if err != nil {
		return 0, false, fmt.Errorf("lease: new epoch for partition %d: %w", p, err)
	}
	str, isStr := v.(string)
	if !isStr {
		o.drop(p, epoch)
		return 0, false, nil
	}
	next, err := strconv.ParseUint(str, 10, 64)
	if err != nil || next <= epoch {
		return 0, false, fmt.Errorf("lease: bad new epoch %q for partition %d", str, p)
	}
	o.mu.Lock()
	l = o.held[p]
	kept := l != nil && l.epoch == epoch
	if kept {
		l.epoch, l.until = next, sent.Add(ttl-ttl/4)
	}
	o.mu.Unlock()
	if !kept {
		// Given up meanwhile (rebalanced or expired): let it go in Redis
		// too rather than wait for its TTL.
		_ = releaseScript.Run(ctx, o.rdb, []string{o.key(p)}, o.value(next)).Err()
		return 0, false, nil
	}
	o.log.Info("ownership: partition moved to a new epoch", "partition", p, "epoch", next)
	return next, true, nil
}

func (o *Owner) key(p int) string      { return o.cfg.Namespace + ":part:" + strconv.Itoa(p) }
func (o *Owner) epochKey(p int) string { return o.cfg.Namespace + ":partepoch:" + strconv.Itoa(p) }
func (o *Owner) nodesKey() string      { return o.cfg.Namespace + ":chatnodes" }
func (o *Owner) value(epoch uint64) string {
	return o.cfg.Node + "/" + strconv.FormatUint(epoch, 10)
}

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

// Run takes, renews and rebalances leases every LeaseTTL/3 until ctx
// ends, then gives them all up.
func (o *Owner) Run(ctx context.Context) {
	tick := time.NewTicker(o.cfg.LeaseTTL / 3)
	defer tick.Stop()
	for {
		o.round(ctx)
		select {
		case <-ctx.Done():
			o.release(nil, true)
			return
		case <-tick.C:
		}
	}
}

// round is one pass: announce, renew, take, give up.
func (o *Owner) round(ctx context.Context) {
	ttl := o.cfg.LeaseTTL
	now := time.Now()
	nodes, err := o.announce(ctx, now)
	if err != nil {
		if ctx.Err() == nil {
			o.log.Warn("ownership: redis unavailable; partitions are given up as their leases end", "err", err)
		}
		o.expire(now)
		return
	}
	o.renew(ctx)
	keys := make([]string, o.cfg.Partitions)
	for p := range keys {
		keys[p] = o.key(p)
	}
	vals, err := o.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		o.expire(now)
		return
	}
	var give []int
	for p, v := range vals {
		cur, _ := v.(string)
		want := rendezvous(nodes, p)
		o.mu.Lock()
		_, mine := o.held[p]
		if cur == "" {
			o.free[p]++
		} else {
			delete(o.free, p)
		}
		freeRounds := o.free[p]
		o.mu.Unlock()
		switch {
		case cur == "" && (want == o.cfg.Node || freeRounds >= 2):
			o.acquire(ctx, p, ttl)
		case mine && want != o.cfg.Node && want != "":
			give = append(give, p)
		}
	}
	o.release(give, false)
}

// announce refreshes this node's entry and returns the live nodes.
func (o *Owner) announce(ctx context.Context, now time.Time) ([]string, error) {
	ms := now.UnixMilli()
	pipe := o.rdb.TxPipeline()
	pipe.ZAdd(ctx, o.nodesKey(), goredis.Z{Score: float64(ms + o.cfg.LeaseTTL.Milliseconds()), Member: o.cfg.Node})
	pipe.ZRemRangeByScore(ctx, o.nodesKey(), "-inf", strconv.FormatInt(ms, 10))
	live := pipe.ZRangeByScore(ctx, o.nodesKey(), &goredis.ZRangeBy{Min: strconv.FormatInt(ms, 10), Max: "+inf"})
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	return live.Val(), nil
}

// renew extends every held lease; a lease found gone is dropped at once.
func (o *Owner) renew(ctx context.Context) {
	o.mu.Lock()
	held := make(map[int]uint64, len(o.held))
	for p, l := range o.held {
		held[p] = l.epoch
	}
	o.mu.Unlock()
	if len(held) == 0 {
		return
	}
	sent := time.Now()
	pipe := o.rdb.Pipeline()
	cmds := make(map[int]*goredis.Cmd, len(held))
	for p, e := range held {
		cmds[p] = renewScript.Eval(ctx, pipe, []string{o.key(p)}, o.value(e), o.cfg.LeaseTTL.Milliseconds())
	}
	_, _ = pipe.Exec(ctx)
	for p, c := range cmds {
		n, err := c.Int64()
		switch {
		case err != nil:
			// Unknown: keep writing until the local deadline passes.
			if ctx.Err() == nil {
				o.log.Warn("ownership: renewal failed", "partition", p, "err", err)
			}
		case n == 1:
			o.mu.Lock()
			if l := o.held[p]; l != nil && l.epoch == held[p] {
				l.until = sent.Add(o.cfg.LeaseTTL - o.cfg.LeaseTTL/4)
			}
			o.mu.Unlock()
		default:
			o.drop(p, held[p])
		}
	}
	o.expire(time.Now())
}

// acquire tries to take partition p.
func (o *Owner) acquire(ctx context.Context, p int, ttl time.Duration) {
	sent := time.Now()
	v, err := acquireScript.Run(ctx, o.rdb, []string{o.key(p), o.epochKey(p)}, o.cfg.Node, ttl.Milliseconds()).Result()
	if err != nil {
		if ctx.Err() == nil {
			o.log.Warn("ownership: acquire failed", "partition", p, "err", err)
		}
		return
	}
	s, ok := v.(string)
	if !ok {
		return // taken meanwhile
	}
	epoch, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		o.log.Error("ownership: bad epoch from redis", "partition", p, "epoch", s)
		return
	}
	o.mu.Lock()
	o.held[p] = &lease{epoch: epoch, until: sent.Add(ttl - ttl/4)}
	delete(o.free, p)
	o.mu.Unlock()
	o.log.Info("ownership: partition taken", "partition", p, "epoch", epoch)
	o.notify(p, true)
}

// drop forgets partition p if it is still held at epoch.
func (o *Owner) drop(p int, epoch uint64) {
	o.mu.Lock()
	l := o.held[p]
	gone := l != nil && l.epoch == epoch
	if gone {
		delete(o.held, p)
	}
	o.mu.Unlock()
	if gone {
		o.log.Warn("ownership: partition lost", "partition", p, "epoch", epoch)
		o.notify(p, false)
	}
}

// expire drops the leases whose local deadline passed.
func (o *Owner) expire(now time.Time) {
	o.mu.Lock()
	var gone []int
	for p, l := range o.held {
		if !now.Before(l.until) {
			gone = append(gone, p)
			delete(o.held, p)
		}
	}
	o.mu.Unlock()
	for _, p := range gone {
		o.log.Warn("ownership: lease could not be renewed in time; partition given up", "partition", p)
		o.notify(p, false)
	}
}

// release gives the partitions ps up (all held ones if all): writes stop
// first, then, after the writes in flight had time to confirm their
// lease, the keys are deleted so the next owners need not wait for the
// TTL. With all, the node also leaves the membership set (shutdown).
func (o *Owner) release(ps []int, all bool) {
	o.mu.Lock()
	if all {
		ps = ps[:0]
		for p := range o.held {
			ps = append(ps, p)
		}
	}
	gone := make(map[int]uint64, len(ps))
	for _, p := range ps {
		if l := o.held[p]; l != nil {
			gone[p] = l.epoch
			delete(o.held, p)
		}
	}
	o.mu.Unlock()
	if len(gone) == 0 && !all {
		return
	}
	for p := range gone {
		o.notify(p, false)
	}
	time.Sleep(releaseGrace)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	pipe := o.rdb.Pipeline()
	for p, e := range gone {
		releaseScript.Eval(ctx, pipe, []string{o.key(p)}, o.value(e))
	}
	if all {
		pipe.ZRem(ctx, o.nodesKey(), o.cfg.Node)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		o.log.Warn("ownership: release failed; the leases expire instead", "err", err)
	}
}

// releaseGrace lets writes in flight under a released lease confirm it.
const releaseGrace = 100 * time.Millisecond

func (o *Owner) notify(p int, held bool) {
	o.mu.Lock()
	watch := o.watch
	o.mu.Unlock()
	for _, f := range watch {
		f(p, held)
	}
}

// Held returns the partitions this process holds (tests, metrics).
func (o *Owner) Held() []int {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]int, 0, len(o.held))
	for p := range o.held {
		out = append(out, p)
	}
	return out
}

// rendezvous returns the node that ranks first for partition p.
func rendezvous(nodes []string, p int) string {
	var (
		best  string
		score uint64
	)
	for _, n := range nodes {
		h := fnv64(n + "/" + strconv.Itoa(p))
		if best == "" || h > score || (h == score && strings.Compare(n, best) < 0) {
			best, score = n, h
		}
	}
	return best
}

func fnv64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	// Mix: FNV's high bits move little with the last bytes.
	return mix(h)
}

// mix is splitmix64's finaliser.
func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
