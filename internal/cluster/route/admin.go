package route

import (
	"context"
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"

	natsio "github.com/nats-io/nats.go"

	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/cluster/lease"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// The server API in cluster mode. The API (internal/admin) runs on one
// chat process; a conversation's writes are accepted only by the chat
// process owning its partition. Admin forwards each conversation write to
// that owner, which runs it with the same chat/admin.go code as an
// embedded server: same permissions, same seqs.
//
// The envelope. A gateway's request (type request) carries a user, a
// device and a client frame; nothing in it can say "admin", and the chat
// process builds its Caller from User and Device only, so no client frame
// can claim the operator's authority. Server API writes travel in their
// own envelope (adminRequest) on their own subjects,
// <ns>.chat.admin.p.<partition>, which only chat processes publish to
// (gateway code has no path to them; a deployment can enforce it with NATS
// permissions: gateways publish to <ns>.chat.p.*, <ns>.chat.handle and
// <ns>.chat.maywatch only). The envelope names how the write acts:
//
//   - op "send": as a user or a bot (User, Device): exactly that user's
//     send, never the admin authority (chat.AdminSend refuses it);
//   - op "direct": an open_direct as User (no device), sent to the owner
//     of the pair's partition (store.DirectKey), as a gateway sends a
//     user's open_direct;
//   - ops "members", "moderate", "notice": with the admin authority, Actor
//     being the admin actor id of the API's configuration; the authority
//     is implied by the op, and each op admits only its own frame types.
//
// The answer (adminAnswer) is the conversation, the ack or the error, as
// the embedded call returns them. A write the owner refuses because the
// partition just moved answers with the Parley-Moved header, and the
// sender retries on the new owner (as the gateway's toOwner does).

// subjectAdminPart carries the server API's writes of partition p's
// conversations to the partition's owner.
func subjectAdminPart(ns string, p int) string { return ns + ".chat.admin.p." + strconv.Itoa(p) }

// Admin operations.
const (
	adminOpMembers  = "members"  // add_members, remove_members, set_role, mute with the admin authority
	adminOpModerate = "moderate" // edit, recall with the admin authority
	adminOpNotice   = "notice"   // a system message from the admin
	adminOpSend     = "send"     // a send as User/Device
	adminOpDirect   = "direct"   // open_direct as User (on the pair's owner)
)

// adminRequest is a server API write forwarded to a conversation's owner.
type adminRequest struct {
	Op     string          `json:"op"`
	Actor  string          `json:"actor,omitempty"`  // members, moderate, notice
	User   string          `json:"user,omitempty"`   // send
	Device string          `json:"device,omitempty"` // send
	Frame  json.RawMessage `json:"f,omitempty"`      // members, moderate, send
	ConvID uint64          `json:"conv,omitempty"`   // notice
	CMID   string          `json:"cmid,omitempty"`   // notice
	Text   string          `json:"text,omitempty"`   // notice
}

// adminAnswer is the owner's answer: one of Conv (members), Ack (the
// others) or Err.
type adminAnswer struct {
	Conv *protocol.ConvInfo `json:"conv,omitempty"`
	Ack  *protocol.Frame    `json:"ack,omitempty"`
	Err  *wireError         `json:"err,omitempty"`
}

type wireError struct {
	Code       protocol.Code `json:"code"`
	Msg        string        `json:"msg"`
	RetryAfter int64         `json:"retry_after_ms,omitempty"`
}

func toWire(e *protocol.Error) *wireError {
	if e == nil {
		return nil
	}
	return &wireError{Code: e.Code, Msg: e.Msg, RetryAfter: e.RetryAfter}
}

func (w *wireError) perr() *protocol.Error {
	if w == nil {
		return nil
	}
	return &protocol.Error{Code: w.Code, Msg: w.Msg, RetryAfter: w.RetryAfter}
}

// moving reports whether the answer refused the write because the
// conversation's partition moved away from the process that ran it.
func (a adminAnswer) moving() bool {
	return a.Err != nil && a.Err.Code == protocol.CodeOverloaded && a.Err.Msg == chat.MovingMsg
}

// adminOps are the frame types each op admits.
var adminOps = map[string]map[string]bool{
	adminOpMembers:  {protocol.TypeAddMembers: true, protocol.TypeRemove: true, protocol.TypeSetRole: true, protocol.TypeMute: true},
	adminOpModerate: {protocol.TypeEdit: true, protocol.TypeRecall: true},
	adminOpSend:     {protocol.TypeSend: true},
	adminOpDirect:   {protocol.TypeOpenDirect: true},
	adminOpNotice:   {},
}

// decodeAdmin reads and checks an adminRequest: a known op, valid ids, a
// frame of a type the op admits, validated against lim as the API
// validated it. It returns the frame (nil for a notice) and the key whose
// partition's owner runs it: the conversation the write goes to, or for a
// direct op the pair's store.DirectKey.
func decodeAdmin(data []byte, lim protocol.Limits) (adminRequest, *protocol.Frame, uint64, *protocol.Error) {
	var req adminRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return req, nil, 0, protocol.Errorf(protocol.CodeBadFrame, "undecodable admin request")
	}
	types, ok := adminOps[req.Op]
	if !ok {
		return req, nil, 0, protocol.Errorf(protocol.CodeBadFrame, "unknown admin op %q", truncateID(req.Op))
	}
	if req.Op == adminOpSend {
		if req.Actor != "" || !protocol.ValidID(req.User) || !protocol.ValidID(req.Device) {
			return req, nil, 0, protocol.Errorf(protocol.CodeBadFrame, "a send names a valid user and device, and no actor")
		}
	} else if req.Op == adminOpDirect {
		if req.Actor != "" || !protocol.ValidID(req.User) || req.Device != "" {
			return req, nil, 0, protocol.Errorf(protocol.CodeBadFrame, "a direct names a valid user, and no actor or device")
		}
	} else if !protocol.ValidID(req.Actor) || req.User != "" || req.Device != "" {
		return req, nil, 0, protocol.Errorf(protocol.CodeBadFrame, "an admin %s names a valid actor, and no user", req.Op)
	}
	if req.Op == adminOpNotice {
		if len(req.Frame) != 0 || req.ConvID == 0 || req.CMID == "" || len(req.CMID) > lim.MaxClientMsgID ||
			req.Text == "" || len(req.Text) > lim.MaxBodyBytes || !utf8.ValidString(req.Text) || !utf8.ValidString(req.CMID) {
			return req, nil, 0, protocol.Errorf(protocol.CodeBadFrame, "a notice takes conv, cmid and text")
		}
		return req, nil, req.ConvID, nil
	}
	if req.ConvID != 0 || req.CMID != "" || req.Text != "" {
		return req, nil, 0, protocol.Errorf(protocol.CodeBadFrame, "conv, cmid and text are for notices")
	}
	var f protocol.Frame
	if err := json.Unmarshal(req.Frame, &f); err != nil {
		return req, nil, 0, protocol.Errorf(protocol.CodeBadFrame, "undecodable frame in an admin request")
	}
	if !types[f.Type] || (f.ConvID == 0) != (req.Op == adminOpDirect) {
		return req, nil, 0, protocol.Errorf(protocol.CodeBadFrame, "an admin %s cannot carry a %q frame", req.Op, truncateID(f.Type))
	}
	if perr := protocol.Validate(&f, lim); perr != nil {
		return req, nil, 0, perr
	}
	if req.Op == adminOpDirect {
		return req, &f, store.DirectKey(req.User, f.Peer, f.E2E), nil
	}
	return req, &f, f.ConvID, nil
}

func truncateID(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// runAdmin runs a decoded admin request on svc.
func runAdmin(ctx context.Context, svc *chat.Service, req adminRequest, f *protocol.Frame) adminAnswer {
	var (
		conv *protocol.ConvInfo
		ack  *protocol.Frame
		perr *protocol.Error
	)
	switch req.Op {
	case adminOpMembers:
		conv, perr = svc.AdminFrame(ctx, req.Actor, f)
	case adminOpModerate:
		ack, perr = svc.AdminModerate(ctx, req.Actor, f)
	case adminOpNotice:
		ack, perr = svc.AdminNotice(ctx, req.Actor, req.ConvID, req.CMID, req.Text)
	case adminOpSend:
		ack, perr = svc.AdminSend(ctx, chat.Caller{User: req.User, Device: req.Device}, f)
	case adminOpDirect:
		conv, perr = svc.AdminOpenDirect(ctx, req.User, f.Peer, f.E2E)
	default:
		perr = protocol.Errorf(protocol.CodeBadFrame, "unknown admin op %q", req.Op)
	}
	if perr != nil {
		return adminAnswer{Err: toWire(perr)}
	}
	return adminAnswer{Conv: conv, Ack: ack}
}

// Admin is the server API's chat service in cluster mode (admin.Chat):
// reads and group creation run on the local chat service (any process
// may), conversation writes on the owner of the conversation's partition
// and opening a direct conversation on the owner of the pair's — locally
// when this process holds it, otherwise forwarded over NATS.
type Admin struct {
	local   *chat.Service
	owner   *lease.Owner
	nc      *natsio.Conn
	ns      string
	limits  protocol.Limits
	timeout time.Duration
}

// NewAdmin returns the router; timeout bounds each forwarded request
// (and the caller's context bounds the whole call).
func NewAdmin(local *chat.Service, owner *lease.Owner, nc *natsio.Conn, ns string, limits protocol.Limits, timeout time.Duration) *Admin {
	return &Admin{local: local, owner: owner, nc: nc, ns: ns, limits: limits, timeout: timeout}
}

// AdminOpenDirect runs on the owner of the pair's partition
// (store.DirectKey), which alone decides the pair's conversation.
func (a *Admin) AdminOpenDirect(ctx context.Context, x, y string, e2e bool) (*protocol.ConvInfo, *protocol.Error) {
	ans := a.route(ctx, adminOpDirect, adminRequest{Op: adminOpDirect, User: x}, &protocol.Frame{Type: protocol.TypeOpenDirect, Peer: y, E2E: e2e})
	return ans.Conv, ans.Err.perr()
}

// AdminCreateGroup runs locally (creating a conversation needs no owner).
func (a *Admin) AdminCreateGroup(ctx context.Context, owner, name string, members []string, e2e bool) (*protocol.ConvInfo, *protocol.Error) {
	return a.local.AdminCreateGroup(ctx, owner, name, members, e2e)
}

// AdminConv reads locally.
func (a *Admin) AdminConv(ctx context.Context, convID uint64) (*protocol.ConvInfo, *protocol.Error) {
	return a.local.AdminConv(ctx, convID)
}

// AdminUserConversations reads locally.
func (a *Admin) AdminUserConversations(ctx context.Context, user string, after uint64, limit int) ([]protocol.ConvSummary, bool, *protocol.Error) {
	return a.local.AdminUserConversations(ctx, user, after, limit)
}

// AdminSearch reads locally.
func (a *Admin) AdminSearch(ctx context.Context, user string, q protocol.SearchQuery) (*protocol.SearchResult, *protocol.Error) {
	return a.local.AdminSearch(ctx, user, q)
}

// AdminFrame runs a membership frame with the admin authority on the owner.
func (a *Admin) AdminFrame(ctx context.Context, actor string, f *protocol.Frame) (*protocol.ConvInfo, *protocol.Error) {
	ans := a.route(ctx, adminOpMembers, adminRequest{Op: adminOpMembers, Actor: actor}, f)
	return ans.Conv, ans.Err.perr()
}

// AdminSend runs a send as user c on the owner.
func (a *Admin) AdminSend(ctx context.Context, c chat.Caller, f *protocol.Frame) (*protocol.Frame, *protocol.Error) {
	if c.Admin {
		return nil, protocol.Errorf(protocol.CodeInternal, "a send as a user cannot carry the admin authority")
	}
	ans := a.route(ctx, adminOpSend, adminRequest{Op: adminOpSend, User: c.User, Device: c.Device}, f)
	return ans.Ack, ans.Err.perr()
}

// AdminModerate runs an edit or recall with the admin authority on the
// owner.
func (a *Admin) AdminModerate(ctx context.Context, actor string, f *protocol.Frame) (*protocol.Frame, *protocol.Error) {
	ans := a.route(ctx, adminOpModerate, adminRequest{Op: adminOpModerate, Actor: actor}, f)
	return ans.Ack, ans.Err.perr()
}

// AdminNotice stores the admin's system message on the owner.
func (a *Admin) AdminNotice(ctx context.Context, actor string, convID uint64, clientMsgID, text string) (*protocol.Frame, *protocol.Error) {
	ans := a.route(ctx, adminOpNotice, adminRequest{Op: adminOpNotice, Actor: actor, ConvID: convID, CMID: clientMsgID, Text: text}, nil)
	return ans.Ack, ans.Err.perr()
}

// route runs req on the owner of its conversation: here when this process
// holds the partition, otherwise over NATS. Both paths decode the same
// envelope (so the local path checks what the remote one checks). A
// write refused because the partition moved is retried on the new owner
// for up to ownerWait, as the gateway retries a client's.
func (a *Admin) route(ctx context.Context, op string, req adminRequest, f *protocol.Frame) adminAnswer {
	if f != nil {
		raw, err := json.Marshal(f)
		if err != nil {
			return adminAnswer{Err: toWire(protocol.Errorf(protocol.CodeInternal, "encode request"))}
		}
		req.Frame = raw
	}
	data, err := json.Marshal(req)
	if err != nil {
		return adminAnswer{Err: toWire(protocol.Errorf(protocol.CodeInternal, "encode request"))}
	}
	req, f, conv, perr := decodeAdmin(data, a.limits)
	if perr != nil {
		return adminAnswer{Err: toWire(perr)}
	}
	p := lease.Partition(conv, a.owner.Partitions())
	deadline := time.Now().Add(ownerWait)
	for {
		var ans adminAnswer
		if a.owner.Holds(p) {
			ans = runAdmin(ctx, a.local, req, f)
		} else {
			ans = a.forward(ctx, p, data)
		}
		if !ans.moving() || time.Now().After(deadline) {
			return ans
		}
		select {
		case <-ctx.Done():
			return ans
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// forward sends an encoded admin request to partition p's owner.
func (a *Admin) forward(ctx context.Context, p int, data []byte) adminAnswer {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	msg, err := toOwner(ctx, a.nc, subjectAdminPart(a.ns, p), data)
	if err != nil {
		return adminAnswer{Err: toWire(remoteErr(err))}
	}
	var ans adminAnswer
	if err := json.Unmarshal(msg.Data, &ans); err != nil || ans.Err == nil && ans.Conv == nil && ans.Ack == nil {
		return adminAnswer{Err: toWire(protocol.Errorf(protocol.CodeInternal, "undecodable answer from the chat tier"))}
	}
	return ans
}

// respondAdmin answers a forwarded admin request (on the owner).
func respondAdmin(m *natsio.Msg, ans adminAnswer) {
	data, err := json.Marshal(ans)
	if err != nil {
		data, _ = json.Marshal(adminAnswer{Err: toWire(protocol.Errorf(protocol.CodeInternal, "encode answer"))})
	}
	respond(m, data, ans.moving())
}
