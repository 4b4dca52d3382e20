// Package redis is the session registry on Redis for cluster mode.
//
// # Layout
//
// Each user has one hash, u:<user>, mapping device → entry. Each gateway node
// holds a lease, lease:<node>, a key with a TTL whose value is a random epoch;
// every entry records the epoch it was registered under, and Lookup returns
// an entry only while its node's lease still holds that epoch. So when a
// gateway dies without unregistering, all its entries vanish together once
// its lease lapses (one key per node to refresh, not one per connection), and
// a node that comes back gets a new epoch: the old incarnation's entries never
// come back to life. Lookup deletes dead entries it meets. A per-node set,
// n:<node>, indexes the node's entries for DropNode.
//
// Every script touches a single key, so the layout also works on Redis
// Cluster. Register's replace and Unregister's session check are atomic Lua
// scripts on the user's hash.
//
// # Wiring
//
// A gateway calls DropNode(node) once before it accepts connections (clearing
// what a previous process of the same node left), Refresh(node) every TTL/3,
// and DropNode(node) again on clean shutdown. Refresh returns ErrLeaseLost
// when the lease lapsed anyway (Redis was unreachable longer than TTL, or a
// failover or restart lost it): the node's entries are gone, and the gateway
// registers its open connections again (Restore) or, failing that, closes
// them so the clients reconnect and register again.
//
// All types are safe for concurrent use.
package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/internal/registry"
)

// ErrLeaseLost means a node's lease lapsed or was dropped: every entry the
// node registered before is gone from the registry.
var ErrLeaseLost = errors.New("redis: node lease lost")

// Config tunes the registry. The zero value plus defaults is production-ready.
type Config struct {
	// Prefix starts every key, so several deployments (or tests) can share a
	// Redis. Default "parley:".
	Prefix string
	// TTL is how long a node's entries outlive its last Refresh. Default 30s.
	TTL time.Duration
	// LeaseCache is how long Lookup trusts a node's lease without asking
	// Redis again: a dead node's entries may be returned this much past its
	// TTL, but a Lookup then costs one round trip instead of two. Default
	// 1s; negative disables the cache.
	LeaseCache time.Duration
	// Logger receives failures of background cleanup. Default discards.
	Logger *slog.Logger
}

func (c *Config) withDefaults() Config {
	out := *c
	if out.Prefix == "" {
		out.Prefix = "parley:"
	}
	if out.TTL == 0 {
		out.TTL = 30 * time.Second
	}
	if out.LeaseCache == 0 {
		out.LeaseCache = time.Second
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return out
}

// Validate reports a configuration the registry cannot work with.
func (c *Config) Validate() error {
	d := c.withDefaults()
	if d.TTL < 100*time.Millisecond {
		return fmt.Errorf("redis: config: TTL %s is below 100ms", d.TTL)
	}
	if d.LeaseCache >= d.TTL {
		return fmt.Errorf("redis: config: LeaseCache %s must be below TTL %s", d.LeaseCache, d.TTL)
	}
	return nil
}

// Registry is a registry.Registry on Redis.
type Registry struct {
	c   goredis.UniversalClient
	cfg Config

	mu struct {
		sync.Mutex
		// own holds the epoch of each lease this process took or refreshed,
		// so Refresh can tell a lapsed lease from one never taken.
		own map[string]string
		// lost marks nodes whose lease this process saw replaced by a new
		// epoch in Register; the next Refresh reports it.
		lost map[string]bool
		// seen caches epochs read from Redis for Lookup (see LeaseCache).
		seen map[string]seenLease
	}
}

type seenLease struct {
	epoch string
	at    time.Time
}

var _ registry.Registry = (*Registry)(nil)

// New returns a registry on c; the caller owns c and closes it after the
// registry's last use.
func New(c goredis.UniversalClient, cfg Config) (*Registry, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Registry{c: c, cfg: cfg.withDefaults()}
	r.mu.own = make(map[string]string)
	r.mu.lost = make(map[string]bool)
	r.mu.seen = make(map[string]seenLease)
	return r, nil
}

// TTL is the configured lease TTL; gateways refresh every TTL/3.
func (r *Registry) TTL() time.Duration { return r.cfg.TTL }

// stored is an entry as kept in the user's hash; user and device are the key
// and the field.
type stored struct {
	Node    string `json:"n"`
	Session string `json:"s"`
	Since   int64  `json:"t"`
	Epoch   string `json:"e"`
}

func (r *Registry) userKey(user string) string  { return r.cfg.Prefix + "u:" + user }
func (r *Registry) leaseKey(node string) string { return r.cfg.Prefix + "lease:" + node }
func (r *Registry) nodeKey(node string) string  { return r.cfg.Prefix + "n:" + node }

// member names an entry in its node's index. IDs never contain NUL (see
// protocol.ValidID), so the split is unambiguous.
func member(user, device, session string) string { return user + "\x00" + device + "\x00" + session }

// acquireScript returns the node's current epoch, taking a new lease with
// ARGV[1] as epoch when there is none.
var acquireScript = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
`)

// refreshScript extends the lease only if it still holds our epoch.
var refreshScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`)

// registerScript swaps in the new entry and returns the one it replaced.
var registerScript = goredis.NewScript(`
local old = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return old
`)

// removeScript deletes field ARGV[1] if its entry has session ARGV[2] and,
// when given, node ARGV[3]; it returns the node of the removed entry.
var removeScript = goredis.NewScript(`
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return false end
local e = cjson.decode(v)
if e.s ~= ARGV[2] or (ARGV[3] ~= '' and e.n ~= ARGV[3]) then return false end
redis.call('HDEL', KEYS[1], ARGV[1])
return e.n
`)

// removeExactScript deletes field ARGV[1] only if it still holds exactly
// ARGV[2], so cleaning up a dead entry never removes a newer one.
var removeExactScript = goredis.NewScript(`
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
`)

func newEpoch() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// acquire returns node's live epoch, taking a lease if it has none.
func (r *Registry) acquire(ctx context.Context, node string) (string, error) {
	epoch, err := acquireScript.Run(ctx, r.c, []string{r.leaseKey(node)}, newEpoch(), r.cfg.TTL.Milliseconds()).Text()
	if err != nil {
		return "", err
	}
	r.mu.Lock()
	if prev, ok := r.mu.own[node]; ok && prev != epoch {
		// The lease lapsed between two calls: entries of the old epoch are
		// gone while their connections may still be open.
		r.mu.lost[node] = true
	}
	r.mu.own[node] = epoch
	r.mu.Unlock()
	return epoch, nil
}

func (r *Registry) Register(ctx context.Context, e registry.Entry) (*registry.Entry, error) {
	epoch, err := r.acquire(ctx, e.Node)
	if err != nil {
		return nil, fmt.Errorf("redis: register: lease: %w", err)
	}
	val, err := json.Marshal(stored{Node: e.Node, Session: e.Session, Since: e.Since, Epoch: epoch})
	if err != nil {
		return nil, fmt.Errorf("redis: register: %w", err)
	}
	p := r.c.Pipeline()
	// Pipelined scripts go by EVAL: EVALSHA's fallback on NOSCRIPT (Redis
	// restarted, cache flushed) cannot happen inside a pipeline.
	swap := registerScript.Eval(ctx, p, []string{r.userKey(e.User)}, e.Device, val)
	// The index outlives the lease so DropNode can still find every entry.
	p.SAdd(ctx, r.nodeKey(e.Node), member(e.User, e.Device, e.Session))
	p.PExpire(ctx, r.nodeKey(e.Node), 2*r.cfg.TTL)
	if err := exec(ctx, p); err != nil {
		return nil, fmt.Errorf("redis: register: %w", err)
	}
	raw, err := swap.Text()
	if errors.Is(err, goredis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("redis: register: %w", err)
	}
	var old stored
	if err := json.Unmarshal([]byte(raw), &old); err != nil {
		return nil, fmt.Errorf("redis: register: decode replaced entry: %w", err)
	}
	if old.Session == e.Session && old.Node == e.Node {
		return nil, nil
	}
	if err := r.c.SRem(ctx, r.nodeKey(old.Node), member(e.User, e.Device, old.Session)).Err(); err != nil {
		r.cfg.Logger.Debug("registry index cleanup failed", "node", old.Node, "err", err)
	}
	// A replaced entry of a dead node has no connection left to close.
	live, err := r.alive(ctx, old.Node, old.Epoch, epoch, e.Node)
	if err != nil {
		return nil, fmt.Errorf("redis: register: %w", err)
	}
	if !live {
		return nil, nil
	}
	return &registry.Entry{User: e.User, Device: e.Device, Node: old.Node, Session: old.Session, Since: old.Since}, nil
}

// alive reports whether an entry of node with epoch is still live; ourEpoch
// is the epoch just acquired for ourNode and spares a round trip.
func (r *Registry) alive(ctx context.Context, node, epoch, ourEpoch, ourNode string) (bool, error) {
	if node == ourNode {
		return epoch == ourEpoch, nil
	}
	cur, err := r.c.Get(ctx, r.leaseKey(node)).Result()
	if errors.Is(err, goredis.Nil) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return cur == epoch, nil
}

func (r *Registry) Unregister(ctx context.Context, user, device, session string) error {
	node, err := removeScript.Run(ctx, r.c, []string{r.userKey(user)}, device, session, "").Text()
	if errors.Is(err, goredis.Nil) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("redis: unregister: %w", err)
	}
	if err := r.c.SRem(ctx, r.nodeKey(node), member(user, device, session)).Err(); err != nil {
		return fmt.Errorf("redis: unregister: index: %w", err)
	}
	return nil
}

// Lookup costs one pipelined round trip for the users' hashes and, unless
// every node's lease is cached, one more for the leases.
func (r *Registry) Lookup(ctx context.Context, users []string) (map[string][]registry.Entry, error) {
	out, _, err := r.LookupDead(ctx, users)
	return out, err
}

// LookupDead is Lookup that also returns the users of which it found (and
// deleted) entries of a dead node: a gateway that died without
// unregistering them. Presence records their last seen then, since the
// dead gateway could not.
func (r *Registry) LookupDead(ctx context.Context, users []string) (map[string][]registry.Entry, []string, error) {
	out := make(map[string][]registry.Entry)
	if len(users) == 0 {
		return out, nil, nil
	}
	p := r.c.Pipeline()
	cmds := make([]*goredis.MapStringStringCmd, len(users))
	for i, u := range users {
		cmds[i] = p.HGetAll(ctx, r.userKey(u))
	}
	if _, err := p.Exec(ctx); err != nil {
		return nil, nil, fmt.Errorf("redis: lookup: %w", err)
	}
	var all []found
	for i, cmd := range cmds {
		for dev, raw := range cmd.Val() {
			var s stored
			if err := json.Unmarshal([]byte(raw), &s); err != nil {
				return nil, nil, fmt.Errorf("redis: lookup: decode entry of %q: %w", users[i], err)
			}
			all = append(all, found{user: users[i], device: dev, raw: raw, s: s})
		}
	}
	if len(all) == 0 {
		return out, nil, nil
	}
	epochs, fresh, err := r.leases(ctx, all)
	if err != nil {
		return nil, nil, fmt.Errorf("redis: lookup: %w", err)
	}
	var dead []found
	for _, f := range all {
		if epochs[f.s.Node] == f.s.Epoch {
			out[f.user] = append(out[f.user], registry.Entry{User: f.user, Device: f.device, Node: f.s.Node, Session: f.s.Session, Since: f.s.Since})
			continue
		}
		// Only a lease read just now proves death: a cached one may predate
		// the node's new epoch.
		if fresh[f.s.Node] {
			dead = append(dead, f)
		}
	}
	var deadUsers []string
	if len(dead) > 0 {
		for _, f := range dead {
			if len(deadUsers) == 0 || deadUsers[len(deadUsers)-1] != f.user {
				deadUsers = append(deadUsers, f.user)
			}
		}
		p := r.c.Pipeline()
		for _, f := range dead {
			removeExactScript.Eval(ctx, p, []string{r.userKey(f.user)}, f.device, f.raw)
			p.SRem(ctx, r.nodeKey(f.s.Node), member(f.user, f.device, f.s.Session))
		}
		if _, err := p.Exec(ctx); err != nil {
			r.cfg.Logger.Debug("registry dead entry cleanup failed", "entries", len(dead), "err", err)
		}
	}
	return out, deadUsers, nil
}

// Epochs returns the current lease epoch of each node, "" for a node
// without a lease (dead, or never started): one pipelined round trip.
// Presence compares them over time to notice a gateway that died or
// restarted without unregistering its users.
func (r *Registry) Epochs(ctx context.Context, nodes []string) (map[string]string, error) {
	out := make(map[string]string, len(nodes))
	if len(nodes) == 0 {
		return out, nil
	}
	p := r.c.Pipeline()
	cmds := make([]*goredis.StringCmd, len(nodes))
	for i, n := range nodes {
		cmds[i] = p.Get(ctx, r.leaseKey(n))
	}
	if err := exec(ctx, p); err != nil {
		return nil, fmt.Errorf("redis: epochs: %w", err)
	}
	for i, n := range nodes {
		out[n] = cmds[i].Val() // "" when missing
	}
	return out, nil
}

// exec runs a pipeline and returns the first error of any command, where a
// nil reply (a script returning false, GET of a missing key) is no error.
func exec(ctx context.Context, p goredis.Pipeliner) error {
	cmds, err := p.Exec(ctx)
	if err == nil {
		return nil
	}
	for _, c := range cmds {
		if err := c.Err(); err != nil && !errors.Is(err, goredis.Nil) {
			return err
		}
	}
	if errors.Is(err, goredis.Nil) {
		return nil
	}
	return err
}

// found is one entry read by Lookup.
type found struct {
	user, device, raw string
	s                 stored
}

// leases returns the current epoch of each node the entries name ("" for a
// node without lease) and which nodes were read from Redis just now. A cached
// epoch is used only when it matches the entry's, so a stale cache can make a
// dead entry look live for LeaseCache but never a live one look dead.
func (r *Registry) leases(ctx context.Context, all []found) (map[string]string, map[string]bool, error) {
	epochs := make(map[string]string)
	fresh := make(map[string]bool)
	var ask []string
	now := time.Now()
	r.mu.Lock()
	for _, f := range all {
		node := f.s.Node
		if _, ok := epochs[node]; ok || fresh[node] {
			continue
		}
		if c, ok := r.mu.seen[node]; ok && c.epoch == f.s.Epoch && now.Sub(c.at) < r.cfg.LeaseCache {
			epochs[node] = c.epoch
			continue
		}
		fresh[node] = true
		ask = append(ask, node)
	}
	r.mu.Unlock()
	if len(ask) == 0 {
		return epochs, fresh, nil
	}
	p := r.c.Pipeline()
	cmds := make([]*goredis.StringCmd, len(ask))
	for i, n := range ask {
		cmds[i] = p.Get(ctx, r.leaseKey(n))
	}
	if err := exec(ctx, p); err != nil {
		return nil, nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, n := range ask {
		v, err := cmds[i].Result()
		if errors.Is(err, goredis.Nil) {
			epochs[n] = ""
			delete(r.mu.seen, n)
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		epochs[n] = v
		if r.cfg.LeaseCache > 0 {
			r.mu.seen[n] = seenLease{epoch: v, at: now}
		}
	}
	return epochs, fresh, nil
}

// Refresh extends node's lease by TTL. It returns ErrLeaseLost when the lease
// this process held lapsed or was dropped since the last Refresh, even if a
// Register has taken a new one meanwhile: entries of the old lease are gone
// (see the package doc). A node that holds no lease yet takes one.
func (r *Registry) Refresh(ctx context.Context, node string) error {
	r.mu.Lock()
	epoch, ok := r.mu.own[node]
	r.mu.Unlock()
	if !ok {
		if _, err := r.acquire(ctx, node); err != nil {
			return fmt.Errorf("redis: refresh: %w", err)
		}
		return nil
	}
	p := r.c.Pipeline()
	ext := refreshScript.Eval(ctx, p, []string{r.leaseKey(node)}, epoch, r.cfg.TTL.Milliseconds())
	p.PExpire(ctx, r.nodeKey(node), 2*r.cfg.TTL)
	if _, err := p.Exec(ctx); err != nil {
		return fmt.Errorf("redis: refresh: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if n, _ := ext.Int(); n != 1 {
		if r.mu.own[node] == epoch {
			delete(r.mu.own, node)
		}
		delete(r.mu.lost, node)
		return fmt.Errorf("redis: refresh %q: %w", node, ErrLeaseLost)
	}
	if r.mu.lost[node] {
		delete(r.mu.lost, node)
		return fmt.Errorf("redis: refresh %q: %w (a new lease was taken since)", node, ErrLeaseLost)
	}
	return nil
}

// restoreScript writes entry ARGV[2] at field ARGV[1] unless the field
// holds another node's (ARGV[3]) entry: a restore never displaces a
// connection made elsewhere meanwhile.
var restoreScript = goredis.NewScript(`
local v = redis.call('HGET', KEYS[1], ARGV[1])
if v and cjson.decode(v).n ~= ARGV[3] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
`)

// Restore registers again the live connections of a node whose lease was
// lost while they stayed open (a Redis failover that lost the lease, or a
// Redis restarted without its data): it takes a new lease and writes each
// entry under it, in pipelines of 512, skipping a device now registered
// by another node. It returns the users whose entries it wrote. The
// next Refresh then keeps the new lease.
func (r *Registry) Restore(ctx context.Context, node string, entries []registry.Entry) ([]string, error) {
	epoch, err := r.acquire(ctx, node)
	if err != nil {
		return nil, fmt.Errorf("redis: restore: lease: %w", err)
	}
	r.mu.Lock()
	delete(r.mu.lost, node) // the entries come back under this epoch
	r.mu.Unlock()
	var users []string
	for len(entries) > 0 {
		n := min(len(entries), 512)
		chunk := entries[:n]
		entries = entries[n:]
		p := r.c.Pipeline()
		cmds := make([]*goredis.Cmd, len(chunk))
		for i, e := range chunk {
			val, _ := json.Marshal(stored{Node: node, Session: e.Session, Since: e.Since, Epoch: epoch})
			cmds[i] = restoreScript.Eval(ctx, p, []string{r.userKey(e.User)}, e.Device, val, node)
			p.SAdd(ctx, r.nodeKey(node), member(e.User, e.Device, e.Session))
		}
		p.PExpire(ctx, r.nodeKey(node), 2*r.cfg.TTL)
		if err := exec(ctx, p); err != nil {
			return users, fmt.Errorf("redis: restore: %w", err)
		}
		for i, c := range cmds {
			if n, _ := c.Int(); n == 1 {
				users = append(users, chunk[i].User)
			}
		}
	}
	return users, nil
}

// DropNode ends node's lease, which makes all its entries invisible at once,
// then deletes them through the node's index. Entries that replaced one of
// the node's entries in the meantime are kept.
func (r *Registry) DropNode(ctx context.Context, node string) error {
	_, err := r.DropNodeUsers(ctx, node)
	return err
}

// DropNodeUsers is DropNode that returns the users whose entries it
// deleted (each once), so that a gateway starting under the name of one
// that died can announce them offline.
func (r *Registry) DropNodeUsers(ctx context.Context, node string) ([]string, error) {
	if err := r.c.Del(ctx, r.leaseKey(node)).Err(); err != nil {
		return nil, fmt.Errorf("redis: drop node: %w", err)
	}
	r.mu.Lock()
	delete(r.mu.own, node)
	delete(r.mu.lost, node)
	delete(r.mu.seen, node)
	r.mu.Unlock()
	var dropped []string
	seen := make(map[string]bool)
	var cursor uint64
	for {
		members, next, err := r.c.SScan(ctx, r.nodeKey(node), cursor, "", 512).Result()
		if err != nil {
			return nil, fmt.Errorf("redis: drop node: scan: %w", err)
		}
		if len(members) > 0 {
			p := r.c.Pipeline()
			var users []string
			var cmds []*goredis.Cmd
			for _, m := range members {
				parts := strings.SplitN(m, "\x00", 3)
				if len(parts) != 3 {
					continue
				}
				users = append(users, parts[0])
				cmds = append(cmds, removeScript.Eval(ctx, p, []string{r.userKey(parts[0])}, parts[1], parts[2], node))
			}
			if err := exec(ctx, p); err != nil {
				return nil, fmt.Errorf("redis: drop node: %w", err)
			}
			for i, c := range cmds {
				if c.Val() != nil && !seen[users[i]] {
					seen[users[i]] = true
					dropped = append(dropped, users[i])
				}
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	if err := r.c.Del(ctx, r.nodeKey(node)).Err(); err != nil {
		return nil, fmt.Errorf("redis: drop node: %w", err)
	}
	return dropped, nil
}
