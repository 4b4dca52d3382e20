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
	// Kick, when set, asks the node to close a replaced session instead.
	Kick *Kick
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
// runs on the bus's delivery path.
type Handler func(Delivery)

// Bus routes deliveries to the node that holds the recipients.
type Bus interface {
	// Publish hands d to node's subscriber.
	Publish(ctx context.Context, node string, d Delivery) error
	// Subscribe registers h for node until the returned cancel is called.
	Subscribe(ctx context.Context, node string, h Handler) (cancel func(), err error)
}
