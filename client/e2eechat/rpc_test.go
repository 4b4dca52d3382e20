package e2eechat

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// The key directory frames work over the HTTP fallback (POST /v1/rpc),
// which shares the handler.
func TestKeyFramesOverHTTPRPC(t *testing.T) {
	srv := servertest.Start(t)
	startDev(t, srv, "alice", "phone", 2)
	rpc := func(user, frame string) protocol.Frame {
		req, _ := http.NewRequest("POST", srv.HTTPURL+"/v1/rpc?device=web", strings.NewReader(frame))
		req.Header.Set("Authorization", "Bearer "+srv.Token(user))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var f protocol.Frame
		if err := json.Unmarshal(b, &f); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		return f
	}
	f := rpc("alice", `{"type":"keys_devices","rid":"1","user_id":"alice"}`)
	if f.Type != protocol.TypeDevices || len(f.Devices) != 1 || f.Devices[0].DeviceID != "phone" {
		t.Fatalf("keys_devices over rpc: %+v", f)
	}
	f = rpc("alice", `{"type":"keys_bundle","rid":"2","user_id":"alice","device_id":"phone"}`)
	if f.Type != protocol.TypeBundles || len(f.Bundles) != 1 || f.Bundles[0].PreKey == nil {
		t.Fatalf("keys_bundle over rpc: %+v", f)
	}
	f = rpc("mallory", `{"type":"keys_bundle","rid":"3","user_id":"alice"}`)
	if f.Type != protocol.TypeError || f.Code != protocol.CodeForbidden {
		t.Fatalf("stranger over rpc: %+v", f)
	}
	f = rpc("alice", `{"type":"conv_info","rid":"5","conv_id":"12345"}`)
	if f.Type != protocol.TypeError || f.Code != protocol.CodeNotMember {
		t.Fatalf("conv_info of a stranger's conversation: %+v", f)
	}
	f = rpc("alice", `{"type":"keys_upload","rid":"4","keys":{"identity_key":"AAAA"}}`)
	if f.Type != protocol.TypeError || f.Code != protocol.CodeBadKey {
		t.Fatalf("bad key over rpc: %+v", f)
	}
}
