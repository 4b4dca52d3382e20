package relay

import (
	"encoding/json"
	"testing"
)

// FuzzHint: decodeHint never panics, accepts only hints with a user, and
// what it accepts encodes back to a hint that decodes the same.
func FuzzHint(f *testing.F) {
	f.Add([]byte(`{"u":"alice","o":true}`))
	f.Add([]byte(`{"u":"bob"}`))
	f.Add([]byte(`{"o":true}`))
	f.Add([]byte(`{"u":1}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := decodeHint(data)
		if err != nil {
			return
		}
		if h.User == "" {
			t.Fatal("accepted a hint without a user")
		}
		again, _ := json.Marshal(h)
		h2, err := decodeHint(again)
		if err != nil || h2 != h {
			t.Fatalf("round trip: %+v → %s → %+v, %v", h, again, h2, err)
		}
	})
}
