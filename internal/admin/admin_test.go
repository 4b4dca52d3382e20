package admin

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/parley-im/parley/protocol"
	"github.com/parley-im/parley/protocol/schema"
)

// TestRoutesMatchOpenAPI: the server's routes are exactly the operations
// of protocol/schema/admin-openapi.json.
func TestRoutesMatchOpenAPI(t *testing.T) {
	doc := schema.AdminOperations()
	slices.Sort(doc)
	routes := slices.Clone(Routes)
	slices.Sort(routes)
	if !slices.Equal(doc, routes) {
		t.Fatalf("routes and admin-openapi.json differ:\nroutes %q\ndoc    %q", routes, doc)
	}
}

func TestDecode(t *testing.T) {
	var g groupReq
	if perr := decode([]byte(` {"owner":"a","members":["b"],"e2e":true} `), &g); perr != nil || g.Owner != "a" || !g.E2E {
		t.Fatalf("%+v %v", g, perr)
	}
	var empty banReq
	if perr := decode(nil, &empty); perr != nil {
		t.Fatalf("an empty body is an empty object: %v", perr)
	}
	for body, want := range map[string]string{
		`{"owner":1}`:           "owner must be a string, not number",
		`{"owner":"a","x":1}`:   `unknown field "x"`,
		`{"owner":"a"} {}`:      "the body holds more than one JSON value",
		`[]`:                    "the body is not a JSON object",
		`{"owner":`:             "the body is not valid JSON",
		"{\"owner\":\"\xff\"}":  "the body is not valid UTF-8",
		`{"members":"a"}`:       "members must be an array, not string",
		`{"e2e":"yes"}`:         "e2e must be a boolean, not string",
		`{"members":[1]}`:       "members must be a string, not number",
		`{"owner":"a","owner2"`: "the body is not valid JSON",
	} {
		var r groupReq
		perr := decode([]byte(body), &r)
		if perr == nil || perr.Code != protocol.CodeBadFrame {
			t.Errorf("%s: %v, want bad_frame", body, perr)
			continue
		}
		if len(perr.Msg) < len(want) || perr.Msg[:len(want)] != want {
			t.Errorf("%s: message %q, want it to start %q", body, perr.Msg, want)
		}
	}
	var m muteReq
	if perr := decode([]byte(`{"muted":false}`), &m); perr != nil || m.Muted == nil || *m.Muted {
		t.Fatalf("muted false: %+v %v", m, perr)
	}
	var rv revokeReq
	if perr := decode([]byte(`{"before":1.5}`), &rv); perr == nil || perr.Code != protocol.CodeBadFrame {
		t.Fatalf("fractional before: %v", perr)
	}
}

// FuzzAdminDecoders: no body makes a decoder panic or answer anything but
// bad_frame; what decodes re-encodes to a body that decodes the same.
func FuzzAdminDecoders(f *testing.F) {
	for _, s := range []string{
		`{"users":["a","b"],"e2e":true}`, `{"owner":"a","name":"n","members":["b"]}`, `{"role":"owner"}`,
		`{"muted":true}`, `{"as":"system","client_msg_id":"c","text":"t"}`, `{"sender":"a","client_msg_id":"c","body":"b","mentions":["x"]}`,
		`{"client_msg_id":"c","body":"b"}`, `{"reason":"r"}`, `{"before":1700000000000,"device":"d"}`, `{"device":"d"}`,
		``, `{}`, `[]`, `null`, `{"users":null}`, `{"before":-1}`, `{"muted":null}`, "\xff", `{"a":{"b":[1,2,{}]}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzOne[directReq](t, body)
		fuzzOne[groupReq](t, body)
		fuzzOne[membersReq](t, body)
		fuzzOne[roleReq](t, body)
		fuzzOne[muteReq](t, body)
		fuzzOne[messageReq](t, body)
		fuzzOne[editReq](t, body)
		fuzzOne[banReq](t, body)
		fuzzOne[revokeReq](t, body)
		fuzzOne[disconnectReq](t, body)
		var g groupReq
		if decode(body, &g) == nil {
			if perr := validUsers("members", g.Members, 100); perr != nil && perr.Code != protocol.CodeInvalidArgument && perr.Code != protocol.CodeTooLarge {
				t.Fatalf("validUsers: %v", perr)
			}
		}
	})
}

func fuzzOne[T any](t *testing.T, body []byte) {
	var v T
	perr := decode(body, &v)
	if perr != nil {
		if perr.Code != protocol.CodeBadFrame || perr.Msg == "" {
			t.Fatalf("%q: %v, want bad_frame with a message", body, perr)
		}
		return
	}
	again, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("%q decoded to %+v, which does not encode: %v", body, v, err)
	}
	var w T
	if perr := decode(again, &w); perr != nil {
		t.Fatalf("%q → %s does not decode again: %v", body, again, perr)
	}
	b2, _ := json.Marshal(w)
	if string(b2) != string(again) {
		t.Fatalf("round trip changed %s into %s", again, b2)
	}
}
