package limit

import (
	"context"
	"time"

	rredis "github.com/parley-im/parley/internal/registry/redis"
)

// Limiter is chat.Limiter on Redis: one event per key per interval across
// every chat process (a token bucket of burst 1).
type Limiter struct{ l *rredis.Limiter }

// New wraps a Redis token bucket.
func New(l *rredis.Limiter) *Limiter { return &Limiter{l: l} }

// Allow takes the key's token if the interval has passed.
func (l *Limiter) Allow(ctx context.Context, key string, every time.Duration) (bool, time.Duration, error) {
	if every <= 0 {
		return true, 0, nil
	}
	return l.l.Allow(ctx, key, float64(time.Second)/float64(every), 1)
}
