package gateway

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/parley-im/parley/internal/bus"
)

func groupGateway(t *testing.T) *Gateway {
	g := testGateway(t)
	for i := range g.groups {
		g.groups[i].m = make(map[uint64]*groupList)
	}
	return g
}

// TestGroupListsByVersion: a delivery carrying a list installs it and goes
// to its members whose join_seq is at or below the delivery's seq; one
// naming the held version uses it; one naming another version, or any
// version after a restart or an eviction, is refused with bus.ErrStale.
func TestGroupListsByVersion(t *testing.T) {
	g := groupGateway(t)
	full := bus.Delivery{ConvID: 9, Seq: 10, Group: &bus.Group{List: "p.1", Full: true,
		Members: []bus.Member{{User: "a", JoinSeq: 1}, {User: "b", JoinSeq: 10}, {User: "late", JoinSeq: 12}}}}
	users, err := g.groupRecipients(full, 1000)
	if err != nil || !slices.Equal(users, []string{"a", "b"}) {
		t.Fatalf("with the list: %v, %v; want [a b] (late joins after seq 10)", users, err)
	}
	users, err = g.groupRecipients(bus.Delivery{ConvID: 9, Seq: 12, Group: &bus.Group{List: "p.1"}}, 1000)
	if err != nil || !slices.Equal(users, []string{"a", "b", "late"}) {
		t.Fatalf("by version at seq 12: %v, %v; want [a b late]", users, err)
	}
	if _, err := g.groupRecipients(bus.Delivery{ConvID: 9, Seq: 13, Group: &bus.Group{List: "p.2"}}, 1000); !errors.Is(err, bus.ErrStale) {
		t.Fatalf("another version: err %v, want ErrStale", err)
	}
	if _, err := g.groupRecipients(bus.Delivery{ConvID: 8, Seq: 13, Group: &bus.Group{List: "p.1"}}, 1000); !errors.Is(err, bus.ErrStale) {
		t.Fatalf("another group: err %v, want ErrStale", err)
	}
	// A removal is a new version without the member.
	users, err = g.groupRecipients(bus.Delivery{ConvID: 9, Seq: 14, Group: &bus.Group{List: "p.3", Full: true,
		Members: []bus.Member{{User: "a", JoinSeq: 1}}}}, 2000)
	if err != nil || !slices.Equal(users, []string{"a"}) {
		t.Fatalf("after a removal: %v, %v; want [a]", users, err)
	}
	if _, err := g.groupRecipients(bus.Delivery{ConvID: 9, Seq: 15, Group: &bus.Group{List: "p.1"}}, 2000); !errors.Is(err, bus.ErrStale) {
		t.Fatalf("the replaced version: err %v, want ErrStale", err)
	}
	// Unused lists go; the next delivery is refused and the owner resends.
	g.sweepGroups(1500)
	if n := g.GroupLists(); n != 1 {
		t.Fatalf("%d lists after sweeping nothing idle, want 1", n)
	}
	g.sweepGroups(3000)
	if n := g.GroupLists(); n != 0 {
		t.Fatalf("%d lists after sweeping idle ones, want 0", n)
	}
	if _, err := g.groupRecipients(bus.Delivery{ConvID: 9, Seq: 16, Group: &bus.Group{List: "p.3"}}, 4000); !errors.Is(err, bus.ErrStale) {
		t.Fatalf("after eviction: err %v, want ErrStale", err)
	}
}

// TestGroupDeliveryReachesLocalSessions: a group delivery is written to the
// local sessions of the list's users, once each.
func TestGroupDeliveryReachesLocalSessions(t *testing.T) {
	g := groupGateway(t)
	g.pushes = make(chan queued, 4)
	g.ctx = context.Background()
	_, ra := g.testSession("a")
	_, rb := g.testSession("b")
	_, rc := g.testSession("c") // not in the list
	d := bus.Delivery{ConvID: 9, Seq: 3, Frame: []byte(`{"s":3}`), Group: &bus.Group{List: "p.1", Full: true,
		Members: []bus.Member{{User: "a", JoinSeq: 1}, {User: "b", JoinSeq: 1}, {User: "gone", JoinSeq: 1}}}}
	if err := g.deliver(d); err != nil {
		t.Fatal(err)
	}
	g.writeBatch([]queued{<-g.pushes})
	if len(ra.calls) != 1 || len(rb.calls) != 1 || len(rc.calls) != 0 {
		t.Fatalf("writes: a %v, b %v, c %v; want one each to a and b", ra.calls, rb.calls, rc.calls)
	}
	if err := g.deliver(bus.Delivery{ConvID: 9, Seq: 4, Frame: []byte(`{}`), Group: &bus.Group{List: "p.0"}}); !errors.Is(err, bus.ErrStale) {
		t.Fatalf("stale delivery: %v, want ErrStale", err)
	}
	if len(g.pushes) != 0 {
		t.Fatal("a refused delivery was queued")
	}
}
