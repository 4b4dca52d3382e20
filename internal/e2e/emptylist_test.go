package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-im/parley/internal/servertest"
)

// TestEmptyListsSameShape: an empty answer list is [] on the WebSocket as
// over HTTP (snapshot, history, conv_list, presence), never left out.
func TestEmptyListsSameShape(t *testing.T) {
	srv := servertest.Start(t)
	ws, _, err := dialRawErr(srv.URL, srv.Token("alice"), "d1")
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	_ = ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	read := func() map[string]json.RawMessage {
		t.Helper()
		for {
			_, data, err := ws.ReadMessage()
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal(data, &m); err != nil {
				t.Fatal(err)
			}
			if _, ok := m["rid"]; ok {
				return m
			}
		}
	}
	call := func(req string) map[string]json.RawMessage {
		t.Helper()
		if err := ws.WriteMessage(websocket.TextMessage, []byte(req)); err != nil {
			t.Fatal(err)
		}
		return read()
	}
	want := func(m map[string]json.RawMessage, key string) {
		t.Helper()
		if got := string(m[key]); got != "[]" {
			t.Fatalf("%s = %q in %v, want []", key, got, m)
		}
	}
	want(call(`{"type":"conv_list","rid":"1"}`), "list")
	want(call(`{"type":"sync","rid":"2","all":true}`), "snapshot")
	want(call(`{"type":"presence_sub","rid":"3","users":[]}`), "states")
	conv := call(`{"type":"open_direct","rid":"4","peer":"bob"}`)
	var info struct {
		Conv struct {
			ConvID string `json:"conv_id"`
		} `json:"conv"`
	}
	b, _ := json.Marshal(conv)
	if err := json.Unmarshal(b, &info); err != nil || info.Conv.ConvID == "" {
		t.Fatalf("open_direct: %s", b)
	}
	want(call(`{"type":"history","rid":"5","conv_id":"`+info.Conv.ConvID+`"}`), "messages")
	want(call(`{"type":"history","rid":"6","conv_id":"`+info.Conv.ConvID+`","after_seq":0}`), "messages")

	// The HTTP snapshot has the same shape.
	req, _ := http.NewRequest(http.MethodGet, srv.HTTPURL+"/v1/conversations/snapshot?all=true", nil)
	req.Header.Set("Authorization", "Bearer "+srv.Token("carol"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), `"snapshot":[]`) {
		t.Fatalf("HTTP snapshot %s", body)
	}
}
