package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Conversation ownership. Conversations map to partitions (Partition);
// each partition is held by one chat process at a time under a lease with
// a fencing epoch, kept in a Store (NATS JetStream KV or Redis). Chat
// processes announce themselves in the store; each wants the partitions
// it ranks first for by rendezvous hashing among the live ones, takes
// them when free, gives up those another live process ranks first for,
// and takes any partition that stayed free for two rounds (so every
// partition finds an owner while views of the membership differ).
//
// A holder stops writing under a lease a quarter of the TTL before it
// could have expired in the store (counted from when its last renewal was
// sent), and the store confirms the lease after each write before
// acknowledging it (cassandra.Lease: against the local deadline on the
// JetStream KV store, by a read on Redis), so a stalled holder never gets
// a write acknowledged after another took over.

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
	Node string
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
	st  Store
	cfg OwnerConfig
	log *slog.Logger

	// localConfirms counts the confirmations answered from the local
	// deadline (tests).
	localConfirms atomic.Int64

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

// NewOwner returns an Owner of the leases in st; Run takes and keeps
// them.
func NewOwner(st Store, cfg OwnerConfig) *Owner {
	if cfg.Partitions <= 0 {
		cfg.Partitions = DefaultPartitions
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Owner{st: st, cfg: cfg, log: cfg.Logger, held: map[int]*lease{}, free: map[int]int{}}
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

// Confirm implements cassandra.Lease. On a store whose grants are durable
// (the JetStream KV bucket) a lease still held at epoch before its local
// deadline confirms without a round trip: the deadline is 3/4 of the TTL
// after the last acknowledged renewal was sent, and no other process can
// take the partition before a full TTL after that renewal was written, so
// a write that completed before the deadline is below any later owner's
// top. A lease past its deadline, at another epoch or on the Redis store
// (where a failover can lose a grant) is read from the store: one round
// trip.
func (o *Owner) Confirm(ctx context.Context, conv, epoch uint64) error {
	p := Partition(conv, o.cfg.Partitions)
	if d, ok := o.st.(durable); ok && d.GrantsDurable() {
		o.mu.Lock()
		l := o.held[p]
		valid := l != nil && l.epoch == epoch && time.Now().Before(l.until)
		o.mu.Unlock()
		if valid {
			o.localConfirms.Add(1)
			return nil
		}
	}
	ok, cur, err := o.st.Confirm(ctx, p, o.cfg.Node, epoch)
	if err != nil {
		return fmt.Errorf("lease: confirm partition %d: %w", p, err)
	}
	if !ok {
		o.drop(p, epoch)
		return fmt.Errorf("%w: partition %d is %q, not %q", ErrLeaseLost, p, cur, leaseValue(o.cfg.Node, epoch))
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
	next, ok, err := o.st.Reepoch(ctx, p, o.cfg.Node, epoch, ttl)
	if err != nil {
		return 0, false, fmt.Errorf("lease: new epoch for partition %d: %w", p, err)
	}
	if !ok {
		o.drop(p, epoch)
		return 0, false, nil
	}
	o.mu.Lock()
	l = o.held[p]
	kept := l != nil && l.epoch == epoch
	if kept {
		l.epoch, l.until = next, sent.Add(ttl-ttl/4)
	}
	o.mu.Unlock()
	if !kept {
		// Given up meanwhile (rebalanced or expired): let it go in the store
		// too rather than wait for its TTL.
		_ = o.st.Release(ctx, o.cfg.Node, map[int]uint64{p: next})
		return 0, false, nil
	}
	o.log.Info("ownership: partition moved to a new epoch", "partition", p, "epoch", next)
	return next, true, nil
}

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
	nodes, err := o.st.Announce(ctx, o.cfg.Node, ttl)
	if err != nil {
		if ctx.Err() == nil {
			o.log.Warn("ownership: lease store unavailable; partitions are given up as their leases end", "err", err)
		}
		o.expire(now)
		return
	}
	o.renew(ctx)
	vals, err := o.st.Holders(ctx, o.cfg.Partitions, ttl)
	if err != nil {
		o.expire(now)
		return
	}
	var give []int
	for p, cur := range vals {
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
	res, err := o.st.Renew(ctx, o.cfg.Node, held, o.cfg.LeaseTTL)
	if err != nil && ctx.Err() == nil {
		// Unknown: keep writing until the local deadline passes.
		o.log.Warn("ownership: renewal failed", "err", err)
	}
	for p, ok := range res {
		if !ok {
			o.drop(p, held[p])
			continue
		}
		o.mu.Lock()
		if l := o.held[p]; l != nil && l.epoch == held[p] {
			l.until = sent.Add(o.cfg.LeaseTTL - o.cfg.LeaseTTL/4)
		}
		o.mu.Unlock()
	}
	o.expire(time.Now())
}

// acquire tries to take partition p.
func (o *Owner) acquire(ctx context.Context, p int, ttl time.Duration) {
	sent := time.Now()
	epoch, ok, err := o.st.Acquire(ctx, p, o.cfg.Node, ttl)
	if err != nil {
		if ctx.Err() == nil {
			o.log.Warn("ownership: acquire failed", "partition", p, "err", err)
		}
		return
	}
	if !ok {
		return // taken meanwhile
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
	err := o.st.Release(ctx, o.cfg.Node, gone)
	if all {
		err = errors.Join(err, o.st.Leave(ctx, o.cfg.Node))
	}
	if err != nil {
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
