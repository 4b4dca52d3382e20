package main

import (
	"bytes"
	"context"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/client/e2eechat"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// TestChatCLIE2E: `parley-chat` opens an end-to-end encrypted direct
// conversation, sends and reads encrypted messages, lists it as E2E and
// prints the safety number; its keys are files of mode 0600.
func TestChatCLIE2E(t *testing.T) {
	srv := servertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	bob, err := client.New(client.Config{URL: srv.URL, Token: srv.Token("bob"), Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = bob.Run(ctx) }()
	defer bob.Close()
	st := e2ee.NewMemoryStore()
	bobDev, err := e2ee.OpenDevice(st, e2ee.Address{User: "bob", Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	bm := e2eechat.New(bob, bobDev, st)
	if _, err := bm.PublishKeys(ctx, 5); err != nil {
		t.Fatal(err)
	}

	keys := t.TempDir()
	in, feed := io.Pipe()
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- runChat(ctx, []string{"-url", srv.URL, "-token", srv.Token("alice"), "-device", "cli", "-keys", keys}, in, out)
	}()
	write := func(line string) {
		if _, err := io.WriteString(feed, line+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	waitOutput(t, out, "connected")
	write("/sdm bob")
	waitOutput(t, out, "end-to-end encrypted direct with bob")
	write("a secret for bob")
	waitOutput(t, out, "alice: a secret for bob")

	// Bob decrypts it with the SDK and answers encrypted.
	var conv uint64
	for conv == 0 {
		select {
		case ev := <-bob.Events():
			if ev.Kind != client.EventMessage || ev.Message.Kind != protocol.KindText {
				continue
			}
			o, err := bm.Open(*ev.Message)
			if err != nil {
				t.Fatalf("bob cannot open: %v", err)
			}
			if o.Text != "a secret for bob" {
				t.Fatalf("bob read %q", o.Text)
			}
			if ev.Message.Body == o.Text {
				t.Fatal("the server carried plaintext")
			}
			conv = ev.ConvID
		case <-ctx.Done():
			t.Fatal("bob never got the message")
		}
	}
	if _, err := bm.SendDirect(ctx, conv, "alice", "an encrypted answer"); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, out, "bob: an encrypted answer")
	write("/list")
	waitOutput(t, out, "[e2e]")
	write("/safety bob")
	waitOutput(t, out, "safety number with bob:")
	bobAccount, _, _ := bobDev.AccountKey()
	want := e2ee.FormatSafetyNumber(e2ee.SafetyNumber("bob", bobAccount, "alice", mustAccount(t, bm, "alice")))
	waitOutput(t, out, want)
	write("/quit")
	if err := <-done; err != nil {
		t.Fatalf("chat ended with %v\n%s", err, out.String())
	}
	if !regexp.MustCompile(`safety number with bob: (\d{5} ){11}\d{5}`).MatchString(out.String()) {
		t.Fatalf("safety number not printed as 12 groups of 5 digits:\n%s", out.String())
	}
	files, _ := filepath.Glob(filepath.Join(keys, "*", "alice", "cli", "*"))
	if len(files) == 0 {
		t.Fatal("no key files")
	}
	account, _ := filepath.Glob(filepath.Join(keys, "*", "alice", "+account"))
	if len(account) != 1 {
		t.Fatalf("account key files %v, want one", account)
	}
	files = append(files, account...)
	for _, f := range files {
		if st, err := os.Stat(f); err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: mode %v %v", f, st.Mode(), err)
		}
	}
}

// mustAccount is the account key bm trusts for user.
func mustAccount(t *testing.T, bm *e2eechat.Messenger, user string) e2ee.PublicKey {
	t.Helper()
	a, ok, err := bm.Device().PeerAccount(user)
	if err != nil || !ok {
		t.Fatalf("%s's account key unknown: %v", user, err)
	}
	return a.Key
}

// TestChatCLIE2EGroup: a CLI member of an E2E group someone else created
// reads its messages and answers with /use (members from conv_info).
func TestChatCLIE2EGroup(t *testing.T) {
	srv := servertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	alice, err := client.New(client.Config{URL: srv.URL, Token: srv.Token("alice"), Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = alice.Run(ctx) }()
	defer alice.Close()
	go func() {
		for range alice.Events() {
		}
	}()
	st := e2ee.NewMemoryStore()
	ad, _ := e2ee.OpenDevice(st, e2ee.Address{User: "alice", Device: "phone"})
	am := e2eechat.New(alice, ad, st)
	if _, err := am.PublishKeys(ctx, 3); err != nil {
		t.Fatal(err)
	}

	in, feed := io.Pipe()
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- runChat(ctx, []string{"-url", srv.URL, "-token", srv.Token("bob"), "-device", "cli", "-keys", t.TempDir()}, in, out)
	}()
	write := func(line string) {
		if _, err := io.WriteString(feed, line+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	waitOutput(t, out, "connected")
	g, err := alice.CreateGroupE2E(ctx, "crew", []string{"bob"})
	if err != nil {
		t.Fatal(err)
	}
	// The CLI publishes its keys once connected.
	for {
		devs, err := am.Devices(ctx, "bob", true)
		if err != nil {
			t.Fatal(err)
		}
		if len(devs) == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("bob's CLI never published keys")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := am.Send(ctx, g.ConvID, "hello crew"); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, out, "alice: hello crew")
	write("/use " + strconv.FormatUint(g.ConvID, 10))
	write("hello alice")
	waitOutput(t, out, "bob: hello alice")
	deadline := time.Now().Add(30 * time.Second)
	for {
		msgs, _, err := alice.History(ctx, g.ConvID, client.HistoryQuery{Forward: true, Limit: 50})
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, m := range msgs {
			if o, err := am.Open(m); err == nil && o.Text == "hello alice" && m.Sender == "bob" {
				found = true
			}
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alice never read bob's answer\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	write("/quit")
	if err := <-done; err != nil {
		t.Fatalf("chat ended with %v\n%s", err, out.String())
	}
}

// e2ePeer is an SDK user with E2E keys on srv, for the CLI to talk to.
type e2ePeer struct {
	c *client.Client
	m *e2eechat.Messenger
}

func startE2EPeer(t *testing.T, ctx context.Context, srv *servertest.Server, user string) *e2ePeer {
	t.Helper()
	c, err := client.New(client.Config{URL: srv.URL, Token: srv.Token(user), Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Run(ctx) }()
	t.Cleanup(func() { _ = c.Close() })
	go func() {
		for range c.Events() {
		}
	}()
	st := e2ee.NewMemoryStore()
	d, err := e2ee.OpenDevice(st, e2ee.Address{User: user, Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	m := e2eechat.New(c, d, st)
	if _, err := m.PublishKeys(ctx, 5); err != nil {
		t.Fatal(err)
	}
	return &e2ePeer{c: c, m: m}
}

// runE2ECLI runs `parley-chat` as user on srv with key directory keys.
func runE2ECLI(t *testing.T, ctx context.Context, srv *servertest.Server, user, keys string) (write func(string), out *syncBuffer, done chan error) {
	t.Helper()
	in, feed := io.Pipe()
	out = &syncBuffer{}
	done = make(chan error, 1)
	go func() {
		done <- runChat(ctx, []string{"-url", srv.URL, "-token", srv.Token(user), "-device", "cli", "-keys", keys}, in, out)
	}()
	write = func(line string) {
		if _, err := io.WriteString(feed, line+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	return write, out, done
}

// plainFrom reports whether conv's history on the server holds text from
// sender in plaintext.
func plainFrom(t *testing.T, ctx context.Context, c *client.Client, conv uint64, sender, text string) bool {
	t.Helper()
	msgs, _, err := c.History(ctx, conv, client.HistoryQuery{Forward: true, Limit: 50})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if m.Sender == sender && strings.Contains(m.Body, text) {
			return true
		}
	}
	return false
}

// TestChatCLIE2EKeysPerServer: a device that used E2E against one server
// starts afresh against another (its keys are kept per server) instead of
// failing /sdm, and the line typed after /sdm goes out encrypted.
func TestChatCLIE2EKeysPerServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	keys := t.TempDir()
	first := servertest.Start(t)
	write, out, done := runE2ECLI(t, ctx, first, "alice", keys)
	waitOutput(t, out, "connected")
	for {
		if published(keys) {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("keys never published on the first server")
		}
		time.Sleep(20 * time.Millisecond)
	}
	write("/quit")
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	second := servertest.Start(t)
	erin := startE2EPeer(t, ctx, second, "erin")
	write, out, done = runE2ECLI(t, ctx, second, "alice", keys)
	waitOutput(t, out, "connected")
	write("/dm erin")
	waitOutput(t, out, "direct with erin")
	write("/sdm erin")
	write("for erin only")
	write("/quit")
	if err := <-done; err != nil {
		t.Fatalf("chat ended with %v\n%s", err, out.String())
	}
	if strings.Contains(out.String(), "! ") {
		t.Fatalf("an error against the second server:\n%s", out.String())
	}
	list, err := erin.c.Conversations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, cv := range list {
		if plainFrom(t, ctx, erin.c, cv.ConvID, "alice", "for erin only") {
			t.Fatalf("conv %d carried the line in plaintext\n%s", cv.ConvID, out.String())
		}
	}
	if files, _ := filepath.Glob(filepath.Join(keys, "*", "alice", "cli")); len(files) != 2 {
		t.Fatalf("key directories %v, want one per server", files)
	}
}

// TestChatCLIE2EFailedSDMClearsCurrent: when /sdm or /sgroup fails, the
// conversation that was current (a plain one) is current no more, so the
// next line typed is not sent unencrypted.
func TestChatCLIE2EFailedSDMClearsCurrent(t *testing.T) {
	for _, cmd := range []string{"/sdm erin", "/sgroup crew erin"} {
		t.Run(strings.Fields(cmd)[0][1:], func(t *testing.T) {
			srv := servertest.Start(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			erin := startE2EPeer(t, ctx, srv, "erin")
			// A key directory that cannot be created makes E2E fail.
			blocker := filepath.Join(t.TempDir(), "file")
			if err := os.WriteFile(blocker, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			write, out, done := runE2ECLI(t, ctx, srv, "alice", blocker)
			waitOutput(t, out, "connected")
			write("/dm erin")
			waitOutput(t, out, "direct with erin")
			write(cmd)
			waitOutput(t, out, "no current conversation (conv")
			write("meant to be encrypted")
			waitOutput(t, out, "! no current conversation")
			write("/quit")
			if err := <-done; err != nil {
				t.Fatalf("chat ended with %v\n%s", err, out.String())
			}
			dm, err := erin.c.OpenDirect(ctx, "alice")
			if err != nil {
				t.Fatal(err)
			}
			if plainFrom(t, ctx, erin.c, dm.ConvID, "alice", "meant to be encrypted") {
				t.Fatalf("the line went out in the plain DM\n%s", out.String())
			}
		})
	}
}

// TestChatCLIE2EGroupRemovalRotates: when the owner removes a member from
// an E2E group, or a member leaves, the CLI member's next message is under
// a new sender key the former member does not have.
func TestChatCLIE2EGroupRemovalRotates(t *testing.T) {
	for _, tc := range []struct {
		name, shown string
		leave       func(ctx context.Context, alice, carol *e2ePeer, conv uint64) error
	}{
		{"removed", "alice removed carol", func(ctx context.Context, alice, _ *e2ePeer, conv uint64) error {
			_, err := alice.c.RemoveMembers(ctx, conv, []string{"carol"})
			return err
		}},
		{"left", "carol left", func(ctx context.Context, _, carol *e2ePeer, conv uint64) error {
			_, err := carol.c.Leave(ctx, conv)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testGroupRotates(t, tc.shown, tc.leave)
		})
	}
}

func testGroupRotates(t *testing.T, shown string, leave func(ctx context.Context, alice, carol *e2ePeer, conv uint64) error) {
	srv := servertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	alice := startE2EPeer(t, ctx, srv, "alice")
	carol := startE2EPeer(t, ctx, srv, "carol")
	write, out, done := runE2ECLI(t, ctx, srv, "bob", t.TempDir())
	waitOutput(t, out, "connected")
	g, err := alice.c.CreateGroupE2E(ctx, "crew", []string{"bob", "carol"})
	if err != nil {
		t.Fatal(err)
	}
	for {
		devs, err := alice.m.Devices(ctx, "bob", true)
		if err != nil {
			t.Fatal(err)
		}
		if len(devs) == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("bob's CLI never published keys")
		}
		time.Sleep(20 * time.Millisecond)
	}
	write("/use " + strconv.FormatUint(g.ConvID, 10))
	write("before the removal")
	waitOutput(t, out, "bob: before the removal")
	// carol reads it: she holds bob's sender key.
	history := func(c *client.Client) []protocol.Message {
		msgs, _, err := c.History(ctx, g.ConvID, client.HistoryQuery{Forward: true, Limit: 50})
		if err != nil {
			t.Fatal(err)
		}
		return msgs
	}
	read := false
	for _, m := range history(carol.c) {
		if o, err := carol.m.Open(m); err == nil && o.Text == "before the removal" {
			read = true
		}
	}
	if !read {
		t.Fatal("carol could not read bob's message while a member")
	}
	if err := leave(ctx, alice, carol, g.ConvID); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, out, shown)
	write("after the removal")
	waitOutput(t, out, "bob: after the removal")
	write("/quit")
	if err := <-done; err != nil {
		t.Fatalf("chat ended with %v\n%s", err, out.String())
	}
	// The server (or anyone with the ciphertext) hands carol the message
	// she is no longer sent: she must not be able to read it.
	var after *protocol.Message
	msgs := history(alice.c)
	for i := range msgs {
		if o, err := alice.m.Open(msgs[i]); err == nil && o.Text == "after the removal" {
			after = &msgs[i]
		}
	}
	if after == nil {
		t.Fatalf("alice cannot read bob's message after the removal\n%s", out.String())
	}
	if o, err := carol.m.Open(*after); err == nil {
		t.Fatalf("former member carol read %q: the sender key was not rotated", o.Text)
	}
}

// published reports whether a key store under dir holds "published".
func published(dir string) bool {
	found := false
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, _ error) error {
		found = found || (d != nil && d.Name() == "published")
		return nil
	})
	return found
}

// TestChatPrompt: the prompt names the conversation a line goes to and
// whether it is encrypted; /dm, /use and /sdm say it too.
func TestChatPrompt(t *testing.T) {
	s := &chatSession{e2e: &e2eState{convs: map[uint64]e2eConv{7: {}}}}
	for _, tc := range []struct {
		current uint64
		want    string
	}{
		{0, "no conversation> "},
		{4, "conv 4 plain> "},
		{7, "conv 7 e2e> "},
	} {
		s.current = tc.current
		if got := s.promptText(); got != tc.want {
			t.Errorf("current %d: prompt %q, want %q", tc.current, got, tc.want)
		}
	}
	if isTerminal(strings.NewReader("")) {
		t.Error("a reader is taken for a terminal")
	}

	srv := servertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	erin := startE2EPeer(t, ctx, srv, "erin")
	write, out, done := runE2ECLI(t, ctx, srv, "alice", t.TempDir())
	waitOutput(t, out, "connected")
	write("/dm erin")
	waitOutput(t, out, "direct with erin (not encrypted)")
	write("/sdm erin")
	waitOutput(t, out, "end-to-end encrypted direct with erin")
	dm, err := erin.c.OpenDirect(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	write("/use " + strconv.FormatUint(dm.ConvID, 10))
	for strings.Count(out.String(), "direct with erin (not encrypted)") < 2 { // /dm's, then /use's
		if ctx.Err() != nil {
			t.Fatalf("/use does not say the conversation is not encrypted:\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	write("/list")
	waitOutput(t, out, "direct with erin  [e2e]")
	write("/quit")
	if err := <-done; err != nil {
		t.Fatalf("chat ended with %v\n%s", err, out.String())
	}
}

// TestChatCLIE2EServerForgotDevice: a server that no longer knows the
// device's keys (its data was reset) gets no silent new identity: the CLI
// says so, /sdm fails and the plain DM that was current is left.
func TestChatCLIE2EServerForgotDevice(t *testing.T) {
	srv := servertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	keys := t.TempDir()
	erin := startE2EPeer(t, ctx, srv, "erin")
	write, out, done := runE2ECLI(t, ctx, srv, "alice", keys)
	waitOutput(t, out, "connected")
	for !published(keys) {
		if ctx.Err() != nil {
			t.Fatal("keys never published")
		}
		time.Sleep(20 * time.Millisecond)
	}
	write("/quit")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The server forgets the device, as a reset of its data would.
	forget, err := client.New(client.Config{URL: srv.URL, Token: srv.Token("alice"), Device: "cli"})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = forget.Run(ctx) }()
	if err := forget.RemoveKeys(ctx); err != nil {
		t.Fatal(err)
	}
	_ = forget.Close()

	write, out, done = runE2ECLI(t, ctx, srv, "alice", keys)
	waitOutput(t, out, "does not know the keys of device cli")
	write("/dm erin")
	waitOutput(t, out, "direct with erin (not encrypted)")
	write("/sdm erin")
	waitOutput(t, out, "no current conversation (conv")
	write("meant to be encrypted")
	waitOutput(t, out, "! no current conversation")
	write("/quit")
	if err := <-done; err != nil {
		t.Fatalf("chat ended with %v\n%s", err, out.String())
	}
	dm, err := erin.c.OpenDirect(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if plainFrom(t, ctx, erin.c, dm.ConvID, "alice", "meant to be encrypted") {
		t.Fatalf("the line went out in the plain DM\n%s", out.String())
	}
}

// TestChatCLIE2ERecall: in an E2E conversation a recall without its
// author's envelope (what the server's moderation or a forger sends) is a
// warning line, not applied; the peer's sealed recall prints as a recall;
// /edit and /recall seal what the peer's SDK applies.
func TestChatCLIE2ERecall(t *testing.T) {
	srv := servertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bob := startE2EPeer(t, ctx, srv, "bob")
	write, out, done := runE2ECLI(t, ctx, srv, "alice", t.TempDir())
	waitOutput(t, out, "connected")
	write("/sdm bob")
	waitOutput(t, out, "end-to-end encrypted direct with bob")
	write("the door code is 4711")
	mine := regexp.MustCompile(`\[(\d+) (\d+)\] alice: the door code is 4711`)
	waitOutput(t, out, "alice: the door code is 4711")
	sub := mine.FindStringSubmatch(out.String())
	if sub == nil {
		t.Fatalf("no seq for alice's line:\n%s", out.String())
	}
	conv, _ := strconv.ParseUint(sub[1], 10, 64)
	mySeq, _ := strconv.ParseUint(sub[2], 10, 64)

	b1, err := bob.m.SendDirect(ctx, conv, "alice", "meet at 10")
	if err != nil {
		t.Fatal(err)
	}
	b2, err := bob.m.SendDirect(ctx, conv, "alice", "meet at 11")
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, out, "bob: meet at 11")
	bare, err := bob.c.Recall(ctx, conv, b1.Seq) // no envelope
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, out, "seq "+strconv.FormatUint(bare.Seq, 10)+" refused: e2eechat: recall not authenticated by the author")
	if _, err := bob.m.RecallDirect(ctx, conv, b2.Seq, "alice"); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, out, "bob recalled #"+strconv.FormatUint(b2.Seq, 10))
	if strings.Contains(out.String(), "bob recalled #"+strconv.FormatUint(b1.Seq, 10)) {
		t.Fatalf("the recall without an envelope printed as bob's:\n%s", out.String())
	}

	write("/edit " + strconv.FormatUint(mySeq, 10) + " the door code is 0815")
	waitOutput(t, out, "alice edited #"+strconv.FormatUint(mySeq, 10)+": the door code is 0815")
	write("/reply " + strconv.FormatUint(mySeq, 10) + " see you then")
	waitOutput(t, out, "(re #"+strconv.FormatUint(mySeq, 10)+") see you then")
	write("/recall " + strconv.FormatUint(mySeq, 10))
	waitOutput(t, out, "alice recalled #"+strconv.FormatUint(mySeq, 10))
	write("/quit")
	if err := <-done; err != nil {
		t.Fatalf("chat ended with %v\n%s", err, out.String())
	}
	msgs, _, err := bob.c.History(ctx, conv, client.HistoryQuery{Forward: true, Limit: 50})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		o, err := bob.m.Open(m)
		if m.Kind == protocol.KindRecall && m.TargetSeq == mySeq && err != nil {
			t.Fatalf("bob refuses alice's /recall: %v", err)
		}
		if m.Kind == protocol.KindEdit && m.TargetSeq == mySeq && (err != nil || o.Text != "the door code is 0815") {
			t.Fatalf("bob's SDK on alice's /edit: %+v %v", o, err)
		}
		if m.ReplyTo != 0 && (m.ReplyTo != mySeq || err != nil || o.Text != "see you then") {
			t.Fatalf("bob's SDK on alice's /reply: %+v %+v %v", m, o, err)
		}
	}
	recalled := false
	for _, m := range msgs { // the target comes before its recall: again
		if m.Seq == mySeq {
			o, err := bob.m.Open(m)
			recalled = err == nil && o.Recalled
		}
	}
	if !recalled {
		t.Fatal("bob's SDK did not apply alice's /recall")
	}
}

// TestReadReceiptNeverBeforeItsMessage: a read receipt that overtakes the
// printing of the message it names (the peer read it before this
// device's own ack was printed) waits for that message; one for messages
// already printed, or in a conversation nothing was printed of, prints at
// once.
func TestReadReceiptNeverBeforeItsMessage(t *testing.T) {
	var out bytes.Buffer
	s := &chatSession{out: &out, me: "alice", printed: map[[2]uint64]bool{}}
	s.printOnce(&protocol.Message{ConvID: 5, Seq: 1, Sender: "alice", Kind: protocol.KindText, Body: "one"})
	s.readReceipt(5, "bob", 2) // overtook message 2
	s.readReceipt(9, "carol", 40)
	s.printOnce(&protocol.Message{ConvID: 5, Seq: 2, Sender: "alice", Kind: protocol.KindText, Body: "two"})
	s.readReceipt(5, "bob", 1) // already printed: at once
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{"one", "carol read up to 40", "two", "bob read up to 2", "bob read up to 1"}
	if len(lines) != len(want) {
		t.Fatalf("printed %q", lines)
	}
	for i, w := range want {
		if !strings.Contains(lines[i], w) {
			t.Fatalf("line %d = %q, want it to contain %q (all: %q)", i, lines[i], w, lines)
		}
	}
}
