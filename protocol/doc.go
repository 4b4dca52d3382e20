// Package protocol is Parley's wire protocol, shared by the server and the Go
// client SDK: the JSON frames exchanged over a WebSocket (or the HTTP
// fallback), their validation, the client-facing error codes, the WebSocket
// close codes and the default limits. docs/protocol.md is the contract; this
// package is its executable form and must say exactly what that page says.
//
// Everything here is pure data and functions without I/O; values are safe to
// share between goroutines once built.
package protocol

// Version is the protocol version announced in the hello frame. A client that
// sees a newer major version than it knows must not assume unknown frames are
// errors: servers only add optional fields and new frame types within a
// version.
const Version = 1
