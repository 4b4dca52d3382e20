package clustertest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	natsio "github.com/nats-io/nats.go"

	"github.com/parley-im/parley/internal/cluster/lease"
	"github.com/parley-im/parley/protocol"
	"github.com/parley-im/parley/protocol/schema"
)

// startWith starts one more process of the cluster with extra flags.
func (c *Cluster) startWith(name, role string, extra ...string) *Proc {
	c.t.Helper()
	p := &Proc{Name: name, Addr: freeAddr(c.t)}
	p.args = append(append([]string{"serve", "--roles", role, "--node-id", name, "--listen", p.Addr,
		"--data-dir", filepath.Join(c.dir, name)}, c.common...), extra...)
	c.run(p)
	c.mu.Lock()
	c.procs[name] = p
	c.mu.Unlock()
	return p
}

// adminPost calls the server API of the process at addr.
func adminPost(t *testing.T, addr, key, path, body string) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+addr+path, bytes.NewReader([]byte(body)))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: %d %s", path, resp.StatusCode, data)
	}
}

// closeCode waits (at most a generous minute) for the server to close ws
// and returns the close code and how long it took from start.
func closeCode(t *testing.T, ws *websocket.Conn, start time.Time) (int, time.Duration) {
	t.Helper()
	_ = ws.SetReadDeadline(time.Now().Add(time.Minute))
	for {
		_, _, err := ws.ReadMessage()
		if err == nil {
			continue
		}
		var ce *websocket.CloseError
		if errors.As(err, &ce) {
			return ce.Code, time.Since(start)
		}
		t.Fatalf("connection ended without a close frame: %v", err)
	}
}

// handshakeStatus is the HTTP status of a handshake with tok on g (101 on
// success, the connection then closed).
func handshakeStatus(g *Proc, tok, device string) int {
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
	ws, resp, err := d.Dial(g.URL()+"/v1/ws?device="+device, http.Header{"Authorization": {"Bearer " + tok}})
	if err == nil {
		ws.Close()
		return http.StatusSwitchingProtocols
	}
	if resp == nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestAdminBanAcrossProcesses: the server API on a chat process bans,
// revokes and disconnects users whose connections are on other gateway
// processes: the access list travels through Redis (each gateway polls
// it), disconnects through the registry and NATS. Open connections close
// with the documented codes; new handshakes on any gateway are refused;
// a gateway started after the ban refuses from its first handshake.
func TestAdminBanAcrossProcesses(t *testing.T) {
	c := Start(t, Options{})
	keyb := make([]byte, 32)
	_, _ = rand.Read(keyb)
	key := hex.EncodeToString(keyb)
	adminAddr := freeAddr(t)
	c.Chats = append(c.Chats, c.startWith("c1-"+c.keyspace, "chat", "--admin.listen", adminAddr, "--admin.key", key))
	g1 := c.startWith("g1-"+c.keyspace, "gateway")
	g2 := c.startWith("g2-"+c.keyspace, "gateway")
	c.Gateways = append(c.Gateways, g1, g2)

	alice, err := dialRaw(c, g2, "alice", "phone")
	if err != nil {
		t.Fatal(err)
	}
	bob, err := dialRaw(c, g1, "bob", "phone")
	if err != nil {
		t.Fatal(err)
	}
	carol, err := dialRaw(c, g2, "carol", "phone")
	if err != nil {
		t.Fatal(err)
	}
	// The chat tier answers through both gateways.
	if f, err := bob.call(protocol.Frame{Type: protocol.TypePing}, 10*time.Second); err != nil || f.Type != protocol.TypePong {
		t.Fatalf("ping through g1: %v %v", f, err)
	}

	start := time.Now()
	adminPost(t, adminAddr, key, "/v1/admin/users/alice/ban", `{"reason":"test"}`)
	code, took := closeCode(t, alice.ws, start)
	if code != protocol.CloseBanned {
		t.Fatalf("alice's connection on g2 closed with %d, want %d", code, protocol.CloseBanned)
	}
	t.Logf("ban → close on another gateway process: %v (documented bound 2 s)", took)
	for _, g := range []*Proc{g1, g2} {
		if st := handshakeStatus(g, c.Token("alice"), "tablet"); st != http.StatusForbidden {
			t.Fatalf("alice's handshake on %s after the ban: %d, want 403", g.Name, st)
		}
	}

	start = time.Now()
	adminPost(t, adminAddr, key, "/v1/admin/users/carol/revoke", `{}`)
	code, took = closeCode(t, carol.ws, start)
	if code != protocol.CloseTokenRevoked {
		t.Fatalf("carol's connection closed with %d, want %d", code, protocol.CloseTokenRevoked)
	}
	t.Logf("revoke → close on another gateway process: %v", took)

	start = time.Now()
	adminPost(t, adminAddr, key, "/v1/admin/users/bob/disconnect", `{"device":"phone"}`)
	code, took = closeCode(t, bob.ws, start)
	if code != protocol.CloseDisconnected {
		t.Fatalf("bob's connection on g1 closed with %d, want %d", code, protocol.CloseDisconnected)
	}
	t.Logf("disconnect → close on another gateway process: %v", took)
	if _, err := dialRaw(c, g1, "bob", "phone"); err != nil {
		t.Fatalf("bob may reconnect after a disconnect: %v", err)
	}

	// A gateway that starts now loads the ban from Redis.
	g3 := c.startWith("g3-"+c.keyspace, "gateway")
	c.Gateways = append(c.Gateways, g3)
	if st := handshakeStatus(g3, c.Token("alice"), "phone"); st != http.StatusForbidden {
		t.Fatalf("alice's handshake on a gateway started after the ban: %d, want 403", st)
	}
	if st := handshakeStatus(g3, c.Token("dave"), "phone"); st != http.StatusSwitchingProtocols {
		t.Fatalf("dave's handshake on g3: %d, want 101", st)
	}
}

// adminCall calls the server API at addr and returns the status and body;
// every answer is checked against protocol/schema/admin-openapi.json.
func adminCall(t *testing.T, addr, key, method, path string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, _ := http.NewRequest(method, "http://"+addr+path, rd)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err := schema.AdminAnswer(method, req.URL.Path, resp.StatusCode, resp.Header.Get("Content-Type"), data); err != nil {
		t.Errorf("%s %s: answer not in admin-openapi.json: %v (%.300s)", method, path, err, data)
	}
	return resp.StatusCode, data
}

// adminOK is adminCall that must answer 200; it decodes the answer into out.
func adminOK(t *testing.T, addr, key, method, path string, body, out any) {
	t.Helper()
	status, data := adminCall(t, addr, key, method, path, body)
	if status != http.StatusOK {
		t.Fatalf("%s %s: %d %s, want 200", method, path, status, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: %v (%s)", method, path, err, data)
		}
	}
}

// adminFails is adminCall that must answer status with code.
func adminFails(t *testing.T, addr, key, method, path string, body any, status int, code protocol.Code) {
	t.Helper()
	st, data := adminCall(t, addr, key, method, path, body)
	var e struct {
		Code protocol.Code `json:"code"`
	}
	_ = json.Unmarshal(data, &e)
	if st != status || e.Code != code {
		t.Fatalf("%s %s: %d %s, want %d %s", method, path, st, data, status, code)
	}
}

type adminConvAns struct {
	Conv protocol.ConvInfo `json:"conv"`
}

type adminAckAns struct {
	Ack struct {
		ConvID    uint64 `json:"conv_id,string"`
		Seq       uint64 `json:"seq"`
		MsgID     uint64 `json:"msg_id,string"`
		Duplicate bool   `json:"duplicate"`
	} `json:"ack"`
}

// pushed waits (generously) until l has been pushed seq of conv.
func (l *liveConn) pushed(conv, seq uint64) protocol.Message {
	l.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		l.mu.Lock()
		m, ok := l.pushes[conv][seq]
		l.mu.Unlock()
		if ok {
			return m
		}
		if time.Now().After(deadline) {
			l.t.Fatalf("%s: conv %d seq %d never pushed", l.user, conv, seq)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func sysEvent(t *testing.T, m protocol.Message) protocol.SystemEvent {
	t.Helper()
	var ev protocol.SystemEvent
	if m.Kind != protocol.KindSystem || json.Unmarshal([]byte(m.Body), &ev) != nil {
		t.Fatalf("seq %d is not a system event: %+v", m.Seq, m)
	}
	return ev
}

// TestAdminWritesReachTheOwner: the server API runs on one of two chat
// processes; every kind of conversation write it makes (create, add and
// remove members, roles, mute, send as a user, a bot and the system,
// delete for everyone, moderation edit) succeeds on conversations whose
// partition the OTHER chat process owns (forwarded to the owner over
// NATS) as on those it owns itself, with the client path's permissions
// and dense seqs, and clients on two gateway processes get every event.
func TestAdminWritesReachTheOwner(t *testing.T) {
	c := Start(t, Options{})
	keyb := make([]byte, 32)
	_, _ = rand.Read(keyb)
	key := hex.EncodeToString(keyb)
	api := freeAddr(t)
	c1 := c.startWith("c1-"+c.keyspace, "chat", "--admin.listen", api, "--admin.key", key)
	c2 := c.startWith("c2-"+c.keyspace, "chat")
	c.Chats = append(c.Chats, c1, c2)
	g1 := c.startWith("g1-"+c.keyspace, "gateway")
	g2 := c.startWith("g2-"+c.keyspace, "gateway")
	c.Gateways = append(c.Gateways, g1, g2)
	alice := dialLive(t, c, g1, "alice")
	bob := dialLive(t, c, g2, "bob")

	// Groups created through the API until each chat process owns one.
	// Ownership settles once both processes have run a few lease rounds.
	time.Sleep(3 * time.Second)
	byOwner := map[string]uint64{}
	for i := 0; len(byOwner) < 2; i++ {
		if i == 40 {
			t.Fatalf("40 groups, owners %v: the partitions did not spread over both chat processes", byOwner)
		}
		var g adminConvAns
		adminOK(t, api, key, "POST", "/v1/admin/conversations/group", map[string]any{"owner": "alice", "name": fmt.Sprint("g", i), "members": []string{"bob"}}, &g)
		node, _ := c.waitOwner(g.Conv.ConvID, "", 10*time.Second)
		if _, ok := byOwner[node]; !ok {
			byOwner[node] = g.Conv.ConvID
		}
	}
	// A direct conversation created through the API is one for its users.
	var d adminConvAns
	adminOK(t, api, key, "POST", "/v1/admin/conversations/direct", map[string]any{"users": []string{"alice", "bob"}}, &d)
	if f := bob.call(protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "alice"}, protocol.TypeConv); f.Conv.ConvID != d.Conv.ConvID {
		t.Fatalf("bob's direct conversation with alice is %d, the API created %d", f.Conv.ConvID, d.Conv.ConvID)
	}

	for _, node := range []string{c2.Name, c1.Name} {
		conv := byOwner[node]
		path := func(rest string) string { return fmt.Sprintf("/v1/admin/conversations/%d%s", conv, rest) }
		t.Logf("conv %d owned by %s (API on %s)", conv, node, c1.Name)
		seq := uint64(0) // a group starts empty (no creation event)
		step := func(what string) protocol.Message {
			t.Helper()
			seq++
			m := bob.pushed(conv, seq)
			alice.pushed(conv, seq)
			t.Logf("%s: seq %d %s", what, seq, m.Kind)
			return m
		}

		var cv adminConvAns
		adminOK(t, api, key, "POST", path("/members"), map[string]any{"users": []string{"carol", "helper-bot"}}, &cv)
		if len(cv.Conv.Members) != 4 {
			t.Fatalf("members after add: %v", cv.Conv.Members)
		}
		if ev := sysEvent(t, step("add")); ev.Event != "member_added" || !ev.Admin || ev.Actor != "admin" || len(ev.Users) != 2 {
			t.Fatalf("add event %+v", ev)
		}
		adminOK(t, api, key, "PUT", path("/members/carol/role"), map[string]any{"role": "admin"}, nil)
		if ev := sysEvent(t, step("role")); ev.Event != "role_changed" || ev.Role != "admin" || !ev.Admin {
			t.Fatalf("role event %+v", ev)
		}
		adminOK(t, api, key, "PUT", path("/members/carol/mute"), map[string]any{"muted": true}, nil)
		if ev := sysEvent(t, step("mute")); ev.Event != "muted" || !ev.Admin {
			t.Fatalf("mute event %+v", ev)
		}
		// The client path's rules hold on the owner: the owner cannot be
		// removed, a non-member cannot send, a muted member cannot either.
		adminFails(t, api, key, "DELETE", path("/members/alice"), nil, http.StatusForbidden, protocol.CodeForbidden)
		adminFails(t, api, key, "POST", path("/messages"), map[string]any{"sender": "mallory", "client_msg_id": "x", "body": "hi"}, http.StatusForbidden, protocol.CodeNotMember)
		st, _ := adminCall(t, api, key, "POST", path("/messages"), map[string]any{"sender": "carol", "client_msg_id": "x", "body": "hi"})
		if st == http.StatusOK {
			t.Fatalf("a muted member's send was accepted")
		}

		var ack, dup adminAckAns
		adminOK(t, api, key, "POST", path("/messages"), map[string]any{"sender": "alice", "client_msg_id": "u1", "body": "from the back office"}, &ack)
		if m := step("send as user"); ack.Ack.Seq != seq || m.Sender != "alice" || m.SenderDevice != "admin-api" || m.Body != "from the back office" {
			t.Fatalf("ack %+v, pushed %+v", ack.Ack, m)
		}
		userSeq := seq
		adminOK(t, api, key, "POST", path("/messages"), map[string]any{"sender": "alice", "client_msg_id": "u1", "body": "from the back office"}, &dup)
		if !dup.Ack.Duplicate || dup.Ack.Seq != userSeq || dup.Ack.MsgID != ack.Ack.MsgID {
			t.Fatalf("retry %+v, want the first ack (%+v) as a duplicate", dup.Ack, ack.Ack)
		}
		adminOK(t, api, key, "POST", path("/messages"), map[string]any{"as": "bot", "sender": "helper-bot", "client_msg_id": "b1", "body": "beep"}, &ack)
		if m := step("send as bot"); ack.Ack.Seq != seq || m.Sender != "helper-bot" || m.SenderDevice != "bot" {
			t.Fatalf("ack %+v, pushed %+v", ack.Ack, m)
		}
		botSeq := seq
		adminOK(t, api, key, "POST", path("/messages"), map[string]any{"as": "system", "client_msg_id": "n1", "text": "maintenance at 22:00"}, &ack)
		if m := step("notice"); ack.Ack.Seq != seq || m.Sender != "admin" || sysEvent(t, m).Text != "maintenance at 22:00" {
			t.Fatalf("ack %+v, pushed %+v", ack.Ack, m)
		}
		adminOK(t, api, key, "POST", path("/messages"), map[string]any{"as": "system", "client_msg_id": "n1", "text": "maintenance at 22:00"}, &dup)
		if !dup.Ack.Duplicate || dup.Ack.Seq != seq {
			t.Fatalf("notice retry %+v", dup.Ack)
		}
		adminOK(t, api, key, "DELETE", path(fmt.Sprintf("/messages/%d?client_msg_id=r1", userSeq)), nil, &ack)
		if m := step("recall"); ack.Ack.Seq != seq || m.Kind != protocol.KindRecall || m.TargetSeq != userSeq || m.Sender != "admin" {
			t.Fatalf("ack %+v, pushed %+v", ack.Ack, m)
		}
		adminOK(t, api, key, "PATCH", path(fmt.Sprintf("/messages/%d", botSeq)), map[string]any{"client_msg_id": "e1", "body": "[moderated]"}, &ack)
		if m := step("edit"); ack.Ack.Seq != seq || m.Kind != protocol.KindEdit || m.TargetSeq != botSeq || m.Body != "[moderated]" {
			t.Fatalf("ack %+v, pushed %+v", ack.Ack, m)
		}
		adminFails(t, api, key, "DELETE", path(fmt.Sprintf("/messages/%d?client_msg_id=r2", userSeq)), nil, http.StatusConflict, protocol.CodeConflict)
		adminOK(t, api, key, "DELETE", path("/members/carol"), nil, &cv)
		if ev := sysEvent(t, step("remove")); ev.Event != "member_removed" || len(ev.Users) != 1 || ev.Users[0] != "carol" {
			t.Fatalf("remove event %+v", ev)
		}
		// The history, read through the other gateway, holds the moderation.
		var after uint64
		h := alice.call(protocol.Frame{Type: protocol.TypeHistory, ConvID: conv, AfterSeq: &after, Limit: 100}, protocol.TypeHistory)
		if len(h.Messages) != int(seq) {
			t.Fatalf("history holds %d messages, want %d (dense seqs)", len(h.Messages), seq)
		}
		for i, m := range h.Messages {
			if m.Seq != uint64(i+1) {
				t.Fatalf("history seq %d at %d", m.Seq, i)
			}
		}
		if u, b := h.Messages[userSeq-1], h.Messages[botSeq-1]; !u.Recalled || u.Body != "" || !b.Edited || b.Body != "[moderated]" {
			t.Fatalf("history after moderation: %+v %+v", u, b)
		}
		if now, _ := c.owner(conv); now != node {
			t.Fatalf("conv %d moved from %s to %s during the test: rerun", conv, node, now)
		}
	}

	// Nothing a client sends can carry the admin authority: a forged
	// gateway request on the owner's subject, with admin fields in the
	// envelope and in the frame, is mallory's own request.
	conv := byOwner[c2.Name]
	nc, err := natsio.Connect(os.Getenv("PARLEY_TEST_NATS"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	frame := fmt.Sprintf(`{"type":"remove_members","rid":"1","conv_id":"%d","members":["bob"],"admin":true,"Admin":true}`, conv)
	for _, env := range []string{
		`{"u":"mallory","d":"x","f":` + frame + `,"admin":true,"Admin":true,"a":true}`,
		`{"u":"admin","d":"admin-api","f":` + frame + `,"op":"members","actor":"admin"}`,
	} {
		subject := fmt.Sprintf("%s.chat.p.%d", c.keyspace, lease.Partition(conv, lease.DefaultPartitions))
		msg, err := nc.Request(subject, []byte(env), 20*time.Second)
		if err != nil {
			t.Fatalf("forged request: %v", err)
		}
		var f protocol.Frame
		if err := json.Unmarshal(msg.Data, &f); err != nil || f.Type != protocol.TypeError || (f.Code != protocol.CodeNotMember && f.Code != protocol.CodeForbidden) {
			t.Fatalf("forged request %s answered %s, want not_member or forbidden", env, msg.Data)
		}
	}
	var cv adminConvAns
	adminOK(t, api, key, "GET", fmt.Sprintf("/v1/admin/conversations/%d", conv), nil, &cv)
	if !contains(cv.Conv.Members, "bob") {
		t.Fatalf("bob was removed by a forged request: %v", cv.Conv.Members)
	}
	// The admin subject checks its envelope: an op admits only its own
	// frames, and a send never carries an actor.
	asubject := fmt.Sprintf("%s.chat.admin.p.%d", c.keyspace, lease.Partition(conv, lease.DefaultPartitions))
	for _, env := range []string{
		`{"op":"members","actor":"admin","f":{"type":"send","conv_id":"` + fmt.Sprint(conv) + `","client_msg_id":"z","body":"b"}}`,
		`{"op":"send","user":"alice","device":"d","actor":"admin","f":{"type":"send","conv_id":"` + fmt.Sprint(conv) + `","client_msg_id":"z","body":"b"}}`,
		`{"op":"root","actor":"admin"}`,
	} {
		msg, err := nc.Request(asubject, []byte(env), 20*time.Second)
		if err != nil {
			t.Fatalf("bad admin envelope: %v", err)
		}
		if !strings.Contains(string(msg.Data), `"code":"bad_frame"`) {
			t.Fatalf("bad admin envelope %s answered %s, want bad_frame", env, msg.Data)
		}
	}
}
