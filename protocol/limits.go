package protocol

// Limits are the sizes a server enforces; the hello frame announces the ones
// in force. The defaults below are what `parley serve` uses unless configured;
// the yaml and help tags make each limit a setting of the server under
// limits. (internal/settings).
type Limits struct {
	MaxFrameBytes   int `json:"max_frame_bytes" yaml:"max_frame_bytes" help:"largest client frame in bytes (a larger WebSocket message closes the connection with 1009)"`
	MaxBodyBytes    int `json:"max_body_bytes" yaml:"max_body_bytes" help:"largest message body in bytes (too_large over it)"`
	MaxClientMsgID  int `json:"max_client_msg_id" yaml:"max_client_msg_id" help:"longest client_msg_id in bytes"`
	MaxSyncConvs    int `json:"max_sync_convs" yaml:"max_sync_convs" help:"conversations in one sync request"`
	MaxHistory      int `json:"max_history" yaml:"max_history" help:"messages in one history answer"`
	MaxGroupMembers int `json:"max_group_members" yaml:"max_group_members" help:"members of one group"`
	MaxNameBytes    int `json:"max_name_bytes" yaml:"max_name_bytes" help:"longest group name in bytes"`
	MaxMentions     int `json:"max_mentions" yaml:"max_mentions" help:"users one message may mention"`
	MaxPresenceSubs int `json:"max_presence_subs" yaml:"max_presence_subs" help:"users one connection may watch for presence"`
}

// DefaultLimits are the limits of an unconfigured server.
var DefaultLimits = Limits{
	MaxFrameBytes:   64 << 10,
	MaxBodyBytes:    16 << 10,
	MaxClientMsgID:  64,
	MaxSyncConvs:    1000,
	MaxHistory:      200,
	MaxGroupMembers: 100000,
	MaxNameBytes:    256,
	MaxMentions:     50,
	MaxPresenceSubs: 200,
}

// MaxUserIDBytes bounds user and device ids; both are 1–64 bytes of
// [A-Za-z0-9._@-].
const MaxUserIDBytes = 64

// ValidID reports whether s is a well-formed user or device id.
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > MaxUserIDBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.', c == '_', c == '@', c == '-':
		default:
			return false
		}
	}
	return true
}

// WebSocket subprotocols. A browser cannot set Authorization on a
// WebSocket, and a token in the URL lands in consoles and access logs: a
// client may offer Subprotocol and BearerSubprotocolPrefix+token in
// Sec-WebSocket-Protocol instead, and the server selects Subprotocol
// (never echoing the token).
const (
	Subprotocol             = "parley.v1"
	BearerSubprotocolPrefix = "bearer."
)
