package admin

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/parley-im/parley/internal/access"
	"github.com/parley-im/parley/internal/attach"
	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/protocol"
)

// Routes lists every endpoint as "METHOD /path" (the OpenAPI document is
// checked against it).
var Routes = []string{
	"POST /v1/admin/conversations/direct",
	"POST /v1/admin/conversations/group",
	"GET /v1/admin/conversations/{conv_id}",
	"POST /v1/admin/conversations/{conv_id}/members",
	"DELETE /v1/admin/conversations/{conv_id}/members/{user_id}",
	"PUT /v1/admin/conversations/{conv_id}/members/{user_id}/role",
	"PUT /v1/admin/conversations/{conv_id}/members/{user_id}/mute",
	"POST /v1/admin/conversations/{conv_id}/messages",
	"PATCH /v1/admin/conversations/{conv_id}/messages/{seq}",
	"DELETE /v1/admin/conversations/{conv_id}/messages/{seq}",
	"GET /v1/admin/users/{user_id}/conversations",
	"GET /v1/admin/users/{user_id}/access",
	"POST /v1/admin/users/{user_id}/ban",
	"DELETE /v1/admin/users/{user_id}/ban",
	"POST /v1/admin/users/{user_id}/revoke",
	"POST /v1/admin/users/{user_id}/disconnect",
	"GET /v1/admin/conversations/{conv_id}/attachments",
	"DELETE /v1/admin/attachments/{attachment_id}",
	"POST /v1/admin/search",
	BackupRoute,
	ReindexRoute,
}

// BackupRoute streams a backup archive (Deps.Backup); its answer is a tar
// stream, not JSON.
const BackupRoute = "POST /v1/admin/backup"

// Answers.
type (
	convAnswer struct {
		Conv *protocol.ConvInfo `json:"conv"`
	}
	listAnswer struct {
		Conversations []protocol.ConvSummary `json:"conversations"`
		// Next, when more follow, is the after to ask for the next page.
		Next string `json:"next,omitempty"`
	}
	ackAnswer struct {
		Ack ack `json:"ack"`
	}
	ack struct {
		ConvID      uint64 `json:"conv_id,string"`
		ClientMsgID string `json:"client_msg_id"`
		Seq         uint64 `json:"seq"`
		MsgID       uint64 `json:"msg_id,string"`
		ServerTime  int64  `json:"server_time"`
		Duplicate   bool   `json:"duplicate,omitempty"`
	}
	entryAnswer struct {
		Entry access.Entry `json:"entry"`
	}
	entriesAnswer struct {
		Entries []access.Entry `json:"entries"`
	}
	disconnectAnswer struct {
		Sessions int `json:"sessions"`
	}
	attachmentsAnswer struct {
		Attachments []attach.AdminAttachment `json:"attachments"`
		// Next, when more follow, is the after to ask for the next page.
		Next string `json:"next,omitempty"`
	}
)

func ackOf(f *protocol.Frame) ackAnswer {
	return ackAnswer{ack{ConvID: f.ConvID, ClientMsgID: f.ClientMsgID, Seq: f.Seq, MsgID: f.MsgID, ServerTime: f.ServerTime, Duplicate: f.Duplicate}}
}

func convOf(c *protocol.ConvInfo, perr *protocol.Error) (any, *protocol.Error) {
	if perr != nil {
		return nil, perr
	}
	return convAnswer{c}, nil
}

func (s *Server) routes() {
	handlers := []handler{
		s.createDirect, s.createGroup, s.getConv, s.addMembers, s.removeMember, s.setRole, s.mute,
		s.sendMessage, s.editMessage, s.recallMessage, s.userConversations, s.userAccess,
		s.ban, s.unban, s.revoke, s.disconnect, s.attachments, s.deleteAttachment, s.search,
	}
	for i, pattern := range Routes[:len(handlers)] {
		s.handle(pattern, handlers[i])
	}
	s.mux.HandleFunc(BackupRoute, s.backup)
	s.mux.HandleFunc(ReindexRoute, s.reindex)
	// Anything else (an unknown path, or a method a path does not take).
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, protocol.Errorf(protocol.CodeNotFound, "no endpoint %s %s", r.Method, truncate(r.URL.Path)))
	})
}

func (s *Server) createDirect(ctx context.Context, _ *http.Request, body []byte) (any, *protocol.Error) {
	var req directReq
	if perr := decode(body, &req); perr != nil {
		return nil, perr
	}
	if len(req.Users) != 2 {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "users must name the two users")
	}
	if perr := validUsers("users", req.Users, 2); perr != nil {
		return nil, perr
	}
	f := &protocol.Frame{Type: protocol.TypeOpenDirect, Peer: req.Users[1], E2E: req.E2E}
	if perr := protocol.Validate(f, s.d.Limits); perr != nil {
		return nil, perr
	}
	return convOf(s.d.Chat.AdminOpenDirect(ctx, req.Users[0], req.Users[1], req.E2E))
}

func (s *Server) createGroup(ctx context.Context, _ *http.Request, body []byte) (any, *protocol.Error) {
	var req groupReq
	if perr := decode(body, &req); perr != nil {
		return nil, perr
	}
	if !protocol.ValidID(req.Owner) {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "owner %q is not a valid user id", truncate(req.Owner))
	}
	f := &protocol.Frame{Type: protocol.TypeCreateGroup, Name: req.Name, Members: req.Members, E2E: req.E2E}
	if perr := validUsers("members", req.Members, s.d.Limits.MaxGroupMembers); perr != nil {
		return nil, perr
	}
	if perr := protocol.Validate(f, s.d.Limits); perr != nil {
		return nil, perr
	}
	return convOf(s.d.Chat.AdminCreateGroup(ctx, req.Owner, req.Name, req.Members, req.E2E))
}

func (s *Server) getConv(ctx context.Context, r *http.Request, _ []byte) (any, *protocol.Error) {
	conv, perr := pathConv(r)
	if perr != nil {
		return nil, perr
	}
	return convOf(s.d.Chat.AdminConv(ctx, conv))
}

// membership runs a membership frame with the admin authority.
func (s *Server) membership(ctx context.Context, f *protocol.Frame) (any, *protocol.Error) {
	if perr := protocol.Validate(f, s.d.Limits); perr != nil {
		return nil, perr
	}
	return convOf(s.d.Chat.AdminFrame(ctx, s.cfg.Actor, f))
}

func (s *Server) addMembers(ctx context.Context, r *http.Request, body []byte) (any, *protocol.Error) {
	conv, perr := pathConv(r)
	if perr != nil {
		return nil, perr
	}
	var req membersReq
	if perr := decode(body, &req); perr != nil {
		return nil, perr
	}
	if len(req.Users) == 0 {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "users is required")
	}
	if perr := validUsers("users", req.Users, s.d.Limits.MaxGroupMembers); perr != nil {
		return nil, perr
	}
	return s.membership(ctx, &protocol.Frame{Type: protocol.TypeAddMembers, ConvID: conv, Members: req.Users})
}

func (s *Server) removeMember(ctx context.Context, r *http.Request, _ []byte) (any, *protocol.Error) {
	conv, user, perr := pathMember(r)
	if perr != nil {
		return nil, perr
	}
	return s.membership(ctx, &protocol.Frame{Type: protocol.TypeRemove, ConvID: conv, Members: []string{user}})
}

func (s *Server) setRole(ctx context.Context, r *http.Request, body []byte) (any, *protocol.Error) {
	conv, user, perr := pathMember(r)
	if perr != nil {
		return nil, perr
	}
	var req roleReq
	if perr := decode(body, &req); perr != nil {
		return nil, perr
	}
	return s.membership(ctx, &protocol.Frame{Type: protocol.TypeSetRole, ConvID: conv, UserID: user, Role: req.Role})
}

func (s *Server) mute(ctx context.Context, r *http.Request, body []byte) (any, *protocol.Error) {
	conv, user, perr := pathMember(r)
	if perr != nil {
		return nil, perr
	}
	var req muteReq
	if perr := decode(body, &req); perr != nil {
		return nil, perr
	}
	if req.Muted == nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "muted (true or false) is required")
	}
	return s.membership(ctx, &protocol.Frame{Type: protocol.TypeMute, ConvID: conv, UserID: user, Muted: *req.Muted})
}

// Ways to send a message.
const (
	asUser   = "user"
	asBot    = "bot"
	asSystem = "system"
)

// BotDevice is the default sender_device of a message sent as a bot.
const BotDevice = "bot"

func (s *Server) sendMessage(ctx context.Context, r *http.Request, body []byte) (any, *protocol.Error) {
	conv, perr := pathConv(r)
	if perr != nil {
		return nil, perr
	}
	var req messageReq
	if perr := decode(body, &req); perr != nil {
		return nil, perr
	}
	switch req.As {
	case asSystem:
		if req.Sender != "" || req.Device != "" || req.Body != "" || req.Kind != "" || req.CoalesceKey != "" || len(req.Mentions) > 0 || req.MentionAll {
			return nil, protocol.Errorf(protocol.CodeInvalidArgument, "a system message takes text and client_msg_id only")
		}
		if req.Text == "" {
			return nil, protocol.Errorf(protocol.CodeInvalidArgument, "text is required")
		}
		if len(req.Text) > s.d.Limits.MaxBodyBytes {
			return nil, protocol.Errorf(protocol.CodeTooLarge, "text of %d bytes is over %d", len(req.Text), s.d.Limits.MaxBodyBytes)
		}
		if req.ClientMsgID == "" || len(req.ClientMsgID) > s.d.Limits.MaxClientMsgID {
			return nil, protocol.Errorf(protocol.CodeInvalidArgument, "client_msg_id of 1-%d bytes is required", s.d.Limits.MaxClientMsgID)
		}
		f, perr := s.d.Chat.AdminNotice(ctx, s.cfg.Actor, conv, req.ClientMsgID, req.Text)
		if perr != nil {
			return nil, perr
		}
		return ackOf(f), nil
	case "", asUser, asBot:
	default:
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "as must be user, bot or system")
	}
	if req.Text != "" {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "text is for system messages; send body")
	}
	if !protocol.ValidID(req.Sender) {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "sender %q is not a valid user id", truncate(req.Sender))
	}
	if perr := checkDevice(req.Device); perr != nil {
		return nil, perr
	}
	device := req.Device
	switch {
	case device == "" && req.As == asBot:
		device = BotDevice
	case device == "":
		device = chat.AdminDevice
	}
	f := &protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: req.ClientMsgID, Body: req.Body,
		Kind: req.Kind, CoalesceKey: req.CoalesceKey, Mentions: req.Mentions, MentionAll: req.MentionAll}
	if perr := protocol.Validate(f, s.d.Limits); perr != nil {
		return nil, perr
	}
	a, perr := s.d.Chat.AdminSend(ctx, chat.Caller{User: req.Sender, Device: device}, f)
	if perr != nil {
		return nil, perr
	}
	return ackOf(a), nil
}

func (s *Server) moderate(ctx context.Context, f *protocol.Frame) (any, *protocol.Error) {
	if perr := protocol.Validate(f, s.d.Limits); perr != nil {
		return nil, perr
	}
	a, perr := s.d.Chat.AdminModerate(ctx, s.cfg.Actor, f)
	if perr != nil {
		return nil, perr
	}
	return ackOf(a), nil
}

func (s *Server) editMessage(ctx context.Context, r *http.Request, body []byte) (any, *protocol.Error) {
	conv, perr := pathConv(r)
	if perr != nil {
		return nil, perr
	}
	seq, perr := pathSeq(r)
	if perr != nil {
		return nil, perr
	}
	var req editReq
	if perr := decode(body, &req); perr != nil {
		return nil, perr
	}
	return s.moderate(ctx, &protocol.Frame{Type: protocol.TypeEdit, ConvID: conv, TargetSeq: seq, ClientMsgID: req.ClientMsgID, Body: req.Body})
}

func (s *Server) recallMessage(ctx context.Context, r *http.Request, _ []byte) (any, *protocol.Error) {
	conv, perr := pathConv(r)
	if perr != nil {
		return nil, perr
	}
	seq, perr := pathSeq(r)
	if perr != nil {
		return nil, perr
	}
	return s.moderate(ctx, &protocol.Frame{Type: protocol.TypeRecall, ConvID: conv, TargetSeq: seq, ClientMsgID: r.URL.Query().Get("client_msg_id")})
}

// Paging of a user's conversations.
const (
	defaultPage = 50
	maxPage     = 200
)

// pageQuery reads a listing's query parameters: after, the decimal id
// of the last item of the previous page (none for the first), and limit,
// from 1 to max (def when absent).
func pageQuery(r *http.Request, item string, def, max int) (after uint64, limit int, perr *protocol.Error) {
	q := r.URL.Query()
	if v := q.Get("after"); v != "" {
		a, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, protocol.Errorf(protocol.CodeInvalidArgument, "after %q is not a decimal %s id", truncate(v), item)
		}
		after = a
	}
	limit = def
	if v := q.Get("limit"); v != "" {
		l, err := strconv.Atoi(v)
		if err != nil || l < 1 || l > max {
			return 0, 0, protocol.Errorf(protocol.CodeInvalidArgument, "limit must be an integer from 1 to %d", max)
		}
		limit = l
	}
	return after, limit, nil
}

func (s *Server) userConversations(ctx context.Context, r *http.Request, _ []byte) (any, *protocol.Error) {
	user, perr := pathUser(r)
	if perr != nil {
		return nil, perr
	}
	after, limit, perr := pageQuery(r, "conversation", defaultPage, maxPage)
	if perr != nil {
		return nil, perr
	}
	list, more, perr := s.d.Chat.AdminUserConversations(ctx, user, after, limit)
	if perr != nil {
		return nil, perr
	}
	out := listAnswer{Conversations: list}
	if more && len(list) > 0 {
		out.Next = strconv.FormatUint(list[len(list)-1].ConvID, 10)
	}
	return out, nil
}

func (s *Server) userAccess(_ context.Context, r *http.Request, _ []byte) (any, *protocol.Error) {
	user, perr := pathUser(r)
	if perr != nil {
		return nil, perr
	}
	entries := s.d.Access.List().Entries(user)
	slices.SortFunc(entries, func(a, b access.Entry) int {
		switch {
		case a.Key() < b.Key():
			return -1
		case a.Key() > b.Key():
			return 1
		}
		return 0
	})
	if entries == nil {
		entries = []access.Entry{}
	}
	return entriesAnswer{entries}, nil
}

func (s *Server) accessErr(err error) *protocol.Error {
	s.d.Logger.Error("admin API: access list write failed", "err", err)
	return protocol.Errorf(protocol.CodeStoreUnavailable, "the access list could not be written; nothing changed, retry")
}

func (s *Server) ban(ctx context.Context, r *http.Request, body []byte) (any, *protocol.Error) {
	user, perr := pathUser(r)
	if perr != nil {
		return nil, perr
	}
	var req banReq
	if perr := decode(body, &req); perr != nil {
		return nil, perr
	}
	if len(req.Reason) > maxReasonBytes {
		return nil, protocol.Errorf(protocol.CodeTooLarge, "reason is over %d bytes", maxReasonBytes)
	}
	e, err := s.d.Access.Ban(ctx, user, req.Reason)
	if err != nil {
		return nil, s.accessErr(err)
	}
	s.d.Logger.Info("admin API: user banned", "user", user)
	return entryAnswer{e}, nil
}

func (s *Server) unban(ctx context.Context, r *http.Request, _ []byte) (any, *protocol.Error) {
	user, perr := pathUser(r)
	if perr != nil {
		return nil, perr
	}
	e, err := s.d.Access.Unban(ctx, user)
	if err != nil {
		return nil, s.accessErr(err)
	}
	s.d.Logger.Info("admin API: user unbanned", "user", user)
	return entryAnswer{e}, nil
}

func (s *Server) revoke(ctx context.Context, r *http.Request, body []byte) (any, *protocol.Error) {
	user, perr := pathUser(r)
	if perr != nil {
		return nil, perr
	}
	var req revokeReq
	if perr := decode(body, &req); perr != nil {
		return nil, perr
	}
	if perr := checkDevice(req.Device); perr != nil {
		return nil, perr
	}
	before := s.d.Now()
	if req.Before != nil {
		if *req.Before <= 0 {
			return nil, protocol.Errorf(protocol.CodeInvalidArgument, "before must be a positive Unix time in milliseconds")
		}
		before = time.UnixMilli(*req.Before)
	}
	e, err := s.d.Access.Revoke(ctx, user, req.Device, before)
	if err != nil {
		return nil, s.accessErr(err)
	}
	s.d.Logger.Info("admin API: tokens revoked", "user", user, "device", req.Device, "before", before)
	return entryAnswer{e}, nil
}

func (s *Server) disconnect(ctx context.Context, r *http.Request, body []byte) (any, *protocol.Error) {
	user, perr := pathUser(r)
	if perr != nil {
		return nil, perr
	}
	var req disconnectReq
	if perr := decode(body, &req); perr != nil {
		return nil, perr
	}
	if perr := checkDevice(req.Device); perr != nil {
		return nil, perr
	}
	n, err := s.d.Disconnect(ctx, user, req.Device)
	if err != nil {
		s.d.Logger.Warn("admin API: disconnect failed", "user", user, "err", err)
		return nil, protocol.Errorf(protocol.CodeStoreUnavailable, "the session registry or the bus failed; retry")
	}
	return disconnectAnswer{n}, nil
}

// checkDevice refuses a device id that is given but not valid; empty means
// every device (or the caller's default).
func checkDevice(device string) *protocol.Error {
	if device != "" && !protocol.ValidID(device) {
		return protocol.Errorf(protocol.CodeInvalidArgument, "device %q is not a valid device id", truncate(device))
	}
	return nil
}

// Paging of a conversation's attachments.
const (
	defaultAttachPage = 100
	maxAttachPage     = 1000
)

func (s *Server) attachmentsOff() *protocol.Error {
	return protocol.Errorf(protocol.CodeInvalidArgument, "attachments are not enabled on this server")
}

func (s *Server) attachments(ctx context.Context, r *http.Request, _ []byte) (any, *protocol.Error) {
	conv, perr := pathConv(r)
	if perr != nil {
		return nil, perr
	}
	if s.d.Attachments == nil {
		return nil, s.attachmentsOff()
	}
	after, limit, perr := pageQuery(r, "attachment", defaultAttachPage, maxAttachPage)
	if perr != nil {
		return nil, perr
	}
	list, more, perr := s.d.Attachments.AdminAttachments(ctx, conv, after, limit)
	if perr != nil {
		return nil, perr
	}
	out := attachmentsAnswer{Attachments: list}
	if more && len(list) > 0 {
		out.Next = strconv.FormatUint(list[len(list)-1].AttachmentID, 10)
	}
	return out, nil
}

func (s *Server) deleteAttachment(ctx context.Context, r *http.Request, _ []byte) (any, *protocol.Error) {
	v := r.PathValue("attachment_id")
	id, err := strconv.ParseUint(v, 10, 64)
	if err != nil || id == 0 {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "attachment_id %q is not a decimal attachment id", truncate(v))
	}
	if s.d.Attachments == nil {
		return nil, s.attachmentsOff()
	}
	if perr := s.d.Attachments.AdminDeleteAttachment(ctx, id); perr != nil {
		return nil, perr
	}
	s.d.Logger.Info("admin API: attachment deleted", "attachment", id)
	return nil, nil
}
