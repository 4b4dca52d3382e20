package limit

import (
	"context"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Limiter is chat.Limiter on Redis: one event per key per interval across
// every chat process. Underneath is a token bucket per key: each bucket
// holds up to burst tokens and gains rate tokens per second; a call takes
// one. The arithmetic runs in a Lua script on the Redis server's clock, so
// processes with skewed clocks share one consistent bucket. An idle bucket
// expires once it would be full again.
type Limiter struct {
	c      goredis.UniversalClient
	prefix string
}

// New returns a limiter keeping buckets under prefix ("" means "parley:");
// the caller owns c.
func New(c goredis.UniversalClient, prefix string) *Limiter {
	if prefix == "" {
		prefix = "parley:"
	}
	return &Limiter{c: c, prefix: prefix + "rl:"}
}

// Allow takes the key's token if the interval has passed (a bucket of
// burst 1 refilled once per every).
func (l *Limiter) Allow(ctx context.Context, key string, every time.Duration) (bool, time.Duration, error) {
	if every <= 0 {
		return true, 0, nil
	}
	return l.take(ctx, key, float64(time.Second)/float64(every), 1)
}

// Take takes one of key's n tokens, refilled at n per period (a bucket of
// burst n refilled once per period/n).
func (l *Limiter) Take(ctx context.Context, key string, n int, per time.Duration) (bool, time.Duration, error) {
	if per <= 0 {
		return false, 0, fmt.Errorf("limit: period %v must be positive", per)
	}
	return l.take(ctx, key, float64(n)*float64(time.Second)/float64(per), n)
}

// bucketScript: KEYS[1] bucket; ARGV rate (tokens/s), burst. Time is in
// microseconds; unix µs (~1.8e15) is exact in a Lua double. It returns
// {allowed 0|1, µs until a token is available}.
var bucketScript = goredis.NewScript(`
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local b = redis.call('HMGET', KEYS[1], 'tk', 'ts')
local tokens = tonumber(b[1])
local ts = tonumber(b[2])
if tokens == nil or ts == nil then
  tokens = burst
  ts = now
end
if now > ts then
  tokens = math.min(burst, tokens + (now - ts) * rate / 1000000)
end
local ok, wait = 0, 0
if tokens >= 1 then
  tokens = tokens - 1
  ok = 1
else
  wait = math.ceil((1 - tokens) * 1000000 / rate)
end
redis.call('HSET', KEYS[1], 'tk', string.format('%.6f', tokens), 'ts', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) * 1000 / rate) + 1000)
return {ok, wait}
`)

// take takes a token from key's bucket. When none is left it returns false
// and how long until one will be.
func (l *Limiter) take(ctx context.Context, key string, rate float64, burst int) (ok bool, retryAfter time.Duration, err error) {
	if !(rate > 0) || burst < 1 {
		return false, 0, fmt.Errorf("limit: rate %v and burst %d must be positive", rate, burst)
	}
	res, err := bucketScript.Run(ctx, l.c, []string{l.prefix + key},
		strconv.FormatFloat(rate, 'g', -1, 64), burst).Int64Slice()
	if err != nil {
		return false, 0, fmt.Errorf("limit: redis: %w", err)
	}
	if len(res) != 2 {
		return false, 0, fmt.Errorf("limit: script returned %v", res)
	}
	return res[0] == 1, time.Duration(res[1]) * time.Microsecond, nil
}
