package bench

import (
	"bytes"
	"math"

	"github.com/parley-im/parley/protocol"
)

// pushInfo is what the fan-out client reads of a push: enough to check
// delivery per connection by seq and to time it, nothing more.
type pushInfo struct {
	Conv, Seq  uint64
	Text       bool  // kind "text": a benchmark message, not a membership event
	ServerTime int64 // unix ms
	// Stamp is the body's first stampLen bytes when they are all digits
	// (the send time of a benchmark message), else empty.
	Stamp []byte
	// Ack is the frame's acknowledgement policy (protocol.AckBatch,
	// AckNone, or empty: promptly).
	Ack string
}

// parsePush reads a server frame's JSON payload. It reports isMsg=false
// for frames of other types (pongs, receipts, acks) and ok=false for
// anything it does not understand, which the client counts as an error.
//
// It is a small JSON walker that extracts type and, from message,
// conv_id, seq, kind, server_time and the body's prefix, skipping every
// other value; it allocates nothing. To never read something other than
// what encoding/json would, it refuses (ok=false) duplicate keys, keys
// that differ from a wanted one only by case (encoding/json matches keys
// case-insensitively), escapes in type and kind, and non-canonical
// numbers: whatever it accepts, encoding/json decodes to the same values
// (FuzzParsePushMatchesJSON). The server's own output, marshalled
// protocol.Frame values, is always accepted.
func parsePush(data []byte) (p pushInfo, isMsg, ok bool) {
	var sc jsonScan
	sc.b = data
	sc.ws()
	var typ []byte
	var msgStart, msgEnd = -1, -1
	var seenType, seenMsg, seenAck bool
	if !sc.object(func(key []byte) bool {
		switch {
		case string(key) == "type":
			if seenType {
				return false
			}
			seenType = true
			s, ok := sc.plainString()
			typ = s
			return ok
		case string(key) == "message":
			if seenMsg {
				return false
			}
			seenMsg = true
			msgStart = sc.i
			if !sc.value() {
				return false
			}
			msgEnd = sc.i
			return true
		case string(key) == "ack":
			if seenAck {
				return false
			}
			seenAck = true
			s, ok := sc.plainString()
			switch string(s) { // constants: no allocation
			case protocol.AckBatch:
				p.Ack = protocol.AckBatch
			case protocol.AckNone:
				p.Ack = protocol.AckNone
			case "":
			default:
				return false
			}
			return ok
		case bytes.EqualFold(key, []byte("type")), bytes.EqualFold(key, []byte("message")), bytes.EqualFold(key, []byte("ack")):
			return false
		}
		return sc.value()
	}) {
		return p, false, false
	}
	sc.ws()
	if sc.i != len(sc.b) {
		return p, false, false
	}
	if !seenType {
		return p, false, false
	}
	if string(typ) != "msg" {
		return p, false, true
	}
	if msgStart < 0 || data[msgStart] != '{' {
		return p, false, false
	}
	var m jsonScan
	m.b = data[msgStart:msgEnd]
	var seen [5]bool
	once := func(k int) bool {
		if seen[k] {
			return false
		}
		seen[k] = true
		return true
	}
	if !m.object(func(key []byte) bool {
		switch string(key) {
		case "conv_id":
			if !once(0) {
				return false
			}
			s, ok := m.plainString()
			if !ok {
				return false
			}
			p.Conv, ok = canonicalUint(s)
			return ok
		case "seq":
			if !once(1) {
				return false
			}
			v, ok := canonicalUint(m.number())
			p.Seq = v
			return ok
		case "kind":
			if !once(2) {
				return false
			}
			s, ok := m.plainString()
			p.Text = string(s) == "text"
			return ok
		case "server_time":
			if !once(3) {
				return false
			}
			n := m.number()
			neg := len(n) > 0 && n[0] == '-'
			if neg {
				n = n[1:]
			}
			v, ok := canonicalUint(n)
			if !ok || v > 1<<62 || (neg && v == 0) {
				return false
			}
			p.ServerTime = int64(v)
			if neg {
				p.ServerTime = -p.ServerTime
			}
			return true
		case "body":
			if !once(4) {
				return false
			}
			start := m.i + 1
			if !m.value() || m.b[start-1] != '"' {
				return false
			}
			raw := m.b[start : m.i-1]
			if len(raw) >= stampLen && allDigits(raw[:stampLen]) {
				p.Stamp = raw[:stampLen]
			}
			return true
		}
		for _, k := range [...]string{"conv_id", "seq", "kind", "server_time", "body"} {
			if bytes.EqualFold(key, []byte(k)) {
				return false
			}
		}
		return m.value()
	}) || m.i != len(m.b) {
		return p, false, false
	}
	if !seen[0] || !seen[1] {
		return p, false, false
	}
	return p, true, true
}

func allDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// canonicalUint parses a JSON non-negative integer without sign, leading
// zeros, fraction or exponent.
func canonicalUint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 || (len(b) > 1 && b[0] == '0') || !allDigits(b) {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		d := uint64(c - '0')
		if v > (math.MaxUint64-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}

// jsonScan walks JSON text; every method leaves i after what it read and
// reports false on anything malformed.
type jsonScan struct {
	b []byte
	i int
}

func (s *jsonScan) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// object reads {"key": value, ...}, calling field with i at each value;
// field must consume the value.
func (s *jsonScan) object(field func(key []byte) bool) bool {
	if s.i >= len(s.b) || s.b[s.i] != '{' {
		return false
	}
	s.i++
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return true
	}
	for {
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return false
		}
		start := s.i + 1
		if !s.str() {
			return false
		}
		key := s.b[start : s.i-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			return false // escaped keys: left to encoding/json's judgement
		}
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return false
		}
		s.i++
		s.ws()
		if !field(key) {
			return false
		}
		if more, ok := s.sep('}'); !more {
			return ok
		}
	}
}

// sep reads what follows an item of an object or array closed by end:
// a comma (more true) or end (more false, ok true); anything else is not
// JSON (both false).
func (s *jsonScan) sep(end byte) (more, ok bool) {
	s.ws()
	if s.i >= len(s.b) {
		return false, false
	}
	switch s.b[s.i] {
	case ',':
		s.i++
		return true, true
	case end:
		s.i++
		return false, true
	}
	return false, false
}

// plainString reads a string without escapes and returns its bytes.
func (s *jsonScan) plainString() ([]byte, bool) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, false
	}
	start := s.i + 1
	if !s.str() {
		return nil, false
	}
	v := s.b[start : s.i-1]
	if bytes.IndexByte(v, '\\') >= 0 {
		return nil, false
	}
	return v, true
}

// str reads a string (i at its opening quote), checking its escapes.
func (s *jsonScan) str() bool {
	s.i++
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return true
		case c == '\\':
			if s.i+1 >= len(s.b) {
				return false
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+6 > len(s.b) {
					return false
				}
				for _, h := range s.b[s.i+2 : s.i+6] {
					if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
						return false
					}
				}
				s.i += 6
			default:
				return false
			}
		case c < 0x20:
			return false
		default:
			s.i++
		}
	}
	return false
}

// number returns the bytes of a number token (not validated beyond its
// characters; callers parse what they need).
func (s *jsonScan) number() []byte {
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		if c >= '0' && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E' {
			s.i++
			continue
		}
		break
	}
	return s.b[start:s.i]
}

// value skips one JSON value.
func (s *jsonScan) value() bool {
	if s.i >= len(s.b) {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '"':
		return s.str()
	case c == '{':
		return s.object(func([]byte) bool { return s.value() })
	case c == '[':
		s.i++
		s.ws()
		if s.i < len(s.b) && s.b[s.i] == ']' {
			s.i++
			return true
		}
		for {
			s.ws()
			if !s.value() {
				return false
			}
			if more, ok := s.sep(']'); !more {
				return ok
			}
		}
	case c == '-' || c >= '0' && c <= '9':
		return validNumber(s.number())
	case bytes.HasPrefix(s.b[s.i:], []byte("true")):
		s.i += 4
	case bytes.HasPrefix(s.b[s.i:], []byte("false")):
		s.i += 5
	case bytes.HasPrefix(s.b[s.i:], []byte("null")):
		s.i += 4
	default:
		return false
	}
	return true
}

// validNumber checks JSON's number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func validNumber(n []byte) bool {
	i := 0
	if i < len(n) && n[i] == '-' {
		i++
	}
	switch {
	case i < len(n) && n[i] == '0':
		i++
	case i < len(n) && n[i] >= '1' && n[i] <= '9':
		for i < len(n) && n[i] >= '0' && n[i] <= '9' {
			i++
		}
	default:
		return false
	}
	if i < len(n) && n[i] == '.' {
		i++
		d := i
		for i < len(n) && n[i] >= '0' && n[i] <= '9' {
			i++
		}
		if i == d {
			return false
		}
	}
	if i < len(n) && (n[i] == 'e' || n[i] == 'E') {
		i++
		if i < len(n) && (n[i] == '+' || n[i] == '-') {
			i++
		}
		d := i
		for i < len(n) && n[i] >= '0' && n[i] <= '9' {
			i++
		}
		if i == d {
			return false
		}
	}
	return i == len(n)
}
