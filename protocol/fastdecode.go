package protocol

// decodeSmall decodes the small frames clients send most often — delivered
// and read acks, pings — without encoding/json: an object whose keys are
// only type, rid, conv_id and seq, with plain values (strings without
// escapes, conv_id a quoted and seq a bare non-negative integer in
// canonical form). It reports false for anything else, and the caller then
// decodes with encoding/json; for every input it accepts, the result is
// the one encoding/json gives (FuzzDecodeSmallMatchesJSON). data is a
// trimmed, valid UTF-8 JSON candidate.
func decodeSmall(data []byte) (*Frame, bool) {
	f := new(Frame)
	if !decodeSmallInto(data, f) {
		return nil, false
	}
	return f, true
}

// decodeSmallInto is decodeSmall into a zero Frame f; on false, f may
// hold part of the frame and must be discarded or zeroed.
func decodeSmallInto(data []byte, f *Frame) bool {
	i, n := 0, len(data)
	if n < 2 || data[0] != '{' || data[n-1] != '}' {
		return false
	}
	i = skipWS(data, 1)
	if i < n && data[i] == '}' {
		return false // {}: left to encoding/json
	}
	for {
		key, j, ok := plainString(data, i)
		if !ok {
			return false
		}
		i = skipWS(data, j)
		if i >= n || data[i] != ':' {
			return false
		}
		i = skipWS(data, i+1)
		switch string(key) {
		case "type", "rid":
			v, j, ok := plainString(data, i)
			if !ok {
				return false
			}
			if string(key) == "type" {
				f.Type = internType(v)
			} else {
				f.RID = string(v)
			}
			i = j
		case "conv_id":
			v, j, ok := plainString(data, i)
			if !ok {
				return false
			}
			x, ok := canonicalUint(v)
			if !ok {
				return false
			}
			f.ConvID, i = x, j
		case "seq":
			j := i
			for j < n && data[j] >= '0' && data[j] <= '9' {
				j++
			}
			x, ok := canonicalUint(data[i:j])
			if !ok {
				return false
			}
			f.Seq, i = x, j
		default:
			return false
		}
		i = skipWS(data, i)
		if i >= n {
			return false
		}
		switch data[i] {
		case ',':
			i = skipWS(data, i+1)
			continue
		case '}':
			if i != n-1 {
				return false
			}
			return true
		}
		return false
	}
}

func skipWS(data []byte, i int) int {
	for i < len(data) {
		switch data[i] {
		case ' ', '\t', '\n', '\r':
			i++
			continue
		}
		break
	}
	return i
}

// plainString reads a JSON string starting at data[i] that needs no
// unescaping: no backslash and no control character. It returns the bytes
// between the quotes and the index after the closing one.
func plainString(data []byte, i int) ([]byte, int, bool) {
	if i >= len(data) || data[i] != '"' {
		return nil, 0, false
	}
	for j := i + 1; j < len(data); j++ {
		switch c := data[j]; {
		case c == '"':
			return data[i+1 : j], j + 1, true
		case c == '\\' || c < 0x20:
			return nil, 0, false
		}
	}
	return nil, 0, false
}

// canonicalUint parses a JSON integer without sign, fraction, exponent or
// leading zero that fits in a uint64.
func canonicalUint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 || (b[0] == '0' && len(b) > 1) {
		return 0, false
	}
	var x uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if x > (1<<64-1-d)/10 {
			return 0, false
		}
		x = x*10 + d
	}
	return x, true
}

// internType returns the frame type v as a string, without allocating for
// the types small frames usually have.
func internType(v []byte) string {
	switch string(v) {
	case TypeDelivered:
		return TypeDelivered
	case TypePing:
		return TypePing
	case TypeRead:
		return TypeRead
	}
	return string(v)
}
