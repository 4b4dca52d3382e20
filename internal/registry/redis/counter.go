package redis

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"

	goredis "github.com/redis/go-redis/v9"
)

// Counter is a family of named 64-bit counters, one per conversation (seq
// hints, unread counts). Next is Redis INCR; Set raises a counter to at least
// a value, never lowers it, so a stale writer cannot move a hint backwards.
// Values stay within Redis integers: 0..math.MaxInt64.
type Counter struct {
	c      goredis.UniversalClient
	prefix string
}

// NewCounter returns the counters named name (e.g. "seq", "unread") under
// prefix ("" means "parley:"); the caller owns c.
func NewCounter(c goredis.UniversalClient, prefix, name string) (*Counter, error) {
	if name == "" {
		return nil, errors.New("redis: counter: empty name")
	}
	if prefix == "" {
		prefix = "parley:"
	}
	return &Counter{c: c, prefix: prefix + name + ":"}, nil
}

func (c *Counter) key(conv uint64) string { return c.prefix + strconv.FormatUint(conv, 10) }

// Next increments conv's counter and returns the new value (1 for a new one).
func (c *Counter) Next(ctx context.Context, conv uint64) (uint64, error) {
	v, err := c.c.Incr(ctx, c.key(conv)).Result()
	if err != nil {
		return 0, fmt.Errorf("redis: counter next: %w", err)
	}
	return uint64(v), nil
}

// Get returns conv's counter, 0 when it was never set.
func (c *Counter) Get(ctx context.Context, conv uint64) (uint64, error) {
	v, err := c.c.Get(ctx, c.key(conv)).Uint64()
	if errors.Is(err, goredis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("redis: counter get: %w", err)
	}
	return v, nil
}

// maxScript sets KEYS[1] to ARGV[1] if that is larger and returns the result.
// Lua numbers are doubles, exact only to 2^53, so the decimal strings are
// compared by length, then bytewise (neither has leading zeros).
var maxScript = goredis.NewScript(`
local cur = redis.call('GET', KEYS[1])
local v = ARGV[1]
if cur and (#cur > #v or (#cur == #v and cur >= v)) then return cur end
redis.call('SET', KEYS[1], v)
return v
`)

// Set raises conv's counter to v if it is below and returns the counter's
// value afterwards (v or the larger value it already had).
func (c *Counter) Set(ctx context.Context, conv, v uint64) (uint64, error) {
	if v > math.MaxInt64 {
		return 0, fmt.Errorf("redis: counter set: %d exceeds the Redis integer range", v)
	}
	s, err := maxScript.Run(ctx, c.c, []string{c.key(conv)}, strconv.FormatUint(v, 10)).Text()
	if err != nil {
		return 0, fmt.Errorf("redis: counter set: %w", err)
	}
	got, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("redis: counter set: stored value %q: %w", s, err)
	}
	return got, nil
}
