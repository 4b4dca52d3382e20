package protocol

// Code is a client-facing error code carried by the error frame and by HTTP
// error bodies. Codes are stable strings; the message next to a code is for
// humans and may change.
type Code string

// The error codes. docs/protocol.md lists them with the frames that produce
// them and whether a retry can succeed.
const (
	CodeBadFrame         Code = "bad_frame"            // not a JSON object of the documented shape
	CodeUnknownType      Code = "unknown_type"         // the type field names no frame the server accepts
	CodeInvalidArgument  Code = "invalid_argument"     // a field is missing, malformed or out of range
	CodeTooLarge         Code = "too_large"            // a body or list is over its limit
	CodeUnauthorized     Code = "unauthorized"         // no token, a forged token or a malformed one
	CodeTokenExpired     Code = "token_expired"        // the token's exp is in the past
	CodeNotMember        Code = "not_member"           // the caller is not a member of the conversation
	CodeForbidden        Code = "forbidden"            // a member without the right for this action
	CodeNotFound         Code = "not_found"            // no such conversation, message or user
	CodeConflict         Code = "conflict"             // the action contradicts stored state (e.g. edit of a recalled message)
	CodeRecallExpired    Code = "recall_window_passed" // recall or edit after the configured window
	CodeRateLimited      Code = "rate_limited"         // over a rate limit; retry after retry_after_ms
	CodeStoreUnavailable Code = "store_unavailable"    // the durable write or read failed; nothing was stored; retry
	CodeInternal         Code = "internal"             // a server bug; nothing is promised about the request
	CodeTimeout          Code = "timeout"              // no answer in time; the outcome is unknown, retry (sends are idempotent)
	CodeOverloaded       Code = "overloaded"           // admission control refused; retry after retry_after_ms
	CodeTokenRevoked     Code = "token_revoked"        // the token was issued before the user's (or device's) revocation time: get a new one
	CodeBanned           Code = "banned"               // the user is banned by the operator
	// CodeBadReference: a reply_to names no message the sender may see
	// (not stored yet, before the sender joined, not a message).
	CodeBadReference Code = "bad_reference"
)

// Retryable reports whether the same request may succeed if sent again
// unchanged (after retry_after_ms when the error carries one).
func (c Code) Retryable() bool {
	switch c {
	case CodeRateLimited, CodeStoreUnavailable, CodeOverloaded, CodeInternal, CodeTimeout, CodeNotReady:
		return true
	}
	return false
}

// HTTPStatus is the HTTP status an HTTP answer carrying c has
// (docs/protocol.md, HTTP endpoints).
func HTTPStatus(c Code) int {
	switch c {
	case CodeUnauthorized, CodeTokenExpired, CodeTokenRevoked:
		return 401
	case CodeNotMember, CodeForbidden, CodeBanned:
		return 403
	case CodeNotFound:
		return 404
	case CodeConflict, CodeRecallExpired, CodePartOutOfOrder, CodeUploadIncomplete, CodeNotReady, CodeTooManyRegistrations:
		return 409
	case CodeTooLarge, CodeQuotaExceeded:
		return 413
	case CodeRateLimited, CodeTooManyUploads:
		return 429
	case CodeStoreUnavailable, CodeOverloaded, CodeSearchUnavailable:
		return 503
	case CodeInternal:
		return 500
	case CodeTimeout:
		return 504
	}
	return 400
}

// WebSocket close codes used by the server. 1000–1011 are RFC 6455's; 4000–4999
// are Parley's own.
const (
	CloseNormal          = 1000 // the client asked to close, or a clean shutdown
	CloseGoingAway       = 1001 // the node is draining: reconnect (to any node) after the goaway delay
	CloseProtocolError   = 1002 // a WebSocket protocol violation (RFC 6455: unmasked frame, reserved bit or opcode, bad fragmentation, control frame over 125 bytes)
	CloseUnsupportedData = 1003 // a binary frame: Parley frames are text
	CloseInvalidData     = 1007 // invalid UTF-8 in a text frame (checked fragment by fragment)
	CloseTooBig          = 1009 // a frame over max_frame_bytes
	CloseInternal        = 1011 // the server failed
	CloseIdleTimeout     = 4000 // nothing received for idle_timeout_ms
	CloseTokenExpired    = 4001 // the connection's token expired: reconnect with a new token
	CloseTokenRevoked    = 4002 // the connection's token was revoked (issued before a revocation time): reconnect with a new token
	CloseBanned          = 4003 // the user was banned: do not reconnect
	CloseDisconnected    = 4004 // the operator disconnected this device: reconnect with backoff
	CloseReplaced        = 4009 // the same user and device connected again elsewhere
	CloseTooManyErrors   = 4010 // too many bad frames in a row
	CloseRateLimited     = 4029 // too many requests refused rate_limited in a row: reconnect after a pause
)
