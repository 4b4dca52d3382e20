package gateway

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// parseFrame reads one unmasked server frame as a client would.
func parseFrame(t *testing.T, b []byte) (fin bool, op byte, payload []byte) {
	t.Helper()
	if len(b) < 2 {
		t.Fatalf("frame of %d bytes", len(b))
	}
	fin, op = b[0]&0x80 != 0, b[0]&0x0F
	if b[0]&0x70 != 0 || b[1]&0x80 != 0 {
		t.Fatalf("RSV bits or mask set: % x", b[:2])
	}
	n, rest := uint64(b[1]&0x7F), b[2:]
	switch n {
	case 126:
		n, rest = uint64(binary.BigEndian.Uint16(rest)), rest[2:]
		if n < 126 {
			t.Fatalf("16-bit length %d is not minimal", n)
		}
	case 127:
		n, rest = binary.BigEndian.Uint64(rest), rest[8:]
		if n <= 0xFFFF {
			t.Fatalf("64-bit length %d is not minimal", n)
		}
	}
	if uint64(len(rest)) != n {
		t.Fatalf("length says %d, %d bytes follow", n, len(rest))
	}
	return fin, op, rest
}

func TestWireFrameEncodesEveryLengthClass(t *testing.T) {
	for _, n := range []int{0, 1, 125, 126, 127, 65535, 65536, 200000} {
		payload := bytes.Repeat([]byte{'a' + byte(n%26)}, n)
		f := newWireFrame(payload)
		fin, op, got := parseFrame(t, f.b)
		if !fin || op != 1 {
			t.Errorf("n=%d: fin %v opcode %d, want a final text frame", n, fin, op)
		}
		if !bytes.Equal(got, payload) || !bytes.Equal(f.payload(), payload) {
			t.Errorf("n=%d: payload does not round-trip", n)
		}
		if f.hdr != wsHeaderLen(n) {
			t.Errorf("n=%d: header %d, want %d", n, f.hdr, wsHeaderLen(n))
		}
	}
}

func TestWireFrameCopiesPayload(t *testing.T) {
	p := []byte(`{"type":"msg"}`)
	f := newWireFrame(p)
	p[2] = 'X'
	if string(f.payload()) != `{"type":"msg"}` {
		t.Fatalf("frame shares the caller's buffer: %q", f.payload())
	}
}
