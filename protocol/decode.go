package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// Error is a client-facing failure: a code from the documented table and a
// human-readable message.
type Error struct {
	Code       Code
	Msg        string
	RetryAfter int64 // milliseconds; 0 when not applicable
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Msg }

// Errorf builds an *Error.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// DecodeClient parses and validates one client frame against lim. On failure
// the returned *Error carries the code to send back; the frame's rid is still
// returned when it could be read, so the error can be correlated.
func DecodeClient(data []byte, lim Limits) (*Frame, *Error) {
	trimmed, e := jsonObject(data, lim)
	if e != nil {
		return nil, e
	}
	if f, ok := decodeSmall(trimmed); ok {
		return f, validate(f, lim)
	}
	return decodeJSON(trimmed, lim)
}

// DecodeClientInto is DecodeClient, except that a frame of the usual small
// shape (acks, pings: see decodeSmall) is decoded into into, which must be
// a zero Frame, and returned as f == into, so that a caller can reuse it;
// any other frame is a new Frame and into is left zero.
func DecodeClientInto(data []byte, lim Limits, into *Frame) (*Frame, *Error) {
	trimmed, e := jsonObject(data, lim)
	if e != nil {
		return nil, e
	}
	if decodeSmallInto(trimmed, into) {
		return into, validate(into, lim)
	}
	*into = Frame{}
	return decodeJSON(trimmed, lim)
}

// jsonObject returns data without surrounding white space, or the error
// for a frame that is too large, not UTF-8 or not a JSON object.
func jsonObject(data []byte, lim Limits) ([]byte, *Error) {
	if len(data) > lim.MaxFrameBytes {
		return nil, Errorf(CodeTooLarge, "frame of %d bytes is over %d", len(data), lim.MaxFrameBytes)
	}
	if !utf8.Valid(data) {
		return nil, Errorf(CodeBadFrame, "frame is not valid UTF-8")
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, Errorf(CodeBadFrame, "frame is not a JSON object")
	}
	return trimmed, nil
}

func decodeJSON(trimmed []byte, lim Limits) (*Frame, *Error) {
	var f Frame
	if err := json.Unmarshal(trimmed, &f); err != nil {
		rid := peekRID(trimmed)
		return &Frame{RID: rid}, decodeError(trimmed, err)
	}
	if e := validate(&f, lim); e != nil {
		return &f, e
	}
	return &f, nil
}

func peekRID(data []byte) string {
	var probe struct {
		RID string `json:"rid"`
	}
	if json.Unmarshal(data, &probe) != nil {
		return ""
	}
	return probe.RID
}

// Validate checks a frame built in process (the server API builds client
// frames from its requests) exactly as DecodeClient checks a decoded one;
// it may fill defaults (a send's kind) as DecodeClient does.
func Validate(f *Frame, lim Limits) *Error { return validate(f, lim) }

func validate(f *Frame, lim Limits) *Error {
	if len(f.RID) > 64 {
		return Errorf(CodeInvalidArgument, "rid is over 64 bytes")
	}
	switch f.Type {
	case TypePing, TypeConvList:
		return nil
	case TypeKeysUpload, TypeKeysBundle, TypeKeysDevices, TypeKeysRemove:
		return validateKeys(f)
	case TypeKTKeys, TypeKTConsistency, TypeKTLeaves:
		return validateKT(f)
	case TypePushRegister, TypePushRemove:
		return validatePush(f)
	case TypeConvMute, TypeConvUnmute, TypeDNDSet, TypeDNDGet:
		return validateNotify(f)
	case TypeUploadCreate, TypeUploadStatus, TypeUploadPart, TypeUploadComplete, TypeAttachmentURL:
		return validateAttach(f)
	case TypeSearch:
		return validateSearch(f)
	case TypeSend:
		if e := needConv(f); e != nil {
			return e
		}
		if e := needClientMsgID(f, lim); e != nil {
			return e
		}
		if f.Kind == "" {
			f.Kind = KindText
		}
		switch f.Kind {
		case KindText:
			if f.CoalesceKey != "" {
				return Errorf(CodeInvalidArgument, "coalesce_key needs kind state")
			}
		case KindState:
			if f.CoalesceKey == "" || len(f.CoalesceKey) > lim.MaxClientMsgID {
				return Errorf(CodeInvalidArgument, "kind state needs a coalesce_key of 1-%d bytes", lim.MaxClientMsgID)
			}
		case KindFile:
			if f.AttachmentID == 0 {
				return Errorf(CodeInvalidArgument, "kind file needs attachment_id")
			}
			if f.CoalesceKey != "" {
				return Errorf(CodeInvalidArgument, "coalesce_key needs kind state")
			}
		default:
			return Errorf(CodeInvalidArgument, "kind %q cannot be sent; use text, state or file, or the edit and recall frames", f.Kind)
		}
		if f.ReplyTo != 0 && f.Kind == KindState {
			return Errorf(CodeInvalidArgument, "a state message cannot be a reply")
		}
		if f.Kind != KindFile && f.AttachmentID != 0 {
			return Errorf(CodeInvalidArgument, "attachment_id needs kind file")
		}
		if len(f.Mentions) > lim.MaxMentions {
			return Errorf(CodeTooLarge, "%d mentions is over %d", len(f.Mentions), lim.MaxMentions)
		}
		for _, m := range f.Mentions {
			if !ValidID(m) {
				return Errorf(CodeInvalidArgument, "mention %q is not a valid user id", m)
			}
		}
		if f.Kind == KindFile {
			// The body of a plain conversation's file message is optional
			// (caption, duration); an E2E one's envelope the service
			// requires.
			return maxBody(f, lim)
		}
		return needBody(f, lim)
	case TypeEdit:
		if e := noReply(f); e != nil {
			return e
		}
		if e := needTarget(f, lim); e != nil {
			return e
		}
		f.Kind = KindEdit
		return needBody(f, lim)
	case TypeRecall:
		if e := noReply(f); e != nil {
			return e
		}
		if e := needTarget(f, lim); e != nil {
			return e
		}
		// A body is for end-to-end encrypted conversations only (the
		// author's sealed recall); the service refuses it elsewhere.
		f.Kind = KindRecall
		return maxBody(f, lim)
	case TypeReact:
		return validateReact(f, lim)
	case TypeDelivered:
		if len(f.Positions) == 0 {
			return needPosition(f)
		}
		if f.ConvID != 0 || f.Seq != 0 {
			return Errorf(CodeInvalidArgument, "give conv_id and seq, or positions, not both")
		}
		if len(f.Positions) > lim.MaxSyncConvs {
			return Errorf(CodeTooLarge, "%d positions in one delivered is over %d", len(f.Positions), lim.MaxSyncConvs)
		}
		for _, p := range f.Positions {
			if p.ConvID == 0 || p.Seq == 0 {
				return Errorf(CodeInvalidArgument, "conv_id and seq are required in every positions entry")
			}
		}
		return nil
	case TypeRead, TypeReadBy:
		return needPosition(f)
	case TypeSync:
		if len(f.Convs) > lim.MaxSyncConvs {
			return Errorf(CodeTooLarge, "%d conversations in one sync is over %d", len(f.Convs), lim.MaxSyncConvs)
		}
		if len(f.Convs) == 0 && !f.All {
			return Errorf(CodeInvalidArgument, "sync needs convs, all, or both")
		}
		for _, c := range f.Convs {
			if c.ConvID == 0 {
				return Errorf(CodeInvalidArgument, "conv_id is required in every convs entry")
			}
		}
		return nil
	case TypeHistory:
		if e := needConv(f); e != nil {
			return e
		}
		if f.BeforeSeq != 0 && f.AfterSeq != nil {
			return Errorf(CodeInvalidArgument, "give before_seq or after_seq, not both")
		}
		if f.Limit < 0 || f.Limit > lim.MaxHistory {
			return Errorf(CodeInvalidArgument, "limit must be 0..%d", lim.MaxHistory)
		}
		return nil
	case TypeOpenDirect:
		if !ValidID(f.Peer) {
			return Errorf(CodeInvalidArgument, "peer is not a valid user id")
		}
		return nil
	case TypeCreateGroup:
		if len(f.Name) > lim.MaxNameBytes {
			return Errorf(CodeTooLarge, "name is over %d bytes", lim.MaxNameBytes)
		}
		return needMembers(f, lim)
	case TypeAddMembers, TypeRemove:
		if e := needConv(f); e != nil {
			return e
		}
		if len(f.Members) == 0 {
			return Errorf(CodeInvalidArgument, "members is required")
		}
		return needMembers(f, lim)
	case TypeLeave, TypeTyping, TypeConvInfo:
		return needConv(f)
	case TypeSetRole:
		if e := needConv(f); e != nil {
			return e
		}
		if !ValidID(f.UserID) {
			return Errorf(CodeInvalidArgument, "user_id is not a valid user id")
		}
		if f.Role != RoleMember && f.Role != RoleAdmin && f.Role != RoleOwner {
			return Errorf(CodeInvalidArgument, "role must be member, admin or owner")
		}
		return nil
	case TypeMute:
		if e := needConv(f); e != nil {
			return e
		}
		if !ValidID(f.UserID) {
			return Errorf(CodeInvalidArgument, "user_id is not a valid user id")
		}
		return nil
	case TypePresenceSub:
		if len(f.Users) > lim.MaxPresenceSubs {
			return Errorf(CodeTooLarge, "%d users is over %d", len(f.Users), lim.MaxPresenceSubs)
		}
		for _, u := range f.Users {
			if !ValidID(u) {
				return Errorf(CodeInvalidArgument, "user %q is not a valid user id", u)
			}
		}
		return nil
	case "":
		return Errorf(CodeBadFrame, "type is required")
	}
	return Errorf(CodeUnknownType, "unknown frame type %q", f.Type)
}

// needPosition checks a single position: conv_id and a seq.
func needPosition(f *Frame) *Error {
	if e := needConv(f); e != nil {
		return e
	}
	if f.Seq == 0 {
		return Errorf(CodeInvalidArgument, "seq is required")
	}
	return nil
}

func needConv(f *Frame) *Error {
	if f.ConvID == 0 {
		return Errorf(CodeInvalidArgument, "conv_id is required")
	}
	return nil
}

// needTarget checks what an edit and a recall both need: the conversation,
// a client_msg_id and the seq of the message they change.
func needTarget(f *Frame, lim Limits) *Error {
	if e := needConv(f); e != nil {
		return e
	}
	if e := needClientMsgID(f, lim); e != nil {
		return e
	}
	if f.TargetSeq == 0 {
		return Errorf(CodeInvalidArgument, "target_seq is required")
	}
	if f.AttachmentID != 0 {
		return Errorf(CodeInvalidArgument, "a file message is recalled, never edited, and a recall names no attachment_id")
	}
	return nil
}

func needClientMsgID(f *Frame, lim Limits) *Error {
	if f.ClientMsgID == "" {
		return Errorf(CodeInvalidArgument, "client_msg_id is required")
	}
	if len(f.ClientMsgID) > lim.MaxClientMsgID {
		return Errorf(CodeInvalidArgument, "client_msg_id is over %d bytes", lim.MaxClientMsgID)
	}
	return nil
}

func needBody(f *Frame, lim Limits) *Error {
	if f.Body == "" {
		return Errorf(CodeInvalidArgument, "body is required")
	}
	return maxBody(f, lim)
}

func maxBody(f *Frame, lim Limits) *Error {
	if len(f.Body) > lim.MaxBodyBytes {
		return Errorf(CodeTooLarge, "body of %d bytes is over %d", len(f.Body), lim.MaxBodyBytes)
	}
	return nil
}

func needMembers(f *Frame, lim Limits) *Error {
	if len(f.Members) > lim.MaxGroupMembers {
		return Errorf(CodeTooLarge, "%d members is over %d", len(f.Members), lim.MaxGroupMembers)
	}
	for _, m := range f.Members {
		if !ValidID(m) {
			return Errorf(CodeInvalidArgument, "member %q is not a valid user id", m)
		}
	}
	return nil
}

// noReply refuses reply_to on an edit or recall: a message's reply
// reference is set when it is sent and kept through its edits.
func noReply(f *Frame) *Error {
	if f.ReplyTo != 0 {
		return Errorf(CodeInvalidArgument, "reply_to is for send: an edit keeps the message's reference")
	}
	return nil
}

// MaxEmojiBytes bounds a reaction's emoji: one emoji with its modifiers
// and joiners (the server's allowed set decides which).
const MaxEmojiBytes = 64

// validateReact checks a react frame: a target, an emoji, nothing of a
// send; it sets Kind (react or unreact), as the event is stored.
func validateReact(f *Frame, lim Limits) *Error {
	if e := noReply(f); e != nil {
		return e
	}
	if e := needTarget(f, lim); e != nil {
		return e
	}
	if f.Emoji == "" || len(f.Emoji) > MaxEmojiBytes || !utf8.ValidString(f.Emoji) {
		return Errorf(CodeInvalidArgument, "emoji must be 1-%d bytes of UTF-8", MaxEmojiBytes)
	}
	if f.Body != "" || len(f.Mentions) > 0 || f.MentionAll || f.CoalesceKey != "" {
		return Errorf(CodeInvalidArgument, "a reaction carries its emoji, no body, mentions or coalesce_key")
	}
	f.Kind = KindReact
	if f.Remove {
		f.Kind = KindUnreact
	}
	return nil
}
