// Copyright 2026 the Parley authors. Use of this source code is governed by
// the MIT-style license of this package (see LICENSE).

package websocket

import "unicode/utf8"

// validUTF8Prefix reports whether b is valid UTF-8 except, possibly, for an
// incomplete but so far valid sequence at its end, and returns the length
// of the complete part. A text message is checked this way fragment by
// fragment, so an invalid byte fails the connection as soon as it arrives
// (RFC 6455 8.1) instead of when the message ends. [parley patch N6]
func validUTF8Prefix(b []byte) (int, bool) {
	i := 0
	for i < len(b) {
		if b[i] < utf8.RuneSelf {
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || size > 1 {
			i += size
			continue
		}
		// An invalid sequence, or one cut short by the end of b.
		if len(b)-i >= 4 || !incompleteUTF8(b[i:]) {
			return i, false
		}
		return i, true
	}
	return i, true
}

// incompleteUTF8 reports whether b (1 to 3 bytes) is the start of a valid
// multi-byte sequence that more bytes could complete.
func incompleteUTF8(b []byte) bool {
	c := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF) // bounds of the second byte
	switch {
	case c >= 0xC2 && c <= 0xDF:
		need = 2
	case c == 0xE0:
		need, lo = 3, 0xA0 // no overlong forms
	case c == 0xED:
		need, hi = 3, 0x9F // no surrogates
	case c >= 0xE1 && c <= 0xEF:
		need = 3
	case c == 0xF0:
		need, lo = 4, 0x90
	case c >= 0xF1 && c <= 0xF3:
		need = 4
	case c == 0xF4:
		need, hi = 4, 0x8F // nothing above U+10FFFF
	default:
		return false
	}
	if len(b) >= need {
		return false
	}
	for i := 1; i < len(b); i++ {
		if i == 1 && (b[i] < lo || b[i] > hi) {
			return false
		}
		if i > 1 && (b[i] < 0x80 || b[i] > 0xBF) {
			return false
		}
	}
	return true
}
