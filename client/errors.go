package client

import (
	"errors"
	"fmt"
	"time"

	"github.com/parley-im/parley/protocol"
)

// Sentinel errors callers branch on.
var (
	// ErrUnauthorized: the server refused the token (HTTP 401). Run stops.
	ErrUnauthorized = errors.New("client: unauthorized")
	// ErrReplaced: a newer connection of the same user and device took over
	// (close code 4009). Run stops instead of fighting it.
	ErrReplaced = errors.New("client: replaced by a newer connection of this device")
	// ErrTokenExpired: the server closed the connection because its token
	// expired (close code 4001). With Config.TokenFunc the client asks it
	// for a token and reconnects at once; with a fixed Config.Token, or
	// when TokenFunc returns the same token again, Run stops with an error
	// wrapping ErrTokenExpired and ErrUnauthorized.
	ErrTokenExpired = errors.New("client: the token expired")
	// ErrTokenRevoked: the operator revoked the connection's token (close
	// code 4002, or HTTP 401 token_revoked at the handshake). Handled as
	// ErrTokenExpired: a new token from TokenFunc reconnects; a fixed token,
	// or the same one again, stops Run (the error also wraps
	// ErrUnauthorized).
	ErrTokenRevoked = errors.New("client: the token was revoked")
	// ErrBanned: the operator banned the user (close code 4003, or HTTP 403
	// banned at the handshake). Run stops whatever the token source: a new
	// token of the same user is refused too.
	ErrBanned = errors.New("client: the user is banned")
	// ErrKicked: the operator disconnected this device (close code 4004).
	// It is the Err of EventDisconnected and EventReconnecting; the client
	// reconnects with backoff (the first step at least, never at once).
	ErrKicked = errors.New("client: disconnected by the operator")
	// ErrClosed: the client was closed, or Run has returned.
	ErrClosed = errors.New("client: closed")
	// ErrRunning: Run was called twice.
	ErrRunning = errors.New("client: already running")
	// ErrDisconnected: the connection ended while a request that must not be
	// repeated blindly (create_group) was in flight; its outcome is unknown.
	ErrDisconnected = errors.New("client: disconnected")
	// ErrTimeout: no answer within Config.RequestTimeout for a request that
	// must not be repeated blindly.
	ErrTimeout = errors.New("client: request timed out")
	// ErrInvalidConfig wraps every Config.Validate failure.
	ErrInvalidConfig = errors.New("client: invalid config")
)

// Sentinels of the attachment codes: errors.Is(err, ErrQuotaExceeded) is
// true for a *Error of code quota_exceeded, and so on, whether the code
// came in a frame or in an HTTP answer of an upload or download URL.
var (
	ErrQuotaExceeded    = errors.New("client: storage quota exceeded")
	ErrTooManyUploads   = errors.New("client: too many uploads in flight")
	ErrSizeMismatch     = errors.New("client: size does not match the declared one")
	ErrHashMismatch     = errors.New("client: SHA-256 does not match the declared one")
	ErrPartOutOfOrder   = errors.New("client: part out of order")
	ErrUploadIncomplete = errors.New("client: upload incomplete")
	ErrNotReady         = errors.New("client: not ready yet")
)

var codeSentinels = map[error]protocol.Code{
	ErrQuotaExceeded:    protocol.CodeQuotaExceeded,
	ErrTooManyUploads:   protocol.CodeTooManyUploads,
	ErrSizeMismatch:     protocol.CodeSizeMismatch,
	ErrHashMismatch:     protocol.CodeHashMismatch,
	ErrPartOutOfOrder:   protocol.CodePartOutOfOrder,
	ErrUploadIncomplete: protocol.CodeUploadIncomplete,
	ErrNotReady:         protocol.CodeNotReady,
}

// Error is a failure the server reported with a protocol error code.
type Error struct {
	Code protocol.Code
	Msg  string
	// RetryAfter is the delay the server asked for (rate_limited, overloaded);
	// zero when it gave none.
	RetryAfter time.Duration
}

func (e *Error) Error() string { return fmt.Sprintf("parley: %s: %s", e.Code, e.Msg) }

// Retryable reports whether sending the same request again may succeed.
func (e *Error) Retryable() bool { return e.Code.Retryable() }

// Is makes errors.Is(err, ErrUnauthorized) true for unauthorized,
// token_expired and token_revoked answers, errors.Is(err, ErrTokenRevoked)
// for token_revoked, errors.Is(err, ErrBanned) for banned, and the
// attachment sentinels (ErrQuotaExceeded, ...) for their codes.
func (e *Error) Is(target error) bool {
	if code, ok := codeSentinels[target]; ok {
		return e.Code == code
	}
	switch target {
	case ErrUnauthorized:
		return e.Code == protocol.CodeUnauthorized || e.Code == protocol.CodeTokenExpired || e.Code == protocol.CodeTokenRevoked
	case ErrTokenExpired:
		return e.Code == protocol.CodeTokenExpired
	case ErrTokenRevoked:
		return e.Code == protocol.CodeTokenRevoked
	case ErrBanned:
		return e.Code == protocol.CodeBanned
	}
	return false
}

func errorFromFrame(f *protocol.Frame) *Error {
	return &Error{Code: f.Code, Msg: f.Error, RetryAfter: time.Duration(f.RetryAfter) * time.Millisecond}
}

// CodeOf returns the protocol error code of err (a *Error anywhere in its
// chain), or "" when the server did not refuse the request (a local
// failure, a context that ended, ErrDisconnected, ...). docs/protocol.md
// lists the codes; protocol.CodeNotMember and its siblings name them.
func CodeOf(err error) protocol.Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}
