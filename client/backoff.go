package client

import (
	"math/rand/v2"
	"time"
)

// backoff computes reconnect and retry delays with "full jitter": the delay
// for attempt n is uniform in [0, min(max, min·2^n)). Full jitter spreads a
// crowd of clients that lost the same node across the whole window, which is
// what keeps a reconnect storm from arriving as one wave.
type backoff struct {
	min, max time.Duration
	// rnd returns a uniform value in [0, n); injected by tests.
	rnd func(n int64) int64
}

func newBackoff(min, max time.Duration) backoff {
	return backoff{min: min, max: max, rnd: rand.Int64N}
}

// ceiling is the upper bound of the window for attempt n.
func (b backoff) ceiling(attempt int) time.Duration {
	c := b.min
	for i := 0; i < attempt && c < b.max; i++ {
		c *= 2
	}
	if c > b.max || c <= 0 {
		c = b.max
	}
	return c
}

// delay returns the jittered delay for attempt n (0-based).
func (b backoff) delay(attempt int) time.Duration {
	c := b.ceiling(attempt)
	if c <= 0 {
		return 0
	}
	return time.Duration(b.rnd(int64(c)))
}

// after returns a delay the server asked for plus jitter of up to half of it
// (at least min), so that every client told "come back in 5s" does not come
// back at the same instant.
func (b backoff) after(asked time.Duration) time.Duration {
	spread := asked / 2
	if spread < b.min {
		spread = b.min
	}
	if spread <= 0 {
		return asked
	}
	return asked + time.Duration(b.rnd(int64(spread)))
}
