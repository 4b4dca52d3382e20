package e2eechat

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// TestTypeScriptChat: Go users of this package and TypeScript users of
// the TypeScript SDK's E2EChat (sdk/ts/src/e2ee/chat.ts, in a Node process
// driven over stdio: sdk/ts/test/e2ee-peer.mjs) in the same encrypted
// conversations on a real node — a direct chat with a second device of
// each user in the other language, and a group from which a member is
// removed. It needs node and the built SDK (scripts/web.sh builds it
// before scripts/test.sh in CI); without them it skips, under CI=true it
// fails.

type nodePeer struct {
	t   *testing.T
	in  io.WriteCloser
	out *bufio.Scanner
	id  int
}

func startNodePeer(t *testing.T) *nodePeer {
	t.Helper()
	root, err := filepath.Abs("../../sdk/ts")
	if err != nil {
		t.Fatal(err)
	}
	missing := ""
	node, err := exec.LookPath("node")
	if err != nil {
		missing = "node is not installed"
	} else if _, err := os.Stat(filepath.Join(root, "dist/e2ee/chat.js")); err != nil {
		missing = "the TypeScript SDK is not built (cd sdk/ts && npm ci && npm run build)"
	} else if _, err := os.Stat(filepath.Join(root, "node_modules/ws")); err != nil {
		missing = "the TypeScript SDK's packages are not installed (cd sdk/ts && npm ci)"
	}
	if missing != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("TypeScript chat: %s", missing)
		}
		t.Skipf("TypeScript chat: %s", missing)
	}
	cmd := exec.Command(node, "test/e2ee-peer.mjs")
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
		}
	})
	p := &nodePeer{t: t, in: in, out: bufio.NewScanner(out)}
	p.out.Buffer(make([]byte, 1<<20), 16<<20)
	return p
}

func (p *nodePeer) do(r any, op, dev string, args map[string]any) {
	p.t.Helper()
	p.id++
	q := map[string]any{"id": p.id, "op": op, "dev": dev}
	for k, v := range args {
		q[k] = v
	}
	b, _ := json.Marshal(q)
	if _, err := p.in.Write(append(b, '\n')); err != nil {
		p.t.Fatal(err)
	}
	if !p.out.Scan() {
		p.t.Fatalf("node peer exited: %v", p.out.Err())
	}
	var a struct {
		ID    int             `json:"id"`
		OK    bool            `json:"ok"`
		R     json.RawMessage `json:"r"`
		Code  string          `json:"code"`
		Error string          `json:"error"`
	}
	if err := json.Unmarshal(p.out.Bytes(), &a); err != nil || a.ID != p.id {
		p.t.Fatalf("node peer answered %q (%v)", p.out.Bytes(), err)
	}
	if !a.OK {
		p.t.Fatalf("ts %s %s: %s %s", op, dev, a.Code, a.Error)
	}
	if r != nil {
		if err := json.Unmarshal(a.R, r); err != nil {
			p.t.Fatal(err)
		}
	}
}

type tsOpened struct {
	Seq     uint64 `json:"seq"`
	Kind    string `json:"kind"`
	Text    string `json:"text"`
	Control bool   `json:"control"`
	System  string `json:"system"`
	Error   string `json:"error"`
}

// start starts a TypeScript chat device; accountKey, when set, links it
// to its user's account (MarshalAccountKey's form).
func (p *nodePeer) start(srv *servertest.Server, user, device string, accountKey []byte, keys int) string {
	p.t.Helper()
	name := user + "/" + device
	p.do(nil, "chatStart", name, map[string]any{"url": srv.HTTPURL, "token": srv.Token(user), "accountKey": string(accountKey)})
	p.do(nil, "chatPublish", name, map[string]any{"n": keys})
	return name
}

func (p *nodePeer) send(dev string, conv uint64, args map[string]any) uint64 {
	p.t.Helper()
	args["conv"] = strconv.FormatUint(conv, 10)
	var r struct {
		Seq uint64 `json:"seq"`
	}
	p.do(&r, "chatSend", dev, args)
	return r.Seq
}

// read opens conv's history on dev: the texts by seq (errors as "ERR:code").
func (p *nodePeer) read(dev string, conv uint64) (map[uint64]string, []tsOpened) {
	p.t.Helper()
	var r struct {
		Messages []tsOpened `json:"messages"`
	}
	p.do(&r, "chatRead", dev, map[string]any{"conv": strconv.FormatUint(conv, 10)})
	out := map[uint64]string{}
	for _, m := range r.Messages {
		switch {
		case m.Error != "":
			out[m.Seq] = "ERR:" + m.Error
		case !m.Control && m.System == "" && (m.Kind == "text" || m.Kind == "edit"):
			out[m.Seq] = m.Text
		}
	}
	return out, r.Messages
}

func accountOf(t *testing.T, d *dev) []byte {
	t.Helper()
	b, err := d.m.Device().ExportAccountKey()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestTypeScriptChat(t *testing.T) {
	p := startNodePeer(t)
	logs := &syncBuf{}
	srv := servertest.Start(t, servertest.WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	ctx := ctxT(t)

	t.Run("Direct", func(t *testing.T) {
		p.t = t
		alice := startDev(t, srv, "alice", "cli", 5)
		bob := startDev(t, srv, "bob", "cli", 5)
		aliceWeb := p.start(srv, "alice", "web", accountOf(t, alice), 5)
		bobWeb := p.start(srv, "bob", "web", accountOf(t, bob), 5)

		conv, err := alice.c.OpenDirectE2E(ctx, "bob")
		if err != nil {
			t.Fatal(err)
		}
		g1, err := alice.m.SendDirect(ctx, conv.ConvID, "bob", canary+" from go")
		if err != nil {
			t.Fatal(err)
		}
		t1 := p.send(bobWeb, conv.ConvID, map[string]any{"peer": "alice", "text": canary + " from the web"})
		t2 := p.send(aliceWeb, conv.ConvID, map[string]any{"text": canary + " alice on the web"}) // routed by conv_info
		g2, err := bob.m.SendDirect(ctx, conv.ConvID, "alice", canary+" bob on the cli")
		if err != nil {
			t.Fatal(err)
		}
		want := map[uint64]string{g1.Seq: canary + " from go", t1: canary + " from the web", t2: canary + " alice on the web", g2.Seq: canary + " bob on the cli"}
		for _, d := range []*dev{alice, bob} {
			got := d.read(t, conv.ConvID)
			for seq, w := range want {
				wantText(t, "go "+d.m.self.String(), got, seq, w)
			}
		}
		for _, d := range []string{aliceWeb, bobWeb} {
			got, _ := p.read(d, conv.ConvID)
			for seq, w := range want {
				wantText(t, "ts "+d, got, seq, w)
			}
		}
		// Both languages compute the same safety number.
		sn, err := alice.m.SafetyNumber(ctx, "bob")
		if err != nil {
			t.Fatal(err)
		}
		var r struct {
			Number string `json:"number"`
		}
		p.do(&r, "chatSafetyNumber", bobWeb, map[string]any{"user": "alice"})
		if r.Number != sn {
			t.Fatalf("safety number: ts %s, go %s", r.Number, sn)
		}
		// A plaintext conversation of the pair: the scan below must see it.
		plain, err := alice.c.OpenDirect(ctx, "bob")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := alice.c.Send(ctx, plain.ConvID, control); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("GroupMemberRemoved", func(t *testing.T) {
		p.t = t
		gal := startDev(t, srv, "gal", "cli", 5)
		gbo := p.start(srv, "gbo", "web", nil, 5)
		gca := p.start(srv, "gca", "web", nil, 5)
		conv, err := gal.c.CreateGroupE2E(ctx, "g", []string{"gbo", "gca"})
		if err != nil {
			t.Fatal(err)
		}
		members := []string{"gbo", "gca"}
		s1, err := gal.m.SendGroup(ctx, conv.ConvID, members, "hello group")
		if err != nil {
			t.Fatal(err)
		}
		s2 := p.send(gbo, conv.ConvID, map[string]any{"members": []string{"gal", "gca"}, "text": "ts in the group"})
		for _, d := range []string{gbo, gca} {
			got, _ := p.read(d, conv.ConvID)
			wantText(t, "ts "+d, got, s1.Seq, "hello group")
			wantText(t, "ts "+d, got, s2, "ts in the group")
		}
		wantText(t, "go", gal.read(t, conv.ConvID), s2, "ts in the group")

		// gca is removed; everyone left opens the event and rotates.
		if _, err := gal.c.RemoveMembers(ctx, conv.ConvID, []string{"gca"}); err != nil {
			t.Fatal(err)
		}
		gal.read(t, conv.ConvID)
		_, all := p.read(gbo, conv.ConvID)
		removed := false
		for _, m := range all {
			removed = removed || m.System == "member_removed"
		}
		if !removed {
			t.Fatalf("ts saw no member_removed: %+v", all)
		}
		s3, err := gal.m.SendGroup(ctx, conv.ConvID, []string{"gbo"}, "after removal, go")
		if err != nil {
			t.Fatal(err)
		}
		s4 := p.send(gbo, conv.ConvID, map[string]any{"members": []string{"gal"}, "text": "after removal, ts"})
		got, _ := p.read(gbo, conv.ConvID)
		wantText(t, "ts gbo", got, s3.Seq, "after removal, go")
		wantText(t, "go gal", gal.read(t, conv.ConvID), s4, "after removal, ts")
		// The removed member, handed the new ciphertexts, reads neither.
		for _, msg := range gal.history(t, conv.ConvID) {
			if msg.Seq != s3.Seq && msg.Seq != s4 {
				continue
			}
			var o struct {
				Text  string `json:"text"`
				Error string `json:"error"`
			}
			p.do(&o, "chatOpen", gca, map[string]any{"message": tsMessage(msg)})
			if o.Error == "" {
				t.Fatalf("the removed member read seq %d: %q", msg.Seq, o.Text)
			}
		}
	})

	// No plaintext of either language's messages on the server.
	p.t = t
	srv.Close()
	assertNoCanary(t, srv.DataDir, logs.String())
	if !dirContains(t, srv.DataDir, []byte(control)) {
		t.Fatal("the control plaintext is not found in the data directory: the scan cannot see plaintext")
	}
}

// tsMessage is msg as the TypeScript SDK's frames carry it.
func tsMessage(m protocol.Message) map[string]any {
	return map[string]any{"conv_id": strconv.FormatUint(m.ConvID, 10), "seq": m.Seq, "msg_id": fmt.Sprint(m.MsgID), "sender": m.Sender,
		"sender_device": m.SenderDevice, "kind": m.Kind, "body": m.Body, "target_seq": m.TargetSeq, "server_time": m.ServerTime}
}
