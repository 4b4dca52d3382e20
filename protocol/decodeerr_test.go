package protocol

import (
	"strings"
	"testing"
)

// TestMalformedValuesNameTheField: every malformed value answers the
// documented code with a message naming the field, never Go's decoder
// internals (struct names, Go types).
func TestMalformedValuesNameTheField(t *testing.T) {
	tests := []struct {
		frame string
		code  Code
		field string
	}{
		{`{"type":"history","conv_id":"1","after_seq":-1}`, CodeInvalidArgument, "after_seq"},
		{`{"type":"history","conv_id":"1","after_seq":1.5}`, CodeInvalidArgument, "after_seq"},
		{`{"type":"history","conv_id":"1","after_seq":1e30}`, CodeInvalidArgument, "after_seq"},
		{`{"type":"history","conv_id":"1","after_seq":"5"}`, CodeBadFrame, "after_seq"},
		{`{"type":"history","conv_id":"abc"}`, CodeInvalidArgument, "conv_id"},
		{`{"type":"history","conv_id":"-3"}`, CodeInvalidArgument, "conv_id"},
		{`{"type":"history","conv_id":12}`, CodeBadFrame, "conv_id"},
		{`{"type":"sync","convs":[{"conv_id":"1"},{"conv_id":"x"}]}`, CodeInvalidArgument, "convs[1].conv_id"},
		{`{"type":"sync","convs":[{"conv_id":"1","after_seq":-2}]}`, CodeInvalidArgument, "convs.after_seq"},
		{`{"type":5}`, CodeBadFrame, "type"},
		{`{"type":"send","conv_id":"1","mentions":"bob"}`, CodeBadFrame, "mentions"},
		{`{"type":"mute","conv_id":"1","muted":"yes"}`, CodeBadFrame, "muted"},
		{`{"type":"read","conv_id":"1","seq":-4}`, CodeInvalidArgument, "seq"},
		{`{"type":"x",}`, CodeBadFrame, "JSON"},
	}
	for _, tc := range tests {
		t.Run(tc.frame, func(t *testing.T) {
			_, e := DecodeClient([]byte(tc.frame), DefaultLimits)
			if e == nil {
				t.Fatal("decoded; want an error")
			}
			if e.Code != tc.code || !strings.Contains(e.Msg, tc.field) {
				t.Fatalf("got %s %q, want %s naming %s", e.Code, e.Msg, tc.code, tc.field)
			}
			for _, internal := range []string{"Go struct", "uint64", "unmarshal", "struct tag", "Frame."} {
				if strings.Contains(e.Msg, internal) {
					t.Fatalf("message %q shows decoder internals (%q)", e.Msg, internal)
				}
			}
		})
	}
}
