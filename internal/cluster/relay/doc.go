// Package relay shares presence and group membership changes between
// cluster mode's processes over core NATS (Relay), with periodic full
// resynchronisation from the gateways.
//
// Relay is safe for concurrent use; its Run owns the goroutines it starts
// and returns when they have stopped.
package relay
