// Package memory is the in-process session registry used by the embedded
// single-process mode. All methods are safe for concurrent use; one mutex
// guards the map (registry writes happen once per connect/disconnect, far
// below what a mutex sustains).
package memory

import (
	"context"

	"sync"

	"github.com/parley-im/parley/internal/registry"
)

// Registry is an in-memory registry.Registry.
type Registry struct {
	mu struct {
		sync.RWMutex
		users map[string]map[string]registry.Entry // user → device → entry
	}
}

var _ registry.Registry = (*Registry)(nil)

// New returns an empty registry.
func New() *Registry {
	r := &Registry{}
	r.mu.users = make(map[string]map[string]registry.Entry)
	return r
}

func (r *Registry) Register(_ context.Context, e registry.Entry) (*registry.Entry, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	devs := r.mu.users[e.User]
	if devs == nil {
		devs = make(map[string]registry.Entry, 1)
		r.mu.users[e.User] = devs
	}
	old, had := devs[e.Device]
	devs[e.Device] = e
	if had && (old.Session != e.Session || old.Node != e.Node) {
		return &old, nil
	}
	return nil, nil
}

func (r *Registry) Unregister(_ context.Context, user, device, session string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	devs := r.mu.users[user]
	if e, ok := devs[device]; ok && e.Session == session {
		delete(devs, device)
		if len(devs) == 0 {
			delete(r.mu.users, user)
		}
	}
	return nil
}

func (r *Registry) Lookup(_ context.Context, users []string) (map[string][]registry.Entry, error) {
	out := make(map[string][]registry.Entry)
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, u := range users {
		devs := r.mu.users[u]
		if len(devs) == 0 {
			continue
		}
		es := make([]registry.Entry, 0, len(devs))
		for _, e := range devs {
			es = append(es, e)
		}
		out[u] = es
	}
	return out, nil
}

func (r *Registry) DropNode(_ context.Context, node string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for u, devs := range r.mu.users {
		for d, e := range devs {
			if e.Node == node {
				delete(devs, d)
			}
		}
		if len(devs) == 0 {
			delete(r.mu.users, u)
		}
	}
	return nil
}
