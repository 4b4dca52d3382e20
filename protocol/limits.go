package protocol

// Limits are the sizes a server enforces; the hello frame announces the ones
// in force. The defaults below are what `parley serve` uses unless configured.
type Limits struct {
	MaxFrameBytes   int `json:"max_frame_bytes"`   // a larger WebSocket message closes the connection with 1009
	MaxBodyBytes    int `json:"max_body_bytes"`    // a larger body gets too_large
	MaxClientMsgID  int `json:"max_client_msg_id"` // bytes of client_msg_id
	MaxSyncConvs    int `json:"max_sync_convs"`    // entries in one sync request
	MaxHistory      int `json:"max_history"`       // messages in one history answer
	MaxGroupMembers int `json:"max_group_members"` // members of one group
	MaxNameBytes    int `json:"max_name_bytes"`    // bytes of a group name
	MaxMentions     int `json:"max_mentions"`      // users mentioned by one message
	MaxPresenceSubs int `json:"max_presence_subs"` // users one connection watches
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
