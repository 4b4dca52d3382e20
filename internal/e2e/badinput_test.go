package e2e

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

func TestBadFramesGetCodesAndStoreNothing(t *testing.T) {
	srv := servertest.Start(t)
	alice := dialRaw(t, srv, "alice", "phone")
	conv := alice.openDirect("bob")
	mustOK(t, alice.sendText(conv, "ok1", "first"), protocol.TypeAck)
	eve := dialRaw(t, srv, "eve", "phone")

	tests := []struct {
		name string
		c    *rawConn
		raw  string
		want protocol.Code
	}{
		{"malformed JSON", alice, `{"type":"send","rid":"r1",`, protocol.CodeBadFrame},
		{"not an object", alice, `[1,2,3]`, protocol.CodeBadFrame},
		{"wrong field type", alice, `{"type":"send","rid":"r2","conv_id":12}`, protocol.CodeBadFrame},
		{"malformed id", alice, `{"type":"send","rid":"r2","conv_id":"x1"}`, protocol.CodeInvalidArgument},
		{"negative seq", alice, `{"type":"history","rid":"r2","conv_id":"1","after_seq":-1}`, protocol.CodeInvalidArgument},
		{"unknown type", alice, `{"type":"teleport","rid":"r3"}`, protocol.CodeUnknownType},
		{"missing type", alice, `{"rid":"r4"}`, protocol.CodeBadFrame},
		{"send without client_msg_id", alice, `{"type":"send","rid":"r5","conv_id":"` + u64(conv) + `","body":"x"}`, protocol.CodeInvalidArgument},
		{"body too large", alice, `{"type":"send","rid":"r6","conv_id":"` + u64(conv) + `","client_msg_id":"big","body":"` + strings.Repeat("a", protocol.DefaultLimits.MaxBodyBytes+1) + `"}`, protocol.CodeTooLarge},
		{"non-member send", eve, `{"type":"send","rid":"r7","conv_id":"` + u64(conv) + `","client_msg_id":"e1","body":"spam"}`, protocol.CodeNotMember},
		{"non-member history", eve, `{"type":"history","rid":"r8","conv_id":"` + u64(conv) + `"}`, protocol.CodeNotMember},
		{"non-member read", eve, `{"type":"read","rid":"r9","conv_id":"` + u64(conv) + `","seq":1}`, protocol.CodeNotMember},
		{"non-member sync", eve, `{"type":"sync","rid":"r10","convs":[{"conv_id":"` + u64(conv) + `","after_seq":0}]}`, protocol.CodeNotMember},
		{"unknown conversation", alice, `{"type":"send","rid":"r11","conv_id":"42","client_msg_id":"x","body":"x"}`, protocol.CodeNotMember},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.c.sendRaw(websocket.TextMessage, []byte(tc.raw))
			f := tc.c.next(protocol.TypeError)
			if f.Code != tc.want {
				t.Fatalf("code = %s (%s), want %s", f.Code, f.Error, tc.want)
			}
			// The connection stays usable.
			mustOK(t, tc.c.call(protocol.Frame{Type: protocol.TypePing}), protocol.TypePong)
		})
	}
	if h := alice.history(conv); len(h) != 1 {
		t.Fatalf("history has %d messages after bad input, want 1", len(h))
	}
}

func TestBadFramesCloseWithCodes(t *testing.T) {
	srv := servertest.Start(t)
	bystander := dialRaw(t, srv, "carol", "phone")
	tests := []struct {
		name string
		mt   int
		data []byte
		want int
	}{
		{"oversized frame", websocket.TextMessage, []byte(`{"type":"ping","x":"` + strings.Repeat("a", protocol.DefaultLimits.MaxFrameBytes) + `"}`), protocol.CloseTooBig},
		{"invalid UTF-8", websocket.TextMessage, []byte("{\"type\":\"ping\",\"rid\":\"\xff\xfe\"}"), protocol.CloseInvalidData},
		{"binary frame", websocket.BinaryMessage, []byte{1, 2, 3}, protocol.CloseUnsupportedData},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if raceBuild && tc.want == protocol.CloseTooBig {
				// On net/http (race builds) nbio queues the 1009 close frame
				// and drops the connection before it is written; the event
				// loop, which ships, is checked by the run without -race.
				t.Skip("close frame races the close on the race build's transport")
			}
			c := dialRaw(t, srv, "mallory", "d1")
			c.sendRaw(tc.mt, tc.data)
			if got := c.waitClose(); got != tc.want {
				t.Fatalf("close code = %d, want %d", got, tc.want)
			}
		})
	}
	t.Run("too many bad frames", func(t *testing.T) {
		c := dialRaw(t, srv, "mallory", "d2")
		for i := 0; i < 10; i++ {
			c.sendRaw(websocket.TextMessage, []byte(`nonsense`))
		}
		if got := c.waitClose(); got != protocol.CloseTooManyErrors {
			t.Fatalf("close code = %d, want %d", got, protocol.CloseTooManyErrors)
		}
	})
	// Other connections were never disturbed.
	mustOK(t, bystander.call(protocol.Frame{Type: protocol.TypePing}), protocol.TypePong)
}

func TestHandshakeRefusals(t *testing.T) {
	srv := servertest.Start(t)
	other := servertest.MintToken(t, []byte("0123456789abcdef0123456789abcdef-forged"), "alice", time.Hour)
	tests := []struct {
		name   string
		token  string
		device string
		status int
		code   protocol.Code
	}{
		{"no token", "", "d", http.StatusUnauthorized, protocol.CodeUnauthorized},
		{"forged token", other, "d", http.StatusUnauthorized, protocol.CodeUnauthorized},
		{"garbage token", "not.a.jwt", "d", http.StatusUnauthorized, protocol.CodeUnauthorized},
		{"expired token", servertest.MintToken(t, srv.Key(), "alice", -time.Hour), "d", http.StatusUnauthorized, protocol.CodeTokenExpired},
		{"bad device", srv.Token("alice"), "bad%20device", http.StatusBadRequest, protocol.CodeInvalidArgument},
		{"no device", srv.Token("alice"), "", http.StatusBadRequest, protocol.CodeInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ws, resp, err := dialRawErr(srv.URL, tc.token, tc.device)
			if err == nil {
				ws.Close()
				t.Fatal("handshake succeeded, want refusal")
			}
			if resp == nil || resp.StatusCode != tc.status {
				t.Fatalf("response = %v, want status %d", resp, tc.status)
			}
			var body struct {
				Code protocol.Code `json:"code"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.Code != tc.code {
				t.Fatalf("body code = %q (%v), want %q", body.Code, err, tc.code)
			}
		})
	}
}

func TestReplacedSessionIsClosed(t *testing.T) {
	srv := servertest.Start(t)
	first := dialRaw(t, srv, "alice", "phone")
	second := dialRaw(t, srv, "alice", "phone")
	if got := first.waitClose(); got != protocol.CloseReplaced {
		t.Fatalf("first connection close = %d, want %d", got, protocol.CloseReplaced)
	}
	// Pushes now reach the new connection.
	bob := dialRaw(t, srv, "bob", "phone")
	conv := bob.openDirect("alice")
	mustOK(t, bob.sendText(conv, "b1", "x"), protocol.TypeAck)
	if m := second.next(protocol.TypeMsg).Message; m.Seq != 1 {
		t.Fatalf("second got seq %d, want 1", m.Seq)
	}
}

func u64(v uint64) string { return strconv.FormatUint(v, 10) }
