package protocol

// Caller is the authenticated sender of a request: the user of the
// connection's token and the device it connected as. The gateway fills it
// in; the chat service (or the remote chat tier) acts on its behalf.
type Caller struct {
	User   string
	Device string
	// Admin marks a request of the server API (internal/admin), made with
	// the operator's authority: User is then the admin's actor id, not a
	// member. Only the admin API sets it, in process; it never crosses
	// the wire (the gateway and the cluster codec fill User and Device
	// only).
	Admin bool
}

// ErrorFrame builds the error frame answering the request rid with e.
func ErrorFrame(rid string, e *Error) *Frame {
	return &Frame{Type: TypeError, RID: rid, Code: e.Code, Error: e.Msg, RetryAfter: e.RetryAfter}
}
