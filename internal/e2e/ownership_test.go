package e2e

import (
	"testing"

	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// TestGroupAlwaysHasAnOwner: the owner cannot leave a group with other
// members until it hands the group over with set_role role owner; the
// transfer makes the old owner an admin. set_role on a non-member answers
// not_found, as mute and remove_members do.
func TestGroupAlwaysHasAnOwner(t *testing.T) {
	srv := servertest.Start(t)
	owner := dialRaw(t, srv, "owner", "d")
	heir := dialRaw(t, srv, "heir", "d")
	conv := owner.createGroup("g", "heir", "third")

	if r := owner.call(protocol.Frame{Type: protocol.TypeLeave, ConvID: conv}); r.Type != protocol.TypeError || r.Code != protocol.CodeForbidden {
		t.Fatalf("owner leaves: %s %s, want forbidden", r.Type, r.Code)
	}
	for _, f := range []protocol.Frame{
		{Type: protocol.TypeSetRole, ConvID: conv, UserID: "stranger", Role: protocol.RoleAdmin},
		{Type: protocol.TypeMute, ConvID: conv, UserID: "stranger", Muted: true},
		{Type: protocol.TypeRemove, ConvID: conv, Members: []string{"stranger"}},
	} {
		if r := owner.call(f); r.Type != protocol.TypeError || r.Code != protocol.CodeNotFound {
			t.Fatalf("%s on a non-member: %s %s, want not_found", f.Type, r.Type, r.Code)
		}
	}
	// A member may not take the group.
	if r := heir.call(protocol.Frame{Type: protocol.TypeSetRole, ConvID: conv, UserID: "heir", Role: protocol.RoleOwner}); r.Code != protocol.CodeForbidden {
		t.Fatalf("member takes ownership: %s %s, want forbidden", r.Type, r.Code)
	}

	c := mustOK(t, owner.call(protocol.Frame{Type: protocol.TypeSetRole, ConvID: conv, UserID: "heir", Role: protocol.RoleOwner}), protocol.TypeConv).Conv
	if c.Role != protocol.RoleAdmin {
		t.Fatalf("old owner's role after the transfer: %q, want admin", c.Role)
	}
	mustOK(t, owner.call(protocol.Frame{Type: protocol.TypeLeave, ConvID: conv}), protocol.TypeConv)
	// The new owner has the owner's rights.
	c = mustOK(t, heir.call(protocol.Frame{Type: protocol.TypeSetRole, ConvID: conv, UserID: "third", Role: protocol.RoleAdmin}), protocol.TypeConv).Conv
	if c.Role != protocol.RoleOwner {
		t.Fatalf("heir's role: %q, want owner", c.Role)
	}
	// The last member, the owner, may leave: nobody is left without one.
	mustOK(t, heir.call(protocol.Frame{Type: protocol.TypeRemove, ConvID: conv, Members: []string{"third"}}), protocol.TypeConv)
	mustOK(t, heir.call(protocol.Frame{Type: protocol.TypeLeave, ConvID: conv}), protocol.TypeConv)
}
