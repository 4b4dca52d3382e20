package pebble

import (
	"encoding/binary"
	"math"
)

// Key tags: the first byte of every key names its table.
const (
	tagMessage   = 'M'
	tagSeq       = 'S'
	tagConv      = 'C'
	tagMember    = 'B'
	tagUserConv  = 'U'
	tagDirect    = 'D'
	tagIdem      = 'I'
	tagRead      = 'R'
	tagDelivered = 'V'
	tagCoalesce  = 'K'
	tagOutbox    = 'O'
	tagVersion   = 'H'
	tagIDMark    = 'N'
	tagReacted   = 'A'
)

// idMarkKey is N: the message id watermark (idmark.go).
var idMarkKey = []byte{tagIDMark}

// bucketOf maps a message's server time to its time bucket. Times before the
// epoch land in bucket 0 and times past the u32 range in the last bucket, so
// a bad clock can never make a key unencodable.
func bucketOf(serverTimeMS, widthMS int64) uint32 {
	if serverTimeMS <= 0 {
		return 0
	}
	b := serverTimeMS / widthMS
	if b > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(b)
}

func tagged(tag byte, size int) []byte {
	k := make([]byte, 1, size)
	k[0] = tag
	return k
}

// msgKey is M | conv | bucket | ^msgid: inverting the id makes an ascending
// scan of one partition return the newest message first (clustering DESC).
func msgKey(conv uint64, bucket uint32, msgID uint64) []byte {
	k := tagged(tagMessage, 21)
	k = binary.BigEndian.AppendUint64(k, conv)
	k = binary.BigEndian.AppendUint32(k, bucket)
	return binary.BigEndian.AppendUint64(k, ^msgID)
}

// seqKey is S | conv | seq.
func seqKey(conv, seq uint64) []byte {
	k := tagged(tagSeq, 17)
	k = binary.BigEndian.AppendUint64(k, conv)
	return binary.BigEndian.AppendUint64(k, seq)
}

// convKey is C | conv.
func convKey(conv uint64) []byte {
	return binary.BigEndian.AppendUint64(tagged(tagConv, 9), conv)
}

// memberPrefix is B | conv; memberKey appends the user, which is the last
// component and needs no terminator.
func memberPrefix(conv uint64) []byte {
	return binary.BigEndian.AppendUint64(tagged(tagMember, 9+64), conv)
}

func memberKey(conv uint64, user string) []byte {
	return append(memberPrefix(conv), user...)
}

// userConvPrefix is U | user 0x00; userConvKey appends the conversation id.
func userConvPrefix(user string) []byte {
	k := append(tagged(tagUserConv, len(user)+10), user...)
	return append(k, 0)
}

func userConvKey(user string, conv uint64) []byte {
	return binary.BigEndian.AppendUint64(userConvPrefix(user), conv)
}

// convOfUserConvKey extracts the conversation id from a U key.
func convOfUserConvKey(k []byte) (uint64, bool) {
	if len(k) < 1+1+1+8 || k[0] != tagUserConv {
		return 0, false
	}
	return binary.BigEndian.Uint64(k[len(k)-8:]), true
}

// userOfMemberKey extracts the user from a B key.
func userOfMemberKey(k []byte) (string, bool) {
	if len(k) < 1+8+1 || k[0] != tagMember {
		return "", false
	}
	return string(k[9:]), true
}

// directKey is D | lo 0x00 hi with the pair sorted, so (a,b) and (b,a) meet.
func directKey(a, b string) []byte {
	if b < a {
		a, b = b, a
	}
	k := append(tagged(tagDirect, len(a)+len(b)+2), a...)
	k = append(k, 0)
	return append(k, b...)
}

// idemKey is I | conv | sender 0x00 client_msg_id.
func idemKey(conv uint64, sender, clientMsgID string) []byte {
	k := binary.BigEndian.AppendUint64(tagged(tagIdem, 10+len(sender)+len(clientMsgID)), conv)
	k = append(k, sender...)
	k = append(k, 0)
	return append(k, clientMsgID...)
}

// coalesceKey is K | conv | coalesce key; the key is the last component and
// may hold any bytes.
func coalesceKey(conv uint64, key string) []byte {
	k := binary.BigEndian.AppendUint64(tagged(tagCoalesce, 9+len(key)), conv)
	return append(k, key...)
}

// outboxKey is O | conv | seq: the message's fan-out is outstanding.
func outboxKey(conv, seq uint64) []byte {
	k := binary.BigEndian.AppendUint64(tagged(tagOutbox, 17), conv)
	return binary.BigEndian.AppendUint64(k, seq)
}

// versionPrefix is H | conv | target; versionKey appends the seq of the
// edit that replaced the version the key holds.
func versionPrefix(conv, target uint64) []byte {
	k := binary.BigEndian.AppendUint64(tagged(tagVersion, 25), conv)
	return binary.BigEndian.AppendUint64(k, target)
}

func versionKey(conv, target, event uint64) []byte {
	return binary.BigEndian.AppendUint64(versionPrefix(conv, target), event)
}

// readKey is R | user 0x00 conv [| device]; the per-user position has no
// device suffix.
func readKey(user string, conv uint64, device string) []byte {
	k := append(tagged(tagRead, len(user)+10+len(device)), user...)
	k = append(k, 0)
	k = binary.BigEndian.AppendUint64(k, conv)
	return append(k, device...)
}

// deliveredKey is V | user 0x00 conv.
func deliveredKey(user string, conv uint64) []byte {
	k := append(tagged(tagDelivered, len(user)+10), user...)
	k = append(k, 0)
	return binary.BigEndian.AppendUint64(k, conv)
}

// reactedPrefix is A | conv | user 0x00: a user's reactions in conv.
func reactedPrefix(conv uint64, user string) []byte {
	k := tagged(tagReacted, 18+len(user))
	k = binary.BigEndian.AppendUint64(k, conv)
	k = append(k, user...)
	return append(k, 0)
}

// reactedKey is A | conv | user 0x00 | seq: the user's emojis on seq.
func reactedKey(conv uint64, user string, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(reactedPrefix(conv, user), seq)
}

// prefixEnd returns the smallest key greater than every key with prefix p.
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] != 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil // p is all 0xff: no upper bound
}
