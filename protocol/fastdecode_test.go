package protocol

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"unicode/utf8"
)

func TestDecodeSmall(t *testing.T) {
	tests := []struct {
		in   string
		ok   bool
		want Frame
	}{
		{`{"type":"delivered","conv_id":"386034167425253376","seq":42}`, true, Frame{Type: "delivered", ConvID: 386034167425253376, Seq: 42}},
		{` {"seq":0, "type" : "read" ,"rid":"r1","conv_id":"7"}`, false, Frame{}}, // leading space: callers trim
		{`{"seq":0, "type" : "read" ,"rid":"r1","conv_id":"7"}`, true, Frame{Type: "read", RID: "r1", ConvID: 7}},
		{`{"type":"ping"}`, true, Frame{Type: "ping"}},
		{`{"type":"a","type":"b"}`, true, Frame{Type: "b"}}, // the last one wins, as in encoding/json
		{`{"seq":18446744073709551615,"type":"x"}`, true, Frame{Type: "x", Seq: 1<<64 - 1}},
		{`{"seq":18446744073709551616}`, false, Frame{}}, // overflow
		{`{"seq":01}`, false, Frame{}},
		{`{"seq":-1}`, false, Frame{}},
		{`{"seq":1.0}`, false, Frame{}},
		{`{"seq":1e3}`, false, Frame{}},
		{`{"seq":null}`, false, Frame{}},
		{`{"conv_id":7}`, false, Frame{}},
		{`{"conv_id":""}`, false, Frame{}},
		{`{"Type":"ping"}`, false, Frame{}}, // encoding/json matches keys case-insensitively
		{`{"type":"p\u0069ng"}`, false, Frame{}},
		{`{"type":"ping","body":"x"}`, false, Frame{}},
		{`{"type":"ping"} `, false, Frame{}},
		{`{"type":"ping"}}`, false, Frame{}},
		{`{"type":"ping",}`, false, Frame{}},
		{`{}`, false, Frame{}},
		{`{"type":"ping"`, false, Frame{}},
	}
	for _, tt := range tests {
		f, ok := decodeSmall([]byte(tt.in))
		if ok != tt.ok {
			t.Errorf("decodeSmall(%s) ok = %v, want %v", tt.in, ok, tt.ok)
			continue
		}
		if ok && !reflect.DeepEqual(*f, tt.want) {
			t.Errorf("decodeSmall(%s) = %+v, want %+v", tt.in, *f, tt.want)
		}
	}
}

// FuzzDecodeSmallMatchesJSON: whatever decodeSmall accepts, encoding/json
// accepts too, with the same frame.
func FuzzDecodeSmallMatchesJSON(f *testing.F) {
	for _, s := range []string{
		`{"type":"delivered","conv_id":"1","seq":2}`, `{"type":"read","rid":"x","conv_id":"9","seq":0}`,
		`{"type":"ping"}`, `{"seq":18446744073709551615}`, `{"rid":"é","type":"t"}`, `{"type":"a",  "type":"b"}`,
		`{"conv_id":"01"}`, `{"seq":1}x`, "{\"type\":\"a\"\n}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		data = bytes.TrimSpace(data)
		if !utf8.Valid(data) {
			return // DecodeClient refuses it before
		}
		got, ok := decodeSmall(data)
		if !ok {
			return
		}
		var want Frame
		if err := json.Unmarshal(data, &want); err != nil {
			t.Fatalf("decodeSmall accepted %q, encoding/json refuses it: %v", data, err)
		}
		if !reflect.DeepEqual(*got, want) {
			t.Fatalf("decodeSmall(%q) = %+v, encoding/json gives %+v", data, *got, want)
		}
	})
}

func BenchmarkDecodeClientDelivered(b *testing.B) {
	data := []byte(`{"type":"delivered","conv_id":"386034167425253376","seq":42}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, e := DecodeClient(data, DefaultLimits); e != nil {
			b.Fatal(e)
		}
	}
}

// DecodeClientInto decodes small frames into the caller's frame, without
// allocating, and leaves it zero for every other frame.
func TestDecodeClientIntoReusesTheFrame(t *testing.T) {
	lim := DefaultLimits
	var into Frame
	ack := []byte(`{"type":"delivered","conv_id":"12","seq":7}`)
	f, perr := DecodeClientInto(ack, lim, &into)
	if perr != nil || f != &into || f.Type != TypeDelivered || f.ConvID != 12 || f.Seq != 7 {
		t.Fatalf("DecodeClientInto(ack) = %p %+v, %v; want the given frame", f, f, perr)
	}
	into = Frame{}
	send := []byte(`{"type":"send","rid":"r1","conv_id":"12","client_msg_id":"c1","body":"hi"}`)
	f, perr = DecodeClientInto(send, lim, &into)
	if perr != nil || f == &into || f.Type != TypeSend || f.Body != "hi" || !reflect.DeepEqual(into, Frame{}) {
		t.Fatalf("DecodeClientInto(send) = %+v, %v, into %+v; want a new frame and into zero", f, perr, into)
	}
	bad := []byte(`{"type":"delivered","conv_id":"12","seq":7,"x":[}`)
	if _, perr = DecodeClientInto(bad, lim, &into); perr == nil || !reflect.DeepEqual(into, Frame{}) {
		t.Fatalf("DecodeClientInto(bad) = %v, into %+v; want an error and into zero", perr, into)
	}
	if n := testing.AllocsPerRun(100, func() {
		into = Frame{}
		_, _ = DecodeClientInto(ack, lim, &into)
	}); n != 0 {
		t.Errorf("DecodeClientInto of an ack allocates %v times, want 0", n)
	}
}
