package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
	"github.com/parley-im/parley/protocol/schema"
)

// adminClient calls the server API; every answer is validated against
// protocol/schema/admin-openapi.json.
type adminClient struct {
	t    testing.TB
	base string
	key  string
}

func newAdmin(t testing.TB, srv *servertest.Server) *adminClient {
	return &adminClient{t: t, base: srv.AdminURL, key: srv.AdminKey}
}

// raw makes a request with the given bearer ("" for none) and returns the
// status and body, checked against the OpenAPI document.
func (a *adminClient) raw(bearer, method, path string, body any) (int, []byte) {
	a.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			a.t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, a.base+path, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	u := req.URL.Path
	if err := schema.AdminAnswer(method, u, resp.StatusCode, resp.Header.Get("Content-Type"), data); err != nil {
		a.t.Errorf("%s %s: answer not in admin-openapi.json: %v (body %.300s)", method, path, err, data)
	}
	return resp.StatusCode, data
}

// call makes an authenticated request and decodes a 200 answer into out
// (if not nil); it returns the status and, for errors, the code.
func (a *adminClient) call(method, path string, body, out any) (int, protocol.Code) {
	a.t.Helper()
	status, data := a.raw(a.key, method, path, body)
	if status != http.StatusOK {
		var e struct {
			Code protocol.Code `json:"code"`
		}
		_ = json.Unmarshal(data, &e)
		return status, e.Code
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			a.t.Fatalf("%s %s: %v (%s)", method, path, err, data)
		}
	}
	return status, ""
}

// ok is call that must succeed.
func (a *adminClient) ok(method, path string, body, out any) {
	a.t.Helper()
	if status, code := a.call(method, path, body, out); status != http.StatusOK {
		a.t.Fatalf("%s %s: %d %s, want 200", method, path, status, code)
	}
}

// fails is call that must answer status with code.
func (a *adminClient) fails(method, path string, body any, status int, code protocol.Code) {
	a.t.Helper()
	if st, c := a.call(method, path, body, nil); st != status || c != code {
		a.t.Fatalf("%s %s: %d %s, want %d %s", method, path, st, c, status, code)
	}
}

type convAns struct {
	Conv protocol.ConvInfo `json:"conv"`
}

type ackAns struct {
	Ack struct {
		ConvID      uint64 `json:"conv_id,string"`
		ClientMsgID string `json:"client_msg_id"`
		Seq         uint64 `json:"seq"`
		MsgID       uint64 `json:"msg_id,string"`
		Duplicate   bool   `json:"duplicate"`
	} `json:"ack"`
}

func convPath(conv uint64, rest string) string { return "/v1/admin/conversations/" + u64(conv) + rest }

// nextMsg returns the next msg push (skipping other frames).
func nextMsg(t testing.TB, c *rawConn) protocol.Message {
	t.Helper()
	return *c.next(protocol.TypeMsg).Message
}

// msgAt returns the push of seq, skipping those before it.
func msgAt(t testing.TB, c *rawConn, seq uint64) protocol.Message {
	t.Helper()
	for {
		m := nextMsg(t, c)
		if m.Seq == seq {
			return m
		}
		if m.Seq > seq {
			t.Fatalf("%s got seq %d before %d", c.hello.UserID, m.Seq, seq)
		}
	}
}

func systemEvent(t testing.TB, m protocol.Message) protocol.SystemEvent {
	t.Helper()
	if m.Kind != protocol.KindSystem {
		t.Fatalf("message %+v is not a system event", m)
	}
	var ev protocol.SystemEvent
	if err := json.Unmarshal([]byte(m.Body), &ev); err != nil {
		t.Fatalf("event body %q: %v", m.Body, err)
	}
	return ev
}

// TestAdminAuth: only the admin key opens the API (never a user token, no
// key, a wrong key); the refusal is 401 with the documented body; unknown
// endpoints answer 404 not_found.
func TestAdminAuth(t *testing.T) {
	srv := servertest.Start(t, servertest.WithAdmin())
	a := newAdmin(t, srv)
	path := "/v1/admin/users/alice/access"
	for _, bearer := range []string{"", srv.Token("alice"), strings.Repeat("0", len(srv.AdminKey)), srv.AdminKey + "0", srv.AdminKey[:len(srv.AdminKey)-1]} {
		status, body := a.raw(bearer, "GET", path, nil)
		if status != http.StatusUnauthorized || !strings.Contains(string(body), `"code":"unauthorized"`) {
			t.Fatalf("bearer %.20q: %d %s, want 401 unauthorized", bearer, status, body)
		}
	}
	a.ok("GET", path, nil, nil)
	// The key is the hex as configured; its case does not matter.
	if status, _ := a.raw(strings.ToUpper(srv.AdminKey), "GET", path, nil); status != http.StatusOK {
		t.Fatalf("upper-case key: %d", status)
	}
	a.fails("GET", "/v1/admin/nothing", nil, http.StatusNotFound, protocol.CodeNotFound)
	a.fails("PUT", "/v1/admin/conversations/direct", nil, http.StatusNotFound, protocol.CodeNotFound)
	// The admin API is not on the client listener (with the key or not).
	req, _ := http.NewRequest("GET", srv.HTTPURL+"/v1/admin/users/alice/access", nil)
	req.Header.Set("Authorization", "Bearer "+srv.AdminKey)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("the client listener answered %d for an admin path, want 404", resp.StatusCode)
	}
}

// TestAdminActorIsNoClient: a token for the server API's actor id
// (admin.actor, default "admin") is refused on every client entry point,
// so no client can send as the operator.
func TestAdminActorIsNoClient(t *testing.T) {
	srv := servertest.Start(t, servertest.WithAdmin())
	tok := srv.Token("admin")
	_, resp, err := dialRawErr(srv.URL, tok, "phone")
	if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("handshake as the admin actor: %v %v, want 401", err, resp)
	}
	c := &pollClient{t: t, base: srv.HTTPURL, token: tok}
	for _, path := range []string{"/v1/poll?device=x", "/v1/conversations/snapshot?all=true"} {
		st, body := c.do("GET", path, nil)
		if st != http.StatusUnauthorized || !strings.Contains(string(body), `"code":"unauthorized"`) {
			t.Fatalf("GET %s as the admin actor: %d %s, want 401 unauthorized", path, st, body)
		}
	}
	if st, body := c.do("POST", "/v1/rpc?device=x", []byte(`{"type":"ping"}`)); st != http.StatusUnauthorized {
		t.Fatalf("rpc as the admin actor: %d %s, want 401", st, body)
	}
	// Another user is served as usual.
	dialRaw(t, srv, "administrator", "phone")
}

// TestAdminConversations: direct and group creation follow the client
// path (the same direct conversation for the same pair, whoever opens
// it), get and the paged list of a user's conversations, and errors.
func TestAdminConversations(t *testing.T) {
	srv := servertest.Start(t, servertest.WithAdmin())
	a := newAdmin(t, srv)
	var d convAns
	a.ok("POST", "/v1/admin/conversations/direct", map[string]any{"users": []string{"alice", "bob"}}, &d)
	if d.Conv.Kind != "direct" || strings.Join(d.Conv.Members, ",") != "alice,bob" || d.Conv.Role != "" {
		t.Fatalf("direct: %+v", d.Conv)
	}
	alice := dialRaw(t, srv, "alice", "phone")
	if id := alice.openDirect("bob"); id != d.Conv.ConvID {
		t.Fatalf("alice's open_direct gave %d, the admin's %d", id, d.Conv.ConvID)
	}
	var again convAns
	a.ok("POST", "/v1/admin/conversations/direct", map[string]any{"users": []string{"bob", "alice"}}, &again)
	if again.Conv.ConvID != d.Conv.ConvID {
		t.Fatal("a second direct conversation for the same pair")
	}
	var e2e convAns
	a.ok("POST", "/v1/admin/conversations/direct", map[string]any{"users": []string{"alice", "bob"}, "e2e": true}, &e2e)
	if !e2e.Conv.E2E || e2e.Conv.ConvID == d.Conv.ConvID {
		t.Fatalf("e2e direct: %+v", e2e.Conv)
	}

	var g convAns
	a.ok("POST", "/v1/admin/conversations/group", map[string]any{"owner": "alice", "name": "team", "members": []string{"bob", "carol"}}, &g)
	if g.Conv.Kind != "group" || g.Conv.Name != "team" || g.Conv.MemberCount != 3 {
		t.Fatalf("group: %+v", g.Conv)
	}
	info := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeConvInfo, ConvID: g.Conv.ConvID}), protocol.TypeConv).Conv
	if info.Role != protocol.RoleOwner {
		t.Fatalf("alice's role in the admin-made group: %q, want owner", info.Role)
	}
	var got convAns
	a.ok("GET", convPath(g.Conv.ConvID, ""), nil, &got)
	if got.Conv.ConvID != g.Conv.ConvID || got.Conv.MemberCount != 3 {
		t.Fatalf("get: %+v", got.Conv)
	}

	// alice has 3 conversations: pages of 2 then 1, by conv_id.
	type page struct {
		Conversations []protocol.ConvSummary `json:"conversations"`
		Next          string                 `json:"next"`
	}
	var p1, p2 page
	a.ok("GET", "/v1/admin/users/alice/conversations?limit=2", nil, &p1)
	if len(p1.Conversations) != 2 || p1.Next == "" {
		t.Fatalf("page 1: %+v", p1)
	}
	a.ok("GET", "/v1/admin/users/alice/conversations?limit=2&after="+p1.Next, nil, &p2)
	if len(p2.Conversations) != 1 || p2.Next != "" {
		t.Fatalf("page 2: %+v", p2)
	}
	seen := map[uint64]bool{}
	prev := uint64(0)
	for _, c := range append(p1.Conversations, p2.Conversations...) {
		if c.ConvID <= prev {
			t.Fatalf("pages not ordered by conv_id: %d after %d", c.ConvID, prev)
		}
		prev = c.ConvID
		seen[c.ConvID] = true
	}
	if !seen[d.Conv.ConvID] || !seen[e2e.Conv.ConvID] || !seen[g.Conv.ConvID] {
		t.Fatalf("alice's conversations %v miss one of %d %d %d", seen, d.Conv.ConvID, e2e.Conv.ConvID, g.Conv.ConvID)
	}
	var none page
	a.ok("GET", "/v1/admin/users/nobody/conversations", nil, &none)
	if none.Conversations == nil || len(none.Conversations) != 0 {
		t.Fatalf("a user without conversations: %+v", none)
	}

	// Errors, with the protocol's codes.
	a.fails("POST", "/v1/admin/conversations/direct", map[string]any{"users": []string{"alice"}}, 400, protocol.CodeInvalidArgument)
	a.fails("POST", "/v1/admin/conversations/direct", map[string]any{"users": []string{"alice", "alice"}}, 400, protocol.CodeInvalidArgument)
	a.fails("POST", "/v1/admin/conversations/direct", map[string]any{"users": []string{"alice", "b b"}}, 400, protocol.CodeInvalidArgument)
	a.fails("POST", "/v1/admin/conversations/direct", `{"users":"alice"}`, 400, protocol.CodeBadFrame)
	a.fails("POST", "/v1/admin/conversations/direct", `{"users":["a","b"],"extra":1}`, 400, protocol.CodeBadFrame)
	a.fails("POST", "/v1/admin/conversations/direct", `[1]`, 400, protocol.CodeBadFrame)
	a.fails("POST", "/v1/admin/conversations/group", map[string]any{"owner": "", "members": []string{"bob"}}, 400, protocol.CodeInvalidArgument)
	a.fails("POST", "/v1/admin/conversations/group", map[string]any{"owner": "alice", "name": strings.Repeat("n", 257)}, 413, protocol.CodeTooLarge)
	a.fails("GET", convPath(12345, ""), nil, 404, protocol.CodeNotFound)
	a.fails("GET", "/v1/admin/conversations/x1", nil, 400, protocol.CodeInvalidArgument)
	a.fails("GET", "/v1/admin/users/alice/conversations?limit=0", nil, 400, protocol.CodeInvalidArgument)
	a.fails("GET", "/v1/admin/users/alice/conversations?after=-1", nil, 400, protocol.CodeInvalidArgument)
	a.fails("POST", "/v1/admin/conversations/group", strings.Repeat(" ", 1<<20+1), 413, protocol.CodeTooLarge)
}

// TestAdminMembers: membership changes with the admin authority are the
// client path's: events with the next seq pushed to the members (admin:
// true, the admin as actor), the owner cannot be removed or muted,
// ownership moves with role owner, a muted member cannot send.
func TestAdminMembers(t *testing.T) {
	srv := servertest.Start(t, servertest.WithAdmin())
	a := newAdmin(t, srv)
	alice, carol := dialRaw(t, srv, "alice", "d"), dialRaw(t, srv, "carol", "d")
	conv := alice.createGroup("g", "bob")
	alice.sendText(conv, "a1", "hello") // seq 1

	var c convAns
	a.ok("POST", convPath(conv, "/members"), map[string]any{"users": []string{"carol", "dave"}}, &c)
	if c.Conv.MemberCount != 4 || c.Conv.LastSeq != 2 {
		t.Fatalf("after add: %+v", c.Conv)
	}
	for _, who := range []*rawConn{alice, carol} {
		m := msgAt(t, who, 2)
		ev := systemEvent(t, m)
		if m.Seq != 2 || m.Sender != "admin" || m.SenderDevice != "admin-api" || ev.Event != "member_added" || !ev.Admin || ev.Actor != "admin" || strings.Join(ev.Users, ",") != "carol,dave" {
			t.Fatalf("add event for %s: %+v %+v", who.hello.UserID, m, ev)
		}
	}
	// carol joined at seq 2: the message before it is not hers.
	if h := carol.history(conv); len(h) != 1 || h[0].Seq != 2 {
		t.Fatalf("carol's history %+v, want only the add event", h)
	}

	a.ok("PUT", convPath(conv, "/members/carol/role"), map[string]any{"role": "admin"}, &c)
	if ev := systemEvent(t, msgAt(t, carol, 3)); ev.Event != "role_changed" || ev.Role != "admin" || !ev.Admin {
		t.Fatalf("role event %+v", ev)
	}
	a.ok("PUT", convPath(conv, "/members/dave/mute"), map[string]any{"muted": true}, &c)
	if ev := systemEvent(t, msgAt(t, carol, 4)); ev.Event != "muted" || ev.Users[0] != "dave" {
		t.Fatalf("mute event %+v", ev)
	}
	dave := dialRaw(t, srv, "dave", "d")
	if f := dave.sendText(conv, "d1", "let me"); f.Code != protocol.CodeForbidden {
		t.Fatalf("a muted member's send: %+v", f)
	}
	a.ok("PUT", convPath(conv, "/members/dave/mute"), map[string]any{"muted": false}, nil)
	mustOK(t, dave.sendText(conv, "d2", "thanks"), protocol.TypeAck)

	bob := dialRaw(t, srv, "bob", "d")
	a.ok("DELETE", convPath(conv, "/members/bob"), nil, &c)
	removal := msgAt(t, bob, c.Conv.LastSeq)
	if ev := systemEvent(t, removal); ev.Event != "member_removed" || ev.Users[0] != "bob" || !ev.Admin {
		t.Fatalf("bob's removal event %+v", ev)
	}
	if f := bob.sendText(conv, "b-late", "still here?"); f.Code != protocol.CodeNotMember {
		t.Fatalf("a removed member's send: %+v", f)
	}
	if c.Conv.MemberCount != 3 || strings.Contains(strings.Join(c.Conv.Members, ","), "bob") {
		t.Fatalf("after remove: %+v", c.Conv)
	}
	// The owner is the owner's: not removable, not mutable, role fixed.
	a.fails("DELETE", convPath(conv, "/members/alice"), nil, 403, protocol.CodeForbidden)
	a.fails("PUT", convPath(conv, "/members/alice/mute"), map[string]any{"muted": true}, 403, protocol.CodeForbidden)
	a.fails("PUT", convPath(conv, "/members/alice/role"), map[string]any{"role": "member"}, 400, protocol.CodeInvalidArgument)
	// Handing the group over: carol owner, alice admin.
	a.ok("PUT", convPath(conv, "/members/carol/role"), map[string]any{"role": "owner"}, nil)
	if r := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeConvInfo, ConvID: conv}), protocol.TypeConv).Conv.Role; r != protocol.RoleAdmin {
		t.Fatalf("the former owner's role: %q, want admin", r)
	}
	if r := mustOK(t, carol.call(protocol.Frame{Type: protocol.TypeConvInfo, ConvID: conv}), protocol.TypeConv).Conv.Role; r != protocol.RoleOwner {
		t.Fatalf("the new owner's role: %q", r)
	}

	// The admin is no member: it has no conversations, hence no read
	// positions, after all these events.
	var adminConvs struct {
		Conversations []protocol.ConvSummary `json:"conversations"`
	}
	a.ok("GET", "/v1/admin/users/admin/conversations", nil, &adminConvs)
	if len(adminConvs.Conversations) != 0 {
		t.Fatalf("the admin actor has conversations: %+v", adminConvs)
	}

	// Seqs stay dense across client and admin writes.
	h := alice.history(conv)
	for i, m := range h {
		if m.Seq != uint64(i+1) {
			t.Fatalf("seq %d at position %d: %+v", m.Seq, i, h)
		}
	}

	// Errors.
	a.fails("DELETE", convPath(conv, "/members/bob"), nil, 404, protocol.CodeNotFound)
	a.fails("PUT", convPath(conv, "/members/zed/mute"), map[string]any{"muted": true}, 404, protocol.CodeNotFound)
	a.fails("PUT", convPath(conv, "/members/dave/mute"), map[string]any{}, 400, protocol.CodeInvalidArgument)
	a.fails("PUT", convPath(conv, "/members/dave/role"), map[string]any{"role": "king"}, 400, protocol.CodeInvalidArgument)
	a.fails("POST", convPath(conv, "/members"), map[string]any{"users": []string{}}, 400, protocol.CodeInvalidArgument)
	a.fails("POST", convPath(99999, "/members"), map[string]any{"users": []string{"x"}}, 404, protocol.CodeNotFound)
	direct := alice.openDirect("bob")
	a.fails("POST", convPath(direct, "/members"), map[string]any{"users": []string{"x"}}, 400, protocol.CodeInvalidArgument)
}

// TestAdminMessages: sends as a user and as a bot are that user's sends
// (membership, idempotency, the next seq, pushes); system notices; moderation
// recall and edit of anyone's message; what E2E conversations refuse.
func TestAdminMessages(t *testing.T) {
	srv := servertest.Start(t, servertest.WithAdmin())
	a := newAdmin(t, srv)
	alice, bob := dialRaw(t, srv, "alice", "d"), dialRaw(t, srv, "bob", "d")
	conv := alice.createGroup("g", "bob", "helper-bot")
	mustOK(t, bob.sendText(conv, "b1", "first"), protocol.TypeAck) // seq 1
	msgAt(t, alice, 1)

	var ack ackAns
	a.ok("POST", convPath(conv, "/messages"), map[string]any{"sender": "alice", "client_msg_id": "adm-1", "body": "from the back office"}, &ack)
	if ack.Ack.Seq != 2 || ack.Ack.Duplicate {
		t.Fatalf("ack %+v", ack.Ack)
	}
	m := msgAt(t, bob, 2)
	if m.Seq != 2 || m.Sender != "alice" || m.SenderDevice != "admin-api" || m.Body != "from the back office" || m.Kind != protocol.KindText {
		t.Fatalf("bob got %+v", m)
	}
	var dup ackAns
	a.ok("POST", convPath(conv, "/messages"), map[string]any{"sender": "alice", "client_msg_id": "adm-1", "body": "from the back office"}, &dup)
	if !dup.Ack.Duplicate || dup.Ack.Seq != 2 || dup.Ack.MsgID != ack.Ack.MsgID {
		t.Fatalf("retry: %+v, want the first ack as duplicate", dup.Ack)
	}
	// The same client_msg_id from alice's own client is the same message.
	if f := alice.sendText(conv, "adm-1", "from the back office"); !f.Duplicate || f.Seq != 2 {
		t.Fatalf("alice's retry: %+v", f)
	}
	a.ok("POST", convPath(conv, "/messages"), map[string]any{"as": "bot", "sender": "helper-bot", "client_msg_id": "bot-1", "body": "beep"}, &ack)
	if m := msgAt(t, bob, 3); m.Seq != 3 || m.Sender != "helper-bot" || m.SenderDevice != "bot" {
		t.Fatalf("bot message %+v", m)
	}
	a.ok("POST", convPath(conv, "/messages"), map[string]any{"sender": "alice", "client_msg_id": "st-1", "kind": "state", "coalesce_key": "poll", "body": "3 votes"}, &ack)
	if m := msgAt(t, bob, 4); m.Kind != protocol.KindState || m.CoalesceKey != "poll" {
		t.Fatalf("state message %+v", m)
	}

	// A system notice.
	a.ok("POST", convPath(conv, "/messages"), map[string]any{"as": "system", "client_msg_id": "n-1", "text": "maintenance at 22:00"}, &ack)
	n := msgAt(t, bob, ack.Ack.Seq)
	ev := systemEvent(t, n)
	if n.Seq != ack.Ack.Seq || n.Sender != "admin" || ev.Event != "notice" || ev.Text != "maintenance at 22:00" || !ev.Admin {
		t.Fatalf("notice %+v %+v", n, ev)
	}
	a.ok("POST", convPath(conv, "/messages"), map[string]any{"as": "system", "client_msg_id": "n-1", "text": "maintenance at 22:00"}, &dup)
	if !dup.Ack.Duplicate || dup.Ack.Seq != ack.Ack.Seq {
		t.Fatalf("notice retry %+v", dup.Ack)
	}

	// Moderation: recall bob's message (no window, any sender), edit alice's.
	a.ok("DELETE", convPath(conv, "/messages/1?client_msg_id=mod-1"), nil, &ack)
	rc := nextMsg(t, alice)
	for rc.Kind != protocol.KindRecall {
		rc = nextMsg(t, alice)
	}
	if rc.TargetSeq != 1 || rc.Sender != "admin" {
		t.Fatalf("recall event %+v", rc)
	}
	a.ok("PATCH", convPath(conv, "/messages/2"), map[string]any{"client_msg_id": "mod-2", "body": "[edited by moderation]"}, &ack)
	if e := msgAt(t, bob, ack.Ack.Seq); e.Kind != protocol.KindEdit || e.TargetSeq != 2 || e.Body != "[edited by moderation]" || e.Sender != "admin" {
		t.Fatalf("edit event pushed to bob: %+v", e)
	}
	h := bob.history(conv)
	if !h[0].Recalled || h[0].Body != "" || !h[1].Edited || h[1].Body != "[edited by moderation]" {
		t.Fatalf("history after moderation: %+v %+v", h[0], h[1])
	}
	a.fails("DELETE", convPath(conv, "/messages/1?client_msg_id=mod-3"), nil, 409, protocol.CodeConflict) // recalled already
	a.fails("DELETE", convPath(conv, "/messages/5?client_msg_id=mod-4"), nil, 409, protocol.CodeConflict) // a notice is no text
	a.fails("DELETE", convPath(conv, "/messages/999?client_msg_id=mod-5"), nil, 404, protocol.CodeNotFound)
	a.fails("DELETE", convPath(conv, "/messages/2"), nil, 400, protocol.CodeInvalidArgument) // client_msg_id required

	// Sends as a user have the user's rights.
	a.fails("POST", convPath(conv, "/messages"), map[string]any{"sender": "mallory", "client_msg_id": "x", "body": "hi"}, 403, protocol.CodeNotMember)
	a.fails("POST", convPath(conv, "/messages"), map[string]any{"sender": "alice", "client_msg_id": "x"}, 400, protocol.CodeInvalidArgument)
	a.fails("POST", convPath(conv, "/messages"), map[string]any{"sender": "alice", "client_msg_id": "x", "body": strings.Repeat("b", 16385)}, 413, protocol.CodeTooLarge)
	a.fails("POST", convPath(conv, "/messages"), map[string]any{"as": "robot", "sender": "alice", "client_msg_id": "x", "body": "b"}, 400, protocol.CodeInvalidArgument)
	a.fails("POST", convPath(conv, "/messages"), map[string]any{"as": "system", "client_msg_id": "x"}, 400, protocol.CodeInvalidArgument)
	a.fails("POST", convPath(conv, "/messages"), map[string]any{"as": "system", "sender": "alice", "client_msg_id": "x", "text": "t"}, 400, protocol.CodeInvalidArgument)
	a.fails("POST", convPath(conv, "/messages"), map[string]any{"sender": "alice", "client_msg_id": 7, "body": "b"}, 400, protocol.CodeBadFrame)
	a.fails("POST", convPath(99999, "/messages"), map[string]any{"as": "system", "client_msg_id": "x", "text": "t"}, 404, protocol.CodeNotFound)

	// E2E: the server never produces a body there.
	e2e := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "bob", E2E: true}), protocol.TypeConv).Conv.ConvID
	a.fails("POST", convPath(e2e, "/messages"), map[string]any{"as": "system", "client_msg_id": "x", "text": "t"}, 400, protocol.CodeE2EUnsupported)
	a.fails("POST", convPath(e2e, "/messages"), map[string]any{"sender": "alice", "client_msg_id": "x", "body": "plain"}, 400, protocol.CodeE2ERequired)
	env := `{"e2e":1,"to":[{"user":"bob","device":"d","type":2,"body":"AAAA"}]}`
	a.ok("POST", convPath(e2e, "/messages"), map[string]any{"sender": "alice", "client_msg_id": "e1", "body": env}, &ack)
	a.fails("PATCH", convPath(e2e, "/messages/1"), map[string]any{"client_msg_id": "e2", "body": env}, 400, protocol.CodeE2EUnsupported)
	a.ok("DELETE", convPath(e2e, "/messages/1?client_msg_id=e3"), nil, &ack)
	if ack.Ack.Seq != 2 {
		t.Fatalf("e2e recall ack %+v", ack.Ack)
	}
}

// TestAdminBanClosesSessions: a ban closes the user's WebSocket (4003) and
// poll session (the waiting poll answers 403 banned), refuses new
// handshakes and HTTP requests with 403 banned, survives a restart, and
// an unban lets the user back.
func TestAdminBanClosesSessions(t *testing.T) {
	dir := t.TempDir()
	key := make([]byte, 32)
	copy(key, "ban-test-key-0123456789abcdef...")
	srv := servertest.Start(t, servertest.WithAdmin(), servertest.WithDataDir(dir), servertest.WithKey(key))
	a := newAdmin(t, srv)
	ws := dialRaw(t, srv, "alice", "phone")
	other := dialRaw(t, srv, "bob", "phone")
	p := &pollClient{t: t, base: srv.HTTPURL, token: srv.Token("alice"), device: "web"}
	status, frames := p.poll(0)
	if status != 200 || len(frames) != 1 {
		t.Fatalf("open poll session: %d %v", status, frames)
	}
	p.session = frames[0].Hello.SessionID
	polled := make(chan int, 1)
	go func() {
		st, _ := p.do("GET", "/v1/poll?device=web&session="+p.session+"&wait_ms=25000", nil)
		polled <- st
	}()
	time.Sleep(100 * time.Millisecond) // the poll is waiting (if not, it is refused: the same answer)

	type entryAns struct {
		Entry struct {
			User   string `json:"user"`
			Banned bool   `json:"banned"`
			Reason string `json:"reason"`
		} `json:"entry"`
	}
	var e entryAns
	a.ok("POST", "/v1/admin/users/alice/ban", map[string]any{"reason": "spam"}, &e)
	if !e.Entry.Banned || e.Entry.Reason != "spam" {
		t.Fatalf("ban entry %+v", e.Entry)
	}
	if code := ws.waitClose(); code != protocol.CloseBanned {
		t.Fatalf("WebSocket closed with %d, want %d", code, protocol.CloseBanned)
	}
	select {
	case st := <-polled:
		if st != http.StatusForbidden {
			t.Fatalf("the waiting poll answered %d, want 403", st)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting poll was not answered")
	}
	assertBanned(t, srv, srv.Token("alice"))
	// Others are untouched.
	mustOK(t, other.call(protocol.Frame{Type: protocol.TypePing}), protocol.TypePong)

	// Persisted: a restart keeps the ban.
	srv.Close()
	srv = servertest.Start(t, servertest.WithAdmin(), servertest.WithDataDir(dir), servertest.WithKey(key))
	a = newAdmin(t, srv)
	assertBanned(t, srv, srv.Token("alice"))
	var entries struct {
		Entries []struct {
			User   string `json:"user"`
			Banned bool   `json:"banned"`
		} `json:"entries"`
	}
	a.ok("GET", "/v1/admin/users/alice/access", nil, &entries)
	if len(entries.Entries) != 1 || !entries.Entries[0].Banned {
		t.Fatalf("access after restart %+v", entries)
	}
	a.ok("DELETE", "/v1/admin/users/alice/ban", nil, &e)
	if e.Entry.Banned {
		t.Fatal("still banned after unban")
	}
	dialRaw(t, srv, "alice", "phone")
	a.fails("POST", "/v1/admin/users/alice/ban", map[string]any{"reason": strings.Repeat("r", 257)}, 413, protocol.CodeTooLarge)
	a.fails("POST", "/v1/admin/users/a%20b/ban", nil, 400, protocol.CodeInvalidArgument)
}

// assertBanned: every entry point refuses tok with 403 banned.
func assertBanned(t *testing.T, srv *servertest.Server, tok string) {
	t.Helper()
	_, resp, err := dialRawErr(srv.URL, tok, "phone")
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("handshake of a banned user: %v %v", err, resp)
	}
	for _, path := range []string{"/v1/poll?device=x", "/v1/conversations/snapshot?all=true"} {
		st, body := (&pollClient{t: t, base: srv.HTTPURL, token: tok}).do("GET", path, nil)
		if st != http.StatusForbidden || !strings.Contains(string(body), `"banned"`) {
			t.Fatalf("GET %s of a banned user: %d %s", path, st, body)
		}
	}
	st, body := (&pollClient{t: t, base: srv.HTTPURL, token: tok}).do("POST", "/v1/rpc?device=x", []byte(`{"type":"ping"}`))
	if st != http.StatusForbidden || !strings.Contains(string(body), `"banned"`) {
		t.Fatalf("rpc of a banned user: %d %s", st, body)
	}
}

// TestAdminRevoke: tokens issued before the revocation time are refused
// (401 token_revoked) and their connections closed (4002); a token
// issued later works; a device's revocation touches only that device.
func TestAdminRevoke(t *testing.T) {
	srv := servertest.Start(t, servertest.WithAdmin())
	a := newAdmin(t, srv)
	old := srv.Token("alice") // iat a minute ago
	ws1, _, err := dialRawErr(srv.URL, old, "d1")
	if err != nil {
		t.Fatal(err)
	}
	d1 := startRaw(t, ws1)
	ws2, _, err := dialRawErr(srv.URL, old, "d2")
	if err != nil {
		t.Fatal(err)
	}
	d2 := startRaw(t, ws2)
	p := &pollClient{t: t, base: srv.HTTPURL, token: old, device: "d3"}
	st, frames := p.poll(0)
	if st != 200 || len(frames) != 1 {
		t.Fatalf("poll open %d", st)
	}
	p.session = frames[0].Hello.SessionID

	// One device first.
	a.ok("POST", "/v1/admin/users/alice/revoke", map[string]any{"device": "d1"}, nil)
	if code := d1.waitClose(); code != protocol.CloseTokenRevoked {
		t.Fatalf("d1 closed with %d, want %d", code, protocol.CloseTokenRevoked)
	}
	mustOK(t, d2.call(protocol.Frame{Type: protocol.TypePing}), protocol.TypePong)
	if _, resp, err := dialRawErr(srv.URL, old, "d1"); err == nil || resp == nil || resp.StatusCode != 401 {
		t.Fatalf("old token on d1: %v %v", err, resp)
	}
	// The whole user.
	a.ok("POST", "/v1/admin/users/alice/revoke", nil, nil)
	if code := d2.waitClose(); code != protocol.CloseTokenRevoked {
		t.Fatalf("d2 closed with %d, want %d", code, protocol.CloseTokenRevoked)
	}
	st, body := p.do("POST", "/v1/rpc?device=d3", []byte(`{"type":"ping"}`))
	if st != 401 || !strings.Contains(string(body), `"token_revoked"`) {
		t.Fatalf("rpc with a revoked token: %d %s", st, body)
	}
	st, body = p.do("GET", "/v1/poll?device=d3&session="+p.session+"&wait_ms=0", nil)
	if st != 401 || !strings.Contains(string(body), `"token_revoked"`) {
		t.Fatalf("poll of a revoked token's session: %d %s", st, body)
	}
	// A token issued after the revocation (iat has second precision: the
	// next second) works.
	fresh, err := mintAt(srv.Key(), "alice", time.Now().Add(1100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ws3, resp, err := dialRawErr(srv.URL, fresh, "d2")
	if err != nil {
		t.Fatalf("fresh token: %v %v", err, resp)
	}
	startRaw(t, ws3)
	// before in the past revokes nothing newer.
	a.ok("POST", "/v1/admin/users/alice/revoke", map[string]any{"before": time.Now().Add(-time.Hour).UnixMilli()}, nil)
	ws4, _, err := dialRawErr(srv.URL, old, "d4")
	if err != nil {
		t.Fatalf("a token newer than the moved revocation: %v", err)
	}
	ws4.Close()
	a.fails("POST", "/v1/admin/users/alice/revoke", map[string]any{"before": -5}, 400, protocol.CodeInvalidArgument)
	a.fails("POST", "/v1/admin/users/alice/revoke", map[string]any{"device": "no such"}, 400, protocol.CodeInvalidArgument)
}

// TestAdminDisconnect: a device's sessions close with 4004, the others
// stay; the user may reconnect.
func TestAdminDisconnect(t *testing.T) {
	srv := servertest.Start(t, servertest.WithAdmin())
	a := newAdmin(t, srv)
	d1, d2 := dialRaw(t, srv, "alice", "d1"), dialRaw(t, srv, "alice", "d2")
	var n struct {
		Sessions int `json:"sessions"`
	}
	a.ok("POST", "/v1/admin/users/alice/disconnect", map[string]any{"device": "d1"}, &n)
	if n.Sessions != 1 {
		t.Fatalf("sessions %d, want 1", n.Sessions)
	}
	if code := d1.waitClose(); code != protocol.CloseDisconnected {
		t.Fatalf("d1 closed with %d, want %d", code, protocol.CloseDisconnected)
	}
	mustOK(t, d2.call(protocol.Frame{Type: protocol.TypePing}), protocol.TypePong)
	dialRaw(t, srv, "alice", "d1")
	a.ok("POST", "/v1/admin/users/nobody/disconnect", nil, &n)
	if n.Sessions != 0 {
		t.Fatalf("sessions of a user offline: %d", n.Sessions)
	}
}

// mintAt mints a one-hour token for user issued at iat.
func mintAt(key []byte, user string, iat time.Time) (string, error) {
	return auth.MintHS256(key, auth.Claims{User: user, IssuedAt: iat, Expires: iat.Add(time.Hour)})
}
