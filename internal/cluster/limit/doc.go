// Package limit is the chat service's rate limiter in cluster mode: one
// token bucket per key in Redis, shared by every chat process. Limiter is
// safe for concurrent use.
package limit
