package gateway

import (
	"github.com/parley-im/parley/internal/registry"
)

// Registered returns the registry entries of this node's open sessions
// that have registered (cluster mode calls it to register them again when
// the registry lost the node's lease while they stayed open, so they keep
// receiving pushes without reconnecting).
func (g *Gateway) Registered() []registry.Entry {
	var out []registry.Entry
	g.each(func(s *session) {
		if s.present.Load() && !s.closed.Load() {
			out = append(out, registry.Entry{User: s.user, Device: s.device, Node: g.cfg.Node, Session: s.id, Since: s.opened.UnixMilli()})
		}
	})
	return out
}
