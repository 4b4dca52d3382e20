package protocol

// Caller is the authenticated sender of a request: the user of the
// connection's token and the device it connected as. The gateway fills it
// in; the chat service (or the remote chat tier) acts on its behalf.
type Caller struct {
	User   string
	Device string
}

// ErrorFrame builds the error frame answering the request rid with e.
func ErrorFrame(rid string, e *Error) *Frame {
	return &Frame{Type: TypeError, RID: rid, Code: e.Code, Error: e.Msg, RetryAfter: e.RetryAfter}
}
