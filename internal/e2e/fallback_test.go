package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/gateway"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// pollClient speaks the HTTP fallback: GET /v1/poll and POST /v1/rpc.
type pollClient struct {
	t       *testing.T
	base    string
	token   string
	device  string
	session string
}

func (p *pollClient) do(method, path string, body []byte) (int, []byte) {
	p.t.Helper()
	req, _ := http.NewRequest(method, p.base+path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+p.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	return resp.StatusCode, buf.Bytes()
}

func (p *pollClient) poll(waitMS int) (int, []protocol.Frame) {
	p.t.Helper()
	q := "/v1/poll?device=" + p.device
	if p.session != "" {
		q += "&session=" + p.session + "&wait_ms=" + itoa(waitMS)
	}
	status, body := p.do("GET", q, nil)
	var out struct {
		Frames []protocol.Frame `json:"frames"`
	}
	if status == 200 {
		if err := json.Unmarshal(body, &out); err != nil {
			p.t.Fatalf("poll body %q: %v", body, err)
		}
	}
	return status, out.Frames
}

func (p *pollClient) rpc(f protocol.Frame) *protocol.Frame {
	p.t.Helper()
	data, _ := json.Marshal(f)
	status, body := p.do("POST", "/v1/rpc?device="+p.device+"&session="+p.session, data)
	var r protocol.Frame
	if status != 200 || json.Unmarshal(body, &r) != nil {
		p.t.Fatalf("rpc: %d %q", status, body)
	}
	return &r
}

func itoa(i int) string { return u64(uint64(i)) }

func TestHTTPFallbackSameSemantics(t *testing.T) {
	srv := servertest.Start(t, servertest.WithGateway(func(g *gateway.Config) {
		g.HeartbeatInterval = time.Second
		g.IdleTimeout = 3 * time.Second
		g.RetransmitAfter = 500 * time.Millisecond
	}))
	alice := &pollClient{t: t, base: srv.HTTPURL, token: srv.Token("alice"), device: "browser"}
	status, frames := alice.poll(0)
	if status != 200 || len(frames) != 1 || frames[0].Type != protocol.TypeHello {
		t.Fatalf("opening poll: %d %+v, want the hello", status, frames)
	}
	alice.session = frames[0].Hello.SessionID

	bob := dialRaw(t, srv, "bob", "phone")
	conv := bob.openDirect("alice")
	mustOK(t, bob.sendText(conv, "b1", "over http?"), protocol.TypeAck)

	_, frames = alice.poll(2000)
	if len(frames) != 1 || frames[0].Type != protocol.TypeMsg || frames[0].Message.Body != "over http?" {
		t.Fatalf("poll got %+v, want bob's message", frames)
	}
	// Not acknowledged: re-sent, like on a WebSocket. A poll waits at most
	// the heartbeat interval, and the re-send comes once RetransmitAfter has
	// passed at the gateway's next retransmission scan: poll until it does
	// (empty answers meanwhile are normal).
	var resent []protocol.Frame
	for i := 0; i < 20 && len(resent) == 0; i++ {
		_, resent = alice.poll(2000)
	}
	if len(resent) != 1 || resent[0].Type != protocol.TypeMsg || resent[0].Message.Seq != 1 {
		t.Fatalf("polls after the unacknowledged message got %+v, want it re-sent", resent)
	}
	if r := alice.rpc(protocol.Frame{Type: protocol.TypeDelivered, ConvID: conv, Seq: 1}); r.Type != protocol.TypeOK {
		t.Fatalf("delivered over rpc = %+v", r)
	}
	ack := alice.rpc(protocol.Frame{Type: protocol.TypeSend, RID: "1", ConvID: conv, ClientMsgID: "a1", Body: "yes"})
	if ack.Type != protocol.TypeAck || ack.Seq != 2 || ack.RID != "1" {
		t.Fatalf("send over rpc = %+v", ack)
	}
	if again := alice.rpc(protocol.Frame{Type: protocol.TypeSend, RID: "2", ConvID: conv, ClientMsgID: "a1", Body: "yes"}); !again.Duplicate || again.Seq != 2 {
		t.Fatalf("retried send over rpc = %+v, want duplicate seq 2", again)
	}
	for { // bob's own push of seq 1 may be re-sent meanwhile: he never acked it
		if m := bob.next(protocol.TypeMsg).Message; m.Seq == 2 {
			if m.Body != "yes" || m.Sender != "alice" {
				t.Fatalf("bob got %+v", m)
			}
			break
		}
	}
	if r := alice.rpc(protocol.Frame{Type: protocol.TypeHistory, RID: "h", ConvID: 999}); r.Code != protocol.CodeNotMember {
		t.Fatalf("history of a foreign conversation = %+v, want not_member", r)
	}
	// A session nobody polls expires with the idle timeout.
	time.Sleep(4500 * time.Millisecond)
	if status, _ := alice.poll(0); status != http.StatusNotFound {
		t.Fatalf("poll after idle timeout = %d, want 404", status)
	}
}
