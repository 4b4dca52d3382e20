// Package bus carries work from the chat service to gateway nodes: one
// Delivery per (message, node) with the node's local recipients, so a group
// message crosses the network once per gateway, not once per member.
//
// Bus is the engine seam; bus/local is the in-process engine and every engine
// passes bus/bustest. Implementations are safe for concurrent use.
package bus

import (
	"context"
	"errors"
)

// ErrNoSubscriber means no gateway is subscribed for the node: the recipients
// there are not reachable right now and will catch up by sync.
var ErrNoSubscriber = errors.New("bus: no subscriber for node")

// ErrStale means the node does not hold the group list a delivery names
// (Group.List): it restarted, evicted the list, or never received it. The
// publisher sends the delivery again with the list.
var ErrStale = errors.New("bus: the node does not hold the group list named")

// Delivery is one push batch for one gateway node.
type Delivery struct {
	// Users receive Frame on every connection they have on the node.
	Users []string
	// Frame is an encoded server frame, written to each connection as-is.
	Frame []byte
	// ConvID and Seq identify a message push the gateway tracks until the
	// device acknowledges it; zero for frames that need no ack (receipts).
	ConvID uint64
	Seq    uint64
	// CoalesceKey marks a state update: a newer push with the same
	// conversation and key supersedes an older one still waiting for its
	// ack, which is then never re-sent.
	CoalesceKey string
	// Untracked marks a message push the gateway writes and forgets: no
	// re-send, no acknowledgement expected (a large group's: its devices
	// find what they missed by seq).
	Untracked bool
	// Kick, when set, asks the node to close a replaced session instead.
	Kick *Kick
	// Group, when set, addresses the delivery to the node's list of the
	// online members of conversation ConvID instead of Users: the list
	// the node holds under Group.List, or the one the delivery carries.
	Group *Group
}

// Group names the list of a group's members online on one node that a
// delivery goes to. The publisher (the conversation's owner) numbers each
// version of its lists; a node keeps the last list it was sent per group
// and writes a delivery to those of its members whose join_seq is at or
// below the delivery's Seq. A delivery without Members that names a list
// the node does not hold is refused with ErrStale, never guessed at.
type Group struct {
	// List identifies the version of the list: unique across publishers
	// and restarts (a publisher's random prefix and a counter).
	List string
	// Full says Members is the whole list (possibly empty), which replaces
	// what the node holds for the group.
	Full    bool
	Members []Member
}

// Member is one entry of a group list.
type Member struct {
	User    string
	JoinSeq uint64
}

// Kick names a session to close because the same user and device connected
// again (possibly on another node). With Code set it is an operator's
// disconnect instead: every session of User (of Device, if set) on the
// node is closed with Code.
type Kick struct {
	User, Device, Session string
	Code                  int
}

// Handler consumes deliveries for a node. It must not block for long: it
// runs on the bus's delivery path. An error (ErrStale) is the publisher's
// Publish error.
type Handler func(Delivery) error

// Bus routes deliveries to the node that holds the recipients.
type Bus interface {
	// Publish hands d to node's subscriber; the handler's error is
	// returned (errors.Is holds for ErrStale).
	Publish(ctx context.Context, node string, d Delivery) error
	// Subscribe registers h for node until the returned cancel is called.
	Subscribe(ctx context.Context, node string, h Handler) (cancel func(), err error)
}
