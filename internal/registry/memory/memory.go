// Package memory is the in-process session registry used by the embedded
// single-process mode. All methods are safe for concurrent use; one mutex
// guards the map (registry writes happen once per connect/disconnect, far
// below what a mutex sustains).
//
// A user's devices are a small slice, not a map: users have a handful of
// devices, and an inner map would cost most of an idle connection's memory.
// A stored slice is never modified (every change stores a new one), so
// Lookup hands out the stored slices themselves: a fan-out to 10,000 users
// copies no entries.
package memory

import (
	"context"
	"slices"
	"sync"

	"github.com/parley-im/parley/internal/registry"
)

// Registry is an in-memory registry.Registry.
type Registry struct {
	mu struct {
		sync.RWMutex
		users map[string][]registry.Entry // user → its online devices
	}
}

var _ registry.Registry = (*Registry)(nil)

// New returns an empty registry.
func New() *Registry {
	r := &Registry{}
	r.mu.users = make(map[string][]registry.Entry)
	return r
}

func (r *Registry) Register(_ context.Context, e registry.Entry) (*registry.Entry, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	devs := r.mu.users[e.User]
	for i, old := range devs {
		if old.Device == e.Device {
			devs = slices.Clone(devs)
			devs[i] = e
			r.mu.users[e.User] = devs
			if old.Session != e.Session || old.Node != e.Node {
				return &old, nil
			}
			return nil, nil
		}
	}
	r.mu.users[e.User] = append(devs[:len(devs):len(devs)], e)
	return nil, nil
}

func (r *Registry) Unregister(_ context.Context, user, device, session string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	devs := r.mu.users[user]
	for i, e := range devs {
		if e.Device == device && e.Session == session {
			r.set(user, slices.Delete(slices.Clone(devs), i, i+1))
			return nil
		}
	}
	return nil
}

// set stores devs for user, dropping users without devices.
func (r *Registry) set(user string, devs []registry.Entry) {
	if len(devs) == 0 {
		delete(r.mu.users, user)
		return
	}
	r.mu.users[user] = devs
}

// Lookup returns the stored slices, which are never modified: callers must
// not modify them either.
func (r *Registry) Lookup(_ context.Context, users []string) (map[string][]registry.Entry, error) {
	out := make(map[string][]registry.Entry, len(users))
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, u := range users {
		if devs := r.mu.users[u]; len(devs) > 0 {
			out[u] = devs
		}
	}
	return out, nil
}

func (r *Registry) DropNode(_ context.Context, node string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for u, devs := range r.mu.users {
		if slices.ContainsFunc(devs, func(e registry.Entry) bool { return e.Node == node }) {
			r.set(u, slices.DeleteFunc(slices.Clone(devs), func(e registry.Entry) bool { return e.Node == node }))
		}
	}
	return nil
}
