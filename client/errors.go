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

// Is makes errors.Is(err, ErrUnauthorized) true for unauthorized and
// token_expired answers.
func (e *Error) Is(target error) bool {
	return target == ErrUnauthorized && (e.Code == protocol.CodeUnauthorized || e.Code == protocol.CodeTokenExpired)
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
