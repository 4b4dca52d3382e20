package e2ee

import (
	"encoding/binary"
	"errors"
)

// A minimal protobuf (proto2) codec for the handful of flat messages of
// libsignal's wire.proto: only varint (uint32) and length-delimited
// (bytes) fields occur. Unknown fields are skipped, as protobuf requires.

var errProto = errors.New("e2ee: malformed protobuf")

type pbWriter struct{ b []byte }

func (w *pbWriter) uint32(field int, v uint32) {
	w.b = binary.AppendUvarint(w.b, uint64(field)<<3)
	w.b = binary.AppendUvarint(w.b, uint64(v))
}

func (w *pbWriter) bytes(field int, v []byte) {
	w.b = binary.AppendUvarint(w.b, uint64(field)<<3|2)
	w.b = binary.AppendUvarint(w.b, uint64(len(v)))
	w.b = append(w.b, v...)
}

// pbField is one decoded field: a varint value or a byte slice.
type pbField struct {
	num   int
	wire  int
	v     uint64
	bytes []byte
}

// pbParse decodes every field of a message; repeated occurrences keep the
// last one, as protobuf does for singular fields.
func pbParse(b []byte) (map[int]pbField, error) {
	out := make(map[int]pbField)
	for len(b) > 0 {
		tag, n := binary.Uvarint(b)
		if n <= 0 || tag>>3 == 0 || tag>>3 > 1<<29 {
			return nil, errProto
		}
		b = b[n:]
		f := pbField{num: int(tag >> 3), wire: int(tag & 7)}
		switch f.wire {
		case 0:
			v, n := binary.Uvarint(b)
			if n <= 0 {
				return nil, errProto
			}
			f.v, b = v, b[n:]
		case 1:
			if len(b) < 8 {
				return nil, errProto
			}
			f.v, b = binary.LittleEndian.Uint64(b), b[8:]
		case 2:
			l, n := binary.Uvarint(b)
			if n <= 0 || l > uint64(len(b)-n) {
				return nil, errProto
			}
			f.bytes, b = b[n:n+int(l)], b[n+int(l):]
		case 5:
			if len(b) < 4 {
				return nil, errProto
			}
			f.v, b = uint64(binary.LittleEndian.Uint32(b)), b[4:]
		default:
			return nil, errProto
		}
		out[f.num] = f
	}
	return out, nil
}

func pbUint32(m map[int]pbField, field int) (uint32, bool, error) {
	f, ok := m[field]
	if !ok {
		return 0, false, nil
	}
	if f.wire != 0 || f.v > 0xFFFFFFFF {
		return 0, false, errProto
	}
	return uint32(f.v), true, nil
}

func pbBytes(m map[int]pbField, field int) ([]byte, bool, error) {
	f, ok := m[field]
	if !ok {
		return nil, false, nil
	}
	if f.wire != 2 {
		return nil, false, errProto
	}
	return f.bytes, true, nil
}
