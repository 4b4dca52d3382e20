// Package webhook is the receiving side of Parley's webhooks: the event
// types a node POSTs to a configured endpoint, and the signature check a
// receiver runs before trusting one.
//
// Every request carries these headers:
//
//	Parley-Webhook-Id         the event's idempotency id (the same on every attempt)
//	Parley-Webhook-Timestamp  unix seconds when this attempt was signed
//	Parley-Webhook-Signature  v1=<hex HMAC-SHA256(secret, timestamp + "." + body)>
//	Parley-Webhook-Attempt    1 for the first attempt, then 2, 3, ...
//
// The body is one Event in JSON. Verify (or VerifyRequest) recomputes the
// HMAC over the timestamp header, a dot and the raw body, compares it in
// constant time, and refuses a timestamp further than the tolerance from
// now, so a captured request cannot be replayed later. Delivery is at least
// once: a receiver drops an Id it has already handled.
//
// docs/webhooks.md describes the events, the delivery guarantees and a
// recipe for receivers in other languages.
package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/parley-im/parley/protocol"
)

// Header names.
const (
	HeaderID        = "Parley-Webhook-Id"
	HeaderTimestamp = "Parley-Webhook-Timestamp"
	HeaderSignature = "Parley-Webhook-Signature"
	HeaderAttempt   = "Parley-Webhook-Attempt"
)

// Event types.
const (
	// MessageCreated: a message took a seq (kinds text, state, file,
	// edit, recall, and system notices of the server API). In an
	// end-to-end encrypted conversation the event carries no body.
	MessageCreated = "message.created"
	// RecipientOffline: the members of the conversation who should see a
	// text or file message and had no device reached by its push.
	RecipientOffline = "recipient.offline"
	// Membership changes, one per membership event the conversation
	// records (its kind "system" message).
	MemberAdded       = "member.added"
	MemberRemoved     = "member.removed"
	MemberLeft        = "member.left"
	MemberRoleChanged = "member.role_changed"
	MemberMuted       = "member.muted"
	MemberUnmuted     = "member.unmuted"
)

// Types lists every event type, in the order a message's events are
// delivered when it has several.
var Types = []string{MessageCreated, RecipientOffline, MemberAdded, MemberRemoved, MemberLeft,
	MemberRoleChanged, MemberMuted, MemberUnmuted}

// Event is the body of a webhook request.
type Event struct {
	// ID is the idempotency id: "<conv_id>.<seq>.<type>". A retried or
	// re-produced event has the same id.
	ID   string `json:"id"`
	Type string `json:"type"`
	// Time is the message's server time (unix ms).
	Time   int64  `json:"time"`
	ConvID uint64 `json:"conv_id,string"`
	// Seq orders the conversation's events: events of one conversation
	// are delivered in seq order (then in the order of Types).
	Seq uint64 `json:"seq"`
	// Data is one of MessageData, OfflineData, MemberData, by Type.
	Data json.RawMessage `json:"data"`
}

// ID returns the idempotency id of the event of type typ for seq in conv.
func ID(conv, seq uint64, typ string) string {
	return strconv.FormatUint(conv, 10) + "." + strconv.FormatUint(seq, 10) + "." + typ
}

// MessageData is the data of message.created.
type MessageData struct {
	ConvKind string `json:"conv_kind"` // direct or group
	// E2E: the conversation is end-to-end encrypted; Message.Body is
	// always empty then (the server holds only ciphertext for devices).
	E2E     bool             `json:"e2e,omitempty"`
	Message protocol.Message `json:"message"`
	// Attachment describes the file of a kind "file" message of a plain
	// conversation (Message.AttachmentID names it in E2E conversations
	// too, where the server knows only the ciphertext's size: no
	// attachment object, and never a key).
	Attachment *Attachment `json:"attachment,omitempty"`
}

// Attachment is the file a message names, as its sender uploaded it.
type Attachment struct {
	AttachmentID uint64 `json:"attachment_id,string"`
	Name         string `json:"name"`
	Size         int64  `json:"size"`
	MediaType    string `json:"media_type"`
	SHA256       string `json:"sha256"` // lowercase hex
	Width        int    `json:"width,omitempty"`
	Height       int    `json:"height,omitempty"`
	DurationMS   int64  `json:"duration_ms,omitempty"`
}

// OfflineData is the data of recipient.offline.
type OfflineData struct {
	ConvKind string `json:"conv_kind"`
	E2E      bool   `json:"e2e,omitempty"`
	MsgID    uint64 `json:"msg_id,string"`
	Sender   string `json:"sender"`
	// Users are the members (the sender excluded) who may see the
	// message and had no device reached when it was pushed: no
	// connected device, or their gateway could not be reached.
	Users []string `json:"users"`
	// Preview is set by the endpoint's preview policy: absent (none),
	// the sender only, or the sender and the body (full). Always absent
	// in end-to-end encrypted conversations.
	Preview *Preview `json:"preview,omitempty"`
}

// Preview is what a push notification may show: for a file message, its
// caption as Body and the file's name as File.
type Preview struct {
	Sender string `json:"sender"`
	Body   string `json:"body,omitempty"`
	File   string `json:"file,omitempty"`
}

// MemberData is the data of the member.* events: Actor changed the
// membership of Users (Role is the new role of member.role_changed).
type MemberData struct {
	Actor string   `json:"actor"`
	Users []string `json:"users"`
	Role  string   `json:"role,omitempty"`
	// Admin: the change was made through the server API; Actor is then
	// the operator's actor id, not a member.
	Admin bool `json:"admin,omitempty"`
}

// Errors of Verify.
var (
	ErrNoSignature = errors.New("webhook: no signature")
	ErrTimestamp   = errors.New("webhook: timestamp missing, malformed or outside the tolerance")
	ErrSignature   = errors.New("webhook: signature does not match")
)

// DefaultTolerance is how far a timestamp may be from the receiver's clock.
const DefaultTolerance = 5 * time.Minute

// Sign returns the Parley-Webhook-Signature value for body signed at ts.
func Sign(secret []byte, ts time.Time, body []byte) string {
	return "v1=" + hex.EncodeToString(mac(secret, strconv.FormatInt(ts.Unix(), 10), body))
}

func mac(secret []byte, ts string, body []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(ts))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// Verify checks the signature headers of a request whose raw body is body.
// The signature header may hold several space- or comma-separated v1=
// values (for example while the secret is rotated); one match is enough.
func Verify(secret []byte, h http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	ts := h.Get(HeaderTimestamp)
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || ts != strconv.FormatInt(sec, 10) {
		return ErrTimestamp
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: %v from now", ErrTimestamp, d.Round(time.Second))
	}
	sig := h.Get(HeaderSignature)
	if sig == "" {
		return ErrNoSignature
	}
	want := mac(secret, ts, body)
	for _, f := range strings.FieldsFunc(sig, func(r rune) bool { return r == ' ' || r == ',' }) {
		v, ok := strings.CutPrefix(f, "v1=")
		if !ok {
			continue
		}
		got, err := hex.DecodeString(v)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return ErrSignature
}

// MaxBodyBytes bounds what VerifyRequest reads.
const MaxBodyBytes = 1 << 20

// VerifyRequest reads r's body (at most MaxBodyBytes), verifies it with
// DefaultTolerance and decodes the event.
func VerifyRequest(r *http.Request, secret []byte) (Event, []byte, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		return Event{}, nil, fmt.Errorf("webhook: read body: %w", err)
	}
	if len(body) > MaxBodyBytes {
		return Event{}, nil, fmt.Errorf("webhook: body over %d bytes", MaxBodyBytes)
	}
	if err := Verify(secret, r.Header, body, time.Now(), DefaultTolerance); err != nil {
		return Event{}, body, err
	}
	var ev Event
	if err := json.Unmarshal(body, &ev); err != nil {
		return Event{}, body, fmt.Errorf("webhook: decode event: %w", err)
	}
	return ev, body, nil
}
