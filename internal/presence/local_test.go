package presence_test

import (
	"context"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/presence"
	"github.com/parley-im/parley/internal/presence/presencetest"
)

// TestLocalConformance runs the directory suite on the embedded node's
// in-memory directory.
func TestLocalConformance(t *testing.T) {
	presencetest.Run(t, func(t *testing.T, ttl time.Duration) presencetest.Deployment {
		l := presence.NewLocal(ttl, nil)
		ctx := context.Background()
		return presencetest.Deployment{A: l, B: l,
			Connect:    func(u, _ string) { l.Changed(ctx, u, true) },
			Disconnect: func(u, _ string) { l.Changed(ctx, u, false) },
		}
	})
}
