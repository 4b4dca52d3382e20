package schema

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/parley-im/parley/protocol"
)

// TestSchemaCompiles: both documents compile, and every $defs entry of
// frames.json is reachable.
func TestSchemaCompiles(t *testing.T) {
	var doc struct {
		Defs map[string]json.RawMessage `json:"$defs"`
	}
	if err := json.Unmarshal(FramesJSON, &doc); err != nil {
		t.Fatal(err)
	}
	for name := range doc.Defs {
		if _, err := compile(framesURL + "#/$defs/" + name); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestServerFrames: frames the server encodes validate, and drift (an
// undocumented field, a missing list, a wrong type) is caught.
func TestServerFrames(t *testing.T) {
	good := []*protocol.Frame{
		{Type: protocol.TypePong, RID: "1", ServerTime: 5},
		{Type: protocol.TypeAck, RID: "2", ConvID: 7, ClientMsgID: "c", Seq: 1, MsgID: 1 << 60, ServerTime: 5},
		{Type: protocol.TypeMsg, Message: &protocol.Message{ConvID: 7, Seq: 1, MsgID: 9, Sender: "a", Kind: "text", Body: "hi", ServerTime: 1}},
		{Type: protocol.TypeError, Code: protocol.CodeOverloaded, Error: "x", RetryAfter: 10},
		{Type: protocol.TypeConvList},
		{Type: protocol.TypeSnapshot, RID: "3"},
		{Type: protocol.TypePresence, RID: "3"},
	}
	for _, f := range good {
		f.FillLists()
		data, _ := json.Marshal(f)
		if err := ServerFrame(data); err != nil {
			t.Errorf("%s: %v", data, err)
		}
	}
	for _, bad := range []string{
		`{"type":"pong","server_time":1,"surprise":true}`,
		`{"type":"conv_list"}`,
		`{"type":"ack","conv_id":7,"client_msg_id":"c","seq":1,"msg_id":"1","server_time":1}`,
		`{"type":"nonsense"}`,
		`{"type":"error","code":"made_up","error":"x"}`,
	} {
		if err := ServerFrame([]byte(bad)); err == nil {
			t.Errorf("%s validated", bad)
		}
	}
}

func TestHTTPAnswer(t *testing.T) {
	if err := HTTPAnswer("GET", "/v1/conversations/snapshot", 200, "application/json", []byte(`{"snapshot":[]}`)); err != nil {
		t.Fatal(err)
	}
	if err := HTTPAnswer("GET", "/v1/conversations/snapshot", 401, "application/json", []byte(`{"code":"unauthorized","error":"no"}`)); err != nil {
		t.Fatal(err)
	}
	if err := HTTPAnswer("GET", "/v1/conversations/snapshot", 200, "application/json", []byte(`{}`)); err == nil {
		t.Fatal("missing snapshot validated")
	}
	if err := HTTPAnswer("GET", "/v1/conversations/snapshot", 418, "application/json", []byte(`{}`)); err == nil {
		t.Fatal("undocumented status validated")
	}
	if err := HTTPAnswer("POST", "/v1/rpc", 200, "application/json", []byte(`{"type":"ok","rid":"1"}`)); err != nil {
		t.Fatal(err)
	}
	// A path template's instance.
	if err := HTTPAnswer("GET", "/web/app.js", 200, "text/javascript", []byte("x")); err != nil {
		t.Fatal(err)
	}
	// A media type range (*/*) documents whatever type a download is
	// served with.
	for _, ct := range []string{"image/png", "application/octet-stream", "text/plain; charset=utf-8"} {
		if err := HTTPAnswer("GET", "/v1/files/123", 206, ct, []byte("bytes")); err != nil {
			t.Errorf("%s: %v", ct, err)
		}
	}
	if err := HTTPAnswer("GET", "/v1/files/123", 403, "application/json", []byte(`{"code":"not_member"}`)); err == nil {
		t.Fatal("an error without its message validated")
	}
	if err := HTTPAnswer("GET", "/web/app.js/more", 200, "text/javascript", []byte("x")); err == nil {
		t.Fatal("a path of no template validated")
	}
}

// TestFileFrames: the frames and the body of file messages validate.
func TestFileFrames(t *testing.T) {
	for _, f := range []*protocol.Frame{
		{Type: protocol.TypeMsg, Message: &protocol.Message{ConvID: 7, Seq: 1, MsgID: 9, Sender: "a", Kind: protocol.KindFile, Body: "{}", ServerTime: 1, AttachmentID: 5}},
		{Type: protocol.TypeAttachment, RID: "1", Attachment: &protocol.AttachmentInfo{AttachmentID: 5, ConvID: 7, Seq: 1, Size: 3,
			SHA256: "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", MediaType: "image/png", Name: "a.png",
			Thumbnail: protocol.ThumbReady, URL: "/v1/files/5?sig=x", URLExpiresAt: 9}},
	} {
		data, _ := json.Marshal(f)
		if err := ServerFrame(data); err != nil {
			t.Errorf("%s: %v", data, err)
		}
	}
	body, _ := json.Marshal(protocol.FileBody{AttachmentID: 5, Name: "a.png", Size: 3, MediaType: "image/png",
		SHA256: "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", Caption: "hi"})
	if err := Def("FileBody", body); err != nil {
		t.Errorf("%s: %v", body, err)
	}
	// A send of kind file needs attachment_id (and no body), other kinds
	// a body and no attachment_id.
	for in, ok := range map[string]bool{
		`{"type":"send","conv_id":"7","client_msg_id":"c","kind":"file","attachment_id":"5"}`:             true,
		`{"type":"send","conv_id":"7","client_msg_id":"c","kind":"file","attachment_id":"5","body":"{}"}`: true,
		`{"type":"send","conv_id":"7","client_msg_id":"c","body":"hi"}`:                                   true,
		`{"type":"send","conv_id":"7","client_msg_id":"c","kind":"file","body":"{}"}`:                     false,
		`{"type":"send","conv_id":"7","client_msg_id":"c"}`:                                               false,
		`{"type":"send","conv_id":"7","client_msg_id":"c","body":"hi","attachment_id":"5"}`:               false,
		`{"type":"attachment_url","rid":"1","conv_id":"7","seq":1,"thumbnail":true}`:                      true,
		`{"type":"attachment_url","rid":"1","conv_id":"7"}`:                                               false,
	} {
		if err := ClientFrame([]byte(in)); (err == nil) != ok {
			t.Errorf("%s: valid %v, want %v (%v)", in, err == nil, ok, err)
		}
	}
}

func BenchmarkServerFrame(b *testing.B) {
	f := &protocol.Frame{Type: protocol.TypeMsg, Message: &protocol.Message{ConvID: 7, Seq: 1, MsgID: 9, Sender: "a", Kind: "text", Body: "hi", ServerTime: 1}}
	data, _ := json.Marshal(f)
	for b.Loop() {
		if err := ServerFrame(data); err != nil {
			b.Fatal(err)
		}
	}
}

// TestClientTypesMatchSchema: the client frames frames.json documents are
// exactly protocol.ClientTypes (the types the server accepts and its
// metrics label frames by).
func TestClientTypesMatchSchema(t *testing.T) {
	documented := ClientTypes()
	if len(documented) < 20 {
		t.Fatalf("frames.json's ClientFrame has %d types: %v", len(documented), documented)
	}
	for _, typ := range protocol.ClientTypes {
		if !slices.Contains(documented, typ) {
			t.Errorf("protocol.ClientTypes has %q, which frames.json's ClientFrame lacks", typ)
		}
	}
	for _, typ := range documented {
		if !slices.Contains(protocol.ClientTypes, typ) {
			t.Errorf("frames.json documents the client frame %q, which protocol.ClientTypes lacks (add it: validation and the metrics' frame labels use the list)", typ)
		}
	}
}
