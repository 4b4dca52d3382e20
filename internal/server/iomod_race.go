//go:build race

package server

// stdServer under the race detector serves with net/http (a goroutine per
// connection; nbio's upgrader then reads each WebSocket with a buffer of
// its own). nbio's event loop hands connections from its accept goroutine
// to epoll through the kernel, a happens-before the race detector cannot
// see, so it reports races inside nbio (which marks that code //go:norace);
// and nbio's blocking mode shares pooled read buffers between connections,
// which corrupts frames under load (nbio issue #490, seen here). The
// gateway code is the same in both builds; scripts/test.sh also runs the
// end-to-end tests without -race, on the event loop.
const stdServer = true
