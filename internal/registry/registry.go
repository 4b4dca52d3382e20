// Package registry is the session registry: which gateway node holds each
// online device of each user (user → device → node). The chat service reads
// it to route pushes; gateways write it on connect and disconnect.
//
// Registry is the engine seam; the in-memory engine is registry/memory and
// every engine passes registry/registrytest. Implementations are safe for
// concurrent use.
package registry

import "context"

// Entry is one online device.
type Entry struct {
	User    string
	Device  string
	Node    string // gateway node holding the connection
	Session string // connection id, unique per node
	Since   int64  // unix ms of the connect
}

// Registry maps users to their online devices.
type Registry interface {
	// Register records e as the live connection of (e.User, e.Device). If
	// another session held that device, it is returned so the caller can
	// close it; the new entry wins.
	Register(ctx context.Context, e Entry) (replaced *Entry, err error)
	// Unregister removes (user, device) only if it is still held by
	// session, so a late disconnect never removes a newer connection.
	Unregister(ctx context.Context, user, device, session string) error
	// Lookup returns the online devices of each user that has any. The
	// slices may be shared with the registry: callers must not modify them.
	Lookup(ctx context.Context, users []string) (map[string][]Entry, error)
	// DropNode removes every entry of node (a gateway that stopped).
	DropNode(ctx context.Context, node string) error
}
