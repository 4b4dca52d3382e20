package relay

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/presence"
	"github.com/parley-im/parley/internal/registry"
	rredis "github.com/parley-im/parley/internal/registry/redis"
)

// heldRegistry is a Redis registry whose next LookupDead can be held
// after it has read, to order two reads of one user.
type heldRegistry struct {
	*rredis.Registry
	mu            sync.Mutex
	hold, holding chan struct{}
}

func (h *heldRegistry) LookupDead(ctx context.Context, users []string) (map[string][]registry.Entry, []string, error) {
	h.mu.Lock()
	hold, holding := h.hold, h.holding
	h.hold = nil
	h.mu.Unlock()
	on, died, err := h.Registry.LookupDead(ctx, users)
	if hold != nil {
		close(holding)
		<-hold
	}
	return on, died, err
}

// TestOlderReadDoesNotPlaceUser: a read of a user that returns after a
// newer one does not put back where the user was: the resync must reread
// the user when the gateway it is on now dies.
func TestOlderReadDoesNotPlaceUser(t *testing.T) {
	c := newCluster(t, time.Hour)
	ga, gb := c.gateway("gw-a"), c.gateway("gw-b")
	reg := &heldRegistry{Registry: c.registry()}
	x := c.process("chat-x", reg, nil)
	var (
		mu   sync.Mutex
		told int
	)
	x.Listen(func(_ presence.Scope, users []string) {
		if slices.Contains(users, "ann") {
			mu.Lock()
			told++
			mu.Unlock()
		}
	})
	toldN := func() int { mu.Lock(); defer mu.Unlock(); return told }
	x.Follow([]string{"ann"})
	ga.connect(t, "ann", "d1")

	ctx := context.Background()
	hold, holding := make(chan struct{}), make(chan struct{})
	reg.mu.Lock()
	reg.hold, reg.holding = hold, holding
	reg.mu.Unlock()
	older := make(chan error, 1)
	go func() { _, err := x.States(ctx, []string{"ann"}); older <- err }()
	<-holding // the older read found ann on gw-a
	ga.disconnect(t, "ann", "d1")
	gb.connect(t, "ann", "d2")
	st, err := x.States(ctx, []string{"ann"})
	if err != nil || !st["ann"].Online {
		t.Fatalf("newer read: %v, %+v", err, st)
	}
	close(hold)
	if err := <-older; err != nil {
		t.Fatal(err)
	}
	// The hints of the move have been told (or are on their way): wait
	// for them, then kill the gateway ann is on.
	for deadline := time.Now().Add(30 * time.Second); toldN() < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("hints of the move not told (%d)", toldN())
		}
		time.Sleep(10 * time.Millisecond)
	}
	before := toldN()
	gb.kill()
	// Its lease lapses within the registry TTL (2 s); the resync (every
	// 200 ms) must then tell ann's listeners to read ann again.
	for deadline := time.Now().Add(30 * time.Second); toldN() == before; {
		if time.Now().After(deadline) {
			t.Fatalf("gw-b died and ann, on it, was never read again (an older read placed ann on gw-a)")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
