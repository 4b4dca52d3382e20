package protocol

import "testing"

// TestClientTypesAreAccepted: validation knows every listed type (an empty
// frame of one may be refused, but never as an unknown type), and still
// refuses a type outside the list as unknown.
func TestClientTypesAreAccepted(t *testing.T) {
	seen := map[string]bool{}
	for _, typ := range ClientTypes {
		if seen[typ] {
			t.Errorf("%q is listed twice", typ)
		}
		seen[typ] = true
		if e := validate(&Frame{Type: typ}, DefaultLimits); e != nil && e.Code == CodeUnknownType {
			t.Errorf("%q is listed but validation calls it unknown: %v", typ, e)
		}
	}
	for _, typ := range []string{"pong", "ack", "msg", "made_up"} {
		if e := validate(&Frame{Type: typ}, DefaultLimits); e == nil || e.Code != CodeUnknownType {
			t.Errorf("%q: got %v, want %s", typ, e, CodeUnknownType)
		}
	}
}
