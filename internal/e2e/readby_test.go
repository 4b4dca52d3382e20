package e2e

import (
	"fmt"
	"slices"
	"testing"

	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// TestReadBy: read_by counts, of the members who can see a message (its
// sender left out, later joiners too), those whose read position passed
// it, and names them up to chat.read_by_names — in a direct conversation,
// in each fan-out tier and in an E2E group; a conversation over
// chat.read_by_max_members answers too_large, a seq not stored or before
// the asker's join_seq bad_reference, a non-member not_member.
func TestReadBy(t *testing.T) {
	srv := servertest.Start(t, servertest.WithChat(func(c *chat.Config) {
		c.SmallBelow, c.LargeAbove, c.Hysteresis = 4, 6, 0.1
		c.ReadByMaxMembers, c.ReadByNames = 10, 4
	}))
	alice := dialRaw(t, srv, "alice", "phone")
	bob := dialRaw(t, srv, "bob", "phone")
	e2eGroup := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: "secret", Members: []string{"bob", "c1"}, E2E: true}), protocol.TypeConv).Conv.ConvID
	convs := []struct {
		name    string
		id      uint64
		e2e     bool
		members int // eligible: everyone but alice
		named   bool
	}{
		{"direct", alice.openDirect("bob"), false, 1, true},
		{"small", alice.createGroup("small", "bob", "c1"), false, 2, true},
		{"medium", alice.createGroup("medium", "bob", "c1", "c2"), false, 3, true},
		{"large", alice.createGroup("large", append([]string{"bob", "c1"}, users("u", 0, 5)...)...), false, 7, false},
		{"e2e group", e2eGroup, true, 2, true},
	}
	readBy := func(c *rawConn, conv, seq uint64) *protocol.Frame {
		t.Helper()
		return c.call(protocol.Frame{Type: protocol.TypeReadBy, ConvID: conv, Seq: seq})
	}
	for i, cv := range convs {
		t.Run(cv.name, func(t *testing.T) {
			body := "hello"
			if cv.e2e {
				body = e2eBody(body)
			}
			seq := mustOK(t, alice.sendText(cv.id, fmt.Sprint("rb-", i), body), protocol.TypeAck).Seq
			want := func(what string, n int, names []string) {
				t.Helper()
				rb := mustOK(t, readBy(alice, cv.id, seq), protocol.TypeReadBy).ReadBy
				if !cv.named {
					names = nil
				}
				if rb.ConvID != cv.id || rb.Seq != seq || rb.ReadCount != n || rb.MemberCount != cv.members || !slices.Equal(rb.Users, names) {
					t.Fatalf("%s: read_by = %+v, want %d of %d, users %v", what, rb, n, cv.members, names)
				}
			}
			want("unread", 0, nil)
			mustOK(t, bob.call(protocol.Frame{Type: protocol.TypeRead, ConvID: cv.id, Seq: seq}), protocol.TypeOK)
			want("read by bob", 1, []string{"bob"})
			if cv.name == "direct" {
				return
			}
			// c1 reads past it by sending (own messages raise the position).
			c1 := dialRaw(t, srv, "c1", "phone")
			defer c1.ws.Close()
			reply := "me too"
			if cv.e2e {
				reply = e2eBody(reply)
			}
			mustOK(t, c1.sendText(cv.id, fmt.Sprint("rb-c1-", i), reply), protocol.TypeAck)
			want("read by bob and c1", 2, []string{"bob", "c1"})
			// A member who joins later is not counted, and cannot ask.
			mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeAddMembers, ConvID: cv.id, Members: []string{"dave"}}), protocol.TypeConv)
			want("after a join", 2, []string{"bob", "c1"})
			dave := dialRaw(t, srv, "dave", "phone")
			defer dave.ws.Close()
			if r := readBy(dave, cv.id, seq); r.Code != protocol.CodeBadReference {
				t.Fatalf("read_by before join_seq answered %s %s, want bad_reference", r.Type, r.Code)
			}
			if r := readBy(alice, cv.id, seq+100); r.Code != protocol.CodeBadReference {
				t.Fatalf("read_by beyond the last seq answered %s %s, want bad_reference", r.Type, r.Code)
			}
		})
	}
	big := alice.createGroup("big", users("b", 0, 10)...)
	seq := mustOK(t, alice.sendText(big, "big-1", "hi"), protocol.TypeAck).Seq
	if r := readBy(alice, big, seq); r.Code != protocol.CodeTooLarge {
		t.Fatalf("read_by in a group of 11 answered %s %s, want too_large", r.Type, r.Code)
	}
	if r := readBy(bob, big, seq); r.Code != protocol.CodeNotMember {
		t.Fatalf("read_by of a non-member answered %s %s, want not_member", r.Type, r.Code)
	}
	if r := bob.call(protocol.Frame{Type: protocol.TypeReadBy, ConvID: big}); r.Code != protocol.CodeInvalidArgument {
		t.Fatalf("read_by without seq answered %s %s, want invalid_argument", r.Type, r.Code)
	}
}
