package protocol

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestDecodeClient(t *testing.T) {
	lim := DefaultLimits
	sha := `"` + strings.Repeat("ab", 32) + `"`
	tests := []struct {
		name string
		in   string
		want Code // "" = valid
	}{
		{"ping", `{"type":"ping"}`, ""},
		{"send", `{"type":"send","rid":"1","conv_id":"7","client_msg_id":"a","body":"hi"}`, ""},
		{"send defaults kind", `{"type":"send","conv_id":"7","client_msg_id":"a","body":"hi","kind":""}`, ""},
		{"send other kind", `{"type":"send","conv_id":"7","client_msg_id":"a","body":"hi","kind":"recall"}`, CodeInvalidArgument},
		{"conv_id as number", `{"type":"send","conv_id":7,"client_msg_id":"a","body":"hi"}`, CodeBadFrame},
		{"empty", ``, CodeBadFrame},
		{"array", `[]`, CodeBadFrame},
		{"truncated", `{"type":"send"`, CodeBadFrame},
		{"no type", `{"rid":"1"}`, CodeBadFrame},
		{"unknown type", `{"type":"nope"}`, CodeUnknownType},
		{"server frame from client", `{"type":"ack"}`, CodeUnknownType},
		{"no body", `{"type":"send","conv_id":"7","client_msg_id":"a"}`, CodeInvalidArgument},
		{"long client_msg_id", `{"type":"send","conv_id":"7","client_msg_id":"` + strings.Repeat("a", 65) + `","body":"x"}`, CodeInvalidArgument},
		{"long rid", `{"type":"ping","rid":"` + strings.Repeat("r", 65) + `"}`, CodeInvalidArgument},
		// A recall's body (an E2E conversation's sealed recall) is vetted by
		// the service, which refuses it in a plaintext conversation.
		{"recall with body", `{"type":"recall","conv_id":"7","client_msg_id":"a","target_seq":1,"body":"x"}`, ""},
		{"recall with a long body", `{"type":"recall","conv_id":"7","client_msg_id":"a","target_seq":1,"body":"` + strings.Repeat("x", DefaultLimits.MaxBodyBytes+1) + `"}`, CodeTooLarge},
		{"edit without target", `{"type":"edit","conv_id":"7","client_msg_id":"a","body":"x"}`, CodeInvalidArgument},
		{"read without seq", `{"type":"read","conv_id":"7"}`, CodeInvalidArgument},
		{"react", `{"type":"react","conv_id":"7","client_msg_id":"a","target_seq":1,"emoji":"👍"}`, ""},
		{"react remove", `{"type":"react","conv_id":"7","client_msg_id":"a","target_seq":1,"emoji":"👍","remove":true}`, ""},
		{"react without emoji", `{"type":"react","conv_id":"7","client_msg_id":"a","target_seq":1}`, CodeInvalidArgument},
		{"react long emoji", `{"type":"react","conv_id":"7","client_msg_id":"a","target_seq":1,"emoji":"` + strings.Repeat("x", MaxEmojiBytes+1) + `"}`, CodeInvalidArgument},
		{"react without target", `{"type":"react","conv_id":"7","client_msg_id":"a","emoji":"👍"}`, CodeInvalidArgument},
		{"react with body", `{"type":"react","conv_id":"7","client_msg_id":"a","target_seq":1,"emoji":"👍","body":"x"}`, CodeInvalidArgument},
		{"react as a reply", `{"type":"react","conv_id":"7","client_msg_id":"a","target_seq":1,"emoji":"👍","reply_to":1}`, CodeInvalidArgument},
		{"sync empty", `{"type":"sync"}`, CodeInvalidArgument},
		{"sync all", `{"type":"sync","all":true}`, ""},
		{"sync zero conv", `{"type":"sync","convs":[{"conv_id":"0","after_seq":1}]}`, CodeInvalidArgument},
		{"history both bounds", `{"type":"history","conv_id":"7","after_seq":0,"before_seq":5}`, CodeInvalidArgument},
		{"history forward from 0", `{"type":"history","conv_id":"7","after_seq":0}`, ""},
		{"history limit", `{"type":"history","conv_id":"7","limit":201}`, CodeInvalidArgument},
		{"open_direct bad peer", `{"type":"open_direct","peer":"a b"}`, CodeInvalidArgument},
		{"create_group bad member", `{"type":"create_group","members":["ok","bad/"]}`, CodeInvalidArgument},
		{"add_members none", `{"type":"add_members","conv_id":"7"}`, CodeInvalidArgument},
		{"send file", `{"type":"send","conv_id":"7","client_msg_id":"a","kind":"file","attachment_id":"9"}`, ""},
		{"send file with caption", `{"type":"send","conv_id":"7","client_msg_id":"a","kind":"file","attachment_id":"9","body":"{\"caption\":\"hi\"}"}`, ""},
		{"send file without attachment", `{"type":"send","conv_id":"7","client_msg_id":"a","kind":"file","body":"x"}`, CodeInvalidArgument},
		{"send file with a long body", `{"type":"send","conv_id":"7","client_msg_id":"a","kind":"file","attachment_id":"9","body":"` + strings.Repeat("x", DefaultLimits.MaxBodyBytes+1) + `"}`, CodeTooLarge},
		{"send file coalesced", `{"type":"send","conv_id":"7","client_msg_id":"a","kind":"file","attachment_id":"9","coalesce_key":"k"}`, CodeInvalidArgument},
		{"send text with attachment", `{"type":"send","conv_id":"7","client_msg_id":"a","body":"x","attachment_id":"9"}`, CodeInvalidArgument},
		{"send state with attachment", `{"type":"send","conv_id":"7","client_msg_id":"a","body":"x","kind":"state","coalesce_key":"k","attachment_id":"9"}`, CodeInvalidArgument},
		{"edit with attachment", `{"type":"edit","conv_id":"7","client_msg_id":"a","target_seq":1,"body":"x","attachment_id":"9"}`, CodeInvalidArgument},
		{"recall with attachment", `{"type":"recall","conv_id":"7","client_msg_id":"a","target_seq":1,"attachment_id":"9"}`, CodeInvalidArgument},
		{"invalid utf-8", "{\"type\":\"ping\",\"rid\":\"\xff\"}", CodeBadFrame},
		{"upload_create", `{"type":"upload_create","rid":"u","conv_id":"7","size":10,"sha256":` + sha + `,"media_type":"image/png","name":"cat.png"}`, ""},
		{"upload_create empty file", `{"type":"upload_create","conv_id":"7","sha256":` + sha + `,"media_type":"text/plain","name":"empty"}`, ""},
		{"upload_create unicode name", `{"type":"upload_create","conv_id":"7","size":1,"sha256":` + sha + `,"media_type":"text/plain","name":"Grüße 📎.txt"}`, ""},
		{"upload_create no conv", `{"type":"upload_create","size":1,"sha256":` + sha + `,"media_type":"text/plain","name":"a"}`, CodeInvalidArgument},
		{"upload_create negative size", `{"type":"upload_create","conv_id":"7","size":-1,"sha256":` + sha + `,"media_type":"text/plain","name":"a"}`, CodeInvalidArgument},
		{"upload_create upper hex", `{"type":"upload_create","conv_id":"7","size":1,"sha256":"` + strings.Repeat("A", 64) + `","media_type":"text/plain","name":"a"}`, CodeInvalidArgument},
		{"upload_create short hash", `{"type":"upload_create","conv_id":"7","size":1,"sha256":"abc","media_type":"text/plain","name":"a"}`, CodeInvalidArgument},
		{"upload_create no media type", `{"type":"upload_create","conv_id":"7","size":1,"sha256":` + sha + `,"name":"a"}`, CodeInvalidArgument},
		{"upload_create media type without slash", `{"type":"upload_create","conv_id":"7","size":1,"sha256":` + sha + `,"media_type":"png","name":"a"}`, CodeInvalidArgument},
		{"upload_create media type with space", `{"type":"upload_create","conv_id":"7","size":1,"sha256":` + sha + `,"media_type":"text/plain; charset=utf-8","name":"a"}`, CodeInvalidArgument},
		{"upload_create long media type", `{"type":"upload_create","conv_id":"7","size":1,"sha256":` + sha + `,"media_type":"a/` + strings.Repeat("b", 126) + `","name":"a"}`, CodeInvalidArgument},
		{"upload_create no name", `{"type":"upload_create","conv_id":"7","size":1,"sha256":` + sha + `,"media_type":"text/plain"}`, CodeInvalidArgument},
		{"upload_create name with slash", `{"type":"upload_create","conv_id":"7","size":1,"sha256":` + sha + `,"media_type":"text/plain","name":"../etc/passwd"}`, CodeInvalidArgument},
		{"upload_create name with backslash", `{"type":"upload_create","conv_id":"7","size":1,"sha256":` + sha + `,"media_type":"text/plain","name":"a\\b"}`, CodeInvalidArgument},
		{"upload_create name with newline", `{"type":"upload_create","conv_id":"7","size":1,"sha256":` + sha + `,"media_type":"text/plain","name":"a\nb"}`, CodeInvalidArgument},
		{"upload_create name with C1 control", `{"type":"upload_create","conv_id":"7","size":1,"sha256":` + sha + `,"media_type":"text/plain","name":"a\u0085b"}`, CodeInvalidArgument},
		{"upload_create long name", `{"type":"upload_create","conv_id":"7","size":1,"sha256":` + sha + `,"media_type":"text/plain","name":"` + strings.Repeat("n", 256) + `"}`, CodeInvalidArgument},
		{"upload_status", `{"type":"upload_status","attachment_id":"9"}`, ""},
		{"upload_status no id", `{"type":"upload_status"}`, CodeInvalidArgument},
		{"upload_status id as number", `{"type":"upload_status","attachment_id":9}`, CodeBadFrame},
		{"upload_part", `{"type":"upload_part","attachment_id":"9","part":1}`, ""},
		{"upload_part no part", `{"type":"upload_part","attachment_id":"9"}`, CodeInvalidArgument},
		{"upload_part over the most parts", `{"type":"upload_part","attachment_id":"9","part":10001}`, CodeInvalidArgument},
		{"upload_part no id", `{"type":"upload_part","part":1}`, CodeInvalidArgument},
		{"upload_complete", `{"type":"upload_complete","attachment_id":"9"}`, ""},
		{"upload_complete no id", `{"type":"upload_complete"}`, CodeInvalidArgument},
		{"attachment_url", `{"type":"attachment_url","conv_id":"7","seq":3,"thumbnail":true}`, ""},
		{"attachment_url no seq", `{"type":"attachment_url","conv_id":"7"}`, CodeInvalidArgument},
		{"attachment_url no conv", `{"type":"attachment_url","seq":3}`, CodeInvalidArgument},
		{"upload answer from client", `{"type":"upload"}`, CodeUnknownType},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeClient([]byte(tc.in), lim)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("got %v, want valid", err)
			case tc.want != "" && (err == nil || err.Code != tc.want):
				t.Fatalf("got %v, want code %s", err, tc.want)
			}
		})
	}
}

func TestDecodeKeepsRIDOnError(t *testing.T) {
	f, err := DecodeClient([]byte(`{"type":"send","rid":"r42","conv_id":"7"}`), DefaultLimits)
	if err == nil || f == nil || f.RID != "r42" {
		t.Fatalf("got frame %+v err %v, want rid r42 and an error", f, err)
	}
}

func TestFrameTooLarge(t *testing.T) {
	lim := DefaultLimits
	lim.MaxFrameBytes = 10
	if _, err := DecodeClient([]byte(`{"type":"ping","x":"long"}`), lim); err == nil || err.Code != CodeTooLarge {
		t.Fatalf("got %v, want too_large", err)
	}
}

// FuzzDecodeClient: any input either fails with a documented code or yields
// a frame that passes validation again after a JSON round trip.
func FuzzDecodeClient(f *testing.F) {
	for _, s := range []string{
		`{"type":"ping"}`,
		`{"type":"send","rid":"1","conv_id":"7","client_msg_id":"a","body":"hi"}`,
		`{"type":"sync","all":true,"convs":[{"conv_id":"3","after_seq":9}]}`,
		`{"type":"history","conv_id":"7","after_seq":0,"limit":5}`,
		`{"type":"edit","conv_id":"7","client_msg_id":"a","target_seq":1,"body":"x"}`,
		`{"type":"react","conv_id":"7","client_msg_id":"a","target_seq":1,"emoji":"👍","remove":true}`,
		`{"type":"create_group","name":"n","members":["a","b"]}`,
		`{"type":"kt_consistency","from":1,"to":2}`,
		`{"type":"kt_leaves","from":5,"limit":10}`,
		`{"type":"upload_create","rid":"u","conv_id":"7","size":10,"sha256":"` + strings.Repeat("0f", 32) + `","media_type":"image/png","name":"cat.png"}`,
		`{"type":"upload_status","attachment_id":"9"}`,
		`{"type":"upload_part","attachment_id":"9","part":2}`,
		`{"type":"upload_complete","rid":"c","attachment_id":"9"}`,
		`{"type":"attachment_url","conv_id":"7","seq":3,"thumbnail":true}`,
		`{"type":"send","conv_id":"7","client_msg_id":"a","kind":"file","attachment_id":"9","body":"{}"}`,
		`{"type":"push_register","push":{"provider":"apns","token":"ab01","topic":"im.parley.app","sandbox":true}}`,
		`{"type":"push_register","push":{"provider":"fcm","token":"t:APA91b"}}`,
		`{"type":"search","rid":"s","query":{"text":"北京 meeting","conv_id":"7","sender":"alice","from_seq":2,"to_seq":9,"from_time":1,"to_time":2,"kind":"file","order":"relevance","limit":5,"cursor":"eyJvIjowfQ"}}`,
		`{"type":"push_register","push":{"provider":"webpush","endpoint":"https://p.example/e","p256dh":"BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4","auth":"BTBZMqHH6r4Tts7J_aSIgg"}}`,
		`{"type":"push_remove"}`, `{"type":"push_remove","push":{"provider":"webpush","endpoint":"https://p.example/e"}}`,
		`[`, ``, `{"type":null}`,
	} {
		f.Add([]byte(s))
	}
	known := map[Code]bool{CodeBadFrame: true, CodeUnknownType: true, CodeInvalidArgument: true, CodeTooLarge: true}
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := DecodeClient(data, DefaultLimits)
		if err != nil {
			if !known[err.Code] {
				t.Fatalf("undocumented code %q for %q", err.Code, data)
			}
			return
		}
		again, jerr := json.Marshal(fr)
		if jerr != nil {
			t.Fatalf("re-encode: %v", jerr)
		}
		if _, err := DecodeClient(again, DefaultLimits); err != nil {
			t.Fatalf("accepted %q but rejected its re-encoding %q: %v", data, again, err)
		}
	})
}
