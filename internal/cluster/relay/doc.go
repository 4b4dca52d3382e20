// Package relay shares presence and group membership changes between
// cluster mode's processes over core NATS (Relay): numbered events,
// periodic digests, and a node's list (in chunks below the NATS max
// payload) only when a digest shows a view is off.
//
// Relay is safe for concurrent use; its Run owns the goroutines it starts
// and returns when they have stopped.
package relay
