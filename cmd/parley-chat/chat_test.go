package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// syncBuffer is an io.Writer safe to read while the CLI writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func waitOutput(t *testing.T, out *syncBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(out.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestChatCLI drives `parley-chat` through a pipe against a real server:
// it opens a direct conversation, sends, receives the peer's reply and
// lists the conversation.
func TestChatCLI(t *testing.T) {
	srv := servertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	bob, err := client.New(client.Config{URL: srv.URL, Token: srv.Token("bob"), Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = bob.Run(ctx) }()
	defer bob.Close()

	in, feed := io.Pipe()
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- runChat(ctx, []string{"-url", srv.URL, "-token", srv.Token("alice"), "-device", "cli", "-keys", t.TempDir()}, in, out)
	}()

	write := func(line string) {
		if _, err := io.WriteString(feed, line+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	write("/dm bob")
	write("hello from the terminal")
	waitOutput(t, out, "alice: hello from the terminal")

	// bob receives it through the SDK and answers.
	var conv uint64
	for conv == 0 {
		select {
		case ev := <-bob.Events():
			if ev.Kind == client.EventMessage && ev.Message.Body == "hello from the terminal" {
				conv = ev.ConvID
			}
		case <-ctx.Done():
			t.Fatal("bob never got the message")
		}
	}
	if _, err := bob.Send(ctx, conv, "hi terminal"); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, out, "bob: hi terminal")
	write("/list")
	waitOutput(t, out, "bob")
	write("/history 5")
	write("/quit")
	if err := <-done; err != nil {
		t.Fatalf("chat ended with %v\n%s", err, out.String())
	}
}

// chatCLI is a `parley-chat` run on a pipe for a test.
type chatCLI struct {
	t    *testing.T
	out  *syncBuffer
	feed *io.PipeWriter
	done chan error
}

func startChatCLI(t *testing.T, ctx context.Context, url, token string) *chatCLI {
	t.Helper()
	in, feed := io.Pipe()
	c := &chatCLI{t: t, out: &syncBuffer{}, feed: feed, done: make(chan error, 1)}
	go func() {
		c.done <- runChat(ctx, []string{"-url", url, "-token", token, "-device", "cli", "-keys", t.TempDir()}, in, c.out)
	}()
	t.Cleanup(func() { feed.Close() })
	return c
}

func (c *chatCLI) write(line string) {
	c.t.Helper()
	if _, err := io.WriteString(c.feed, line+"\n"); err != nil {
		c.t.Fatal(err)
	}
}

// do writes line and waits for want in the output after it.
func (c *chatCLI) do(line, want string) {
	c.t.Helper()
	mark := len(c.out.String())
	c.write(line)
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(c.out.String()[mark:], want) {
		if time.Now().After(deadline) {
			c.t.Fatalf("after %q the output lacks %q:\n%s", line, want, c.out.String()[mark:])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (c *chatCLI) quit() {
	c.t.Helper()
	c.write("/quit")
	if err := <-c.done; err != nil {
		c.t.Fatalf("chat ended with %v\n%s", err, c.out.String())
	}
}

// sdkUser runs an SDK client whose events are collected.
type sdkUser struct {
	*client.Client
	mu  sync.Mutex
	evs []client.Event
}

func startSDKUser(t *testing.T, ctx context.Context, srv *servertest.Server, user string) *sdkUser {
	t.Helper()
	c, err := client.New(client.Config{URL: srv.URL, Token: srv.Token(user), Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	u := &sdkUser{Client: c}
	go func() { _ = c.Run(ctx) }()
	go func() {
		for ev := range c.Events() {
			u.mu.Lock()
			u.evs = append(u.evs, ev)
			u.mu.Unlock()
		}
	}()
	t.Cleanup(func() { c.Close() })
	u.wait(t, "connected", func(ev client.Event) bool { return ev.Kind == client.EventConnected })
	return u
}

func (u *sdkUser) wait(t *testing.T, what string, match func(client.Event) bool) client.Event {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		u.mu.Lock()
		for _, ev := range u.evs {
			if match(ev) {
				u.mu.Unlock()
				return ev
			}
		}
		u.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("no event: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var convLine = regexp.MustCompile(`\* conv (\d+): group`)

// TestChatCLIGroupActions: every group and message action from the CLI,
// system events printed as sentences, mentions and state messages, and
// the owner's own messages never unread in /list.
func TestChatCLIGroupActions(t *testing.T) {
	srv := servertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bob := startSDKUser(t, ctx, srv, "bob")
	cli := startChatCLI(t, ctx, srv.URL, srv.Token("alice"))
	cli.do("/group team bob carol", "* conv ")
	m := convLine.FindStringSubmatch(cli.out.String())
	if m == nil {
		t.Fatalf("no group line:\n%s", cli.out.String())
	}
	conv := m[1]
	cli.do("/add dave erin", "alice added dave, erin")
	cli.do("/remove erin", "alice removed erin")
	cli.do("/role bob admin", "alice made bob an admin")
	cli.do("/mute carol", "alice muted carol")
	cli.do("/unmute carol", "alice unmuted carol")
	cli.do("/notify off 8h", "notifications off until ")
	cli.do("/list", "(notifications off)")
	cli.do("/notify off", "notifications off until you turn them on")
	cli.do("/notify on", "notifications on")
	cli.do("/notify maybe", "off [DURATION] or on")
	cli.do("/dnd 1h", "do-not-disturb on until ")
	cli.do("/dnd", "do-not-disturb on until ")
	cli.do("/dnd off", "do-not-disturb off")
	cli.do("/info", "you are owner")
	cli.do("hello team", "alice: hello team")
	// The ack's seq is the second number of the line.
	seqOf := func(text string) string {
		re := regexp.MustCompile(`\[` + conv + ` (\d+)\] alice: ` + regexp.QuoteMeta(text))
		m := re.FindStringSubmatch(cli.out.String())
		if m == nil {
			t.Fatalf("no line for %q:\n%s", text, cli.out.String())
		}
		return m[1]
	}
	seq := seqOf("hello team")
	cli.do("/edit "+seq+" hello  everyone", "alice edited #"+seq+": hello  everyone")
	cli.do("oops", "alice: oops")
	oops := seqOf("oops")
	cli.do("/recall "+oops, "alice recalled #"+oops)
	cli.do("/state stock 3 left", "alice set stock: 3 left")
	cli.do("/reply "+seq+" and  welcome", "alice: (re #"+seq+") and  welcome")
	cli.do("/reply "+oops+" to nothing", "conflict")
	cli.do("/reply 999 to nothing", "bad_reference")
	cli.do("/readby "+seq, "* #"+seq+" read by 0 of ")
	cli.do("/readby 999", "bad_reference")
	cli.do("/react", "* reactions: 👍 ❤️")
	cli.do("/react "+seq+" 👍", "alice reacted 👍 on #"+seq+" (👍 1)")
	cli.do("/react "+seq+" 🦄", "invalid_argument")
	cli.do("/unreact "+seq+" 😂", "conflict")
	cli.do("/history 20", "alice: hello  everyone (edited)  [👍 1*]")
	cli.do("@bob please look", "alice: @bob please look")

	// bob sees the mention, the system events and the edit.
	bob.wait(t, "mention of bob", func(ev client.Event) bool {
		return ev.Kind == client.EventMessage && ev.Message.Body == "@bob please look" && len(ev.Message.Mentions) == 1 && ev.Message.Mentions[0] == "bob"
	})
	list, err := bob.Conversations(ctx)
	if err != nil || len(list) != 1 || !list[0].Mentioned {
		t.Fatalf("bob's list %+v, %v: want mentioned", list, err)
	}
	// bob's answer prints for alice; bob's mention of alice is marked.
	id, _ := strconv.ParseUint(conv, 10, 64)
	if _, err := bob.SendWith(ctx, id, "@alice done", client.SendOptions{Mentions: []string{"alice"}}); err != nil {
		t.Fatal(err)
	}
	cli.do("/history 3", "bob: @alice done   <- @alice")
	cli.do("/search please look", "alice: @bob [please] [look]")
	cli.do("/search nothing like this", "* nothing found")
	// Own messages never unread: only bob's message counts.
	cli.do("/list", "unread 1")
	cli.do("/read", "read up to")
	cli.do("/list", "unread 0")

	// Refusals are explained; the owner hands over and leaves.
	cli.do("/leave", "forbidden: the owner cannot leave")
	cli.do("/role bob owner", "you are admin")
	bob.wait(t, "handover event", func(ev client.Event) bool {
		return ev.Kind == client.EventMessage && ev.Message.Kind == protocol.KindSystem && strings.Contains(ev.Message.Body, `"role":"owner"`)
	})
	cli.do("/leave", "you left conv "+conv)
	cli.do("still here", "no current conversation")
	cli.do("/use "+conv, "no longer a member")
	cli.do("still here", "not_member")
	if _, err := bob.Mute(ctx, id, "carol", true); err != nil {
		t.Fatal(err)
	}
	cli.quit()
	if strings.Contains(cli.out.String(), `{"event"`) {
		t.Fatalf("a system event printed as JSON:\n%s", cli.out.String())
	}
}

// TestChatCLIChecks: malformed commands are refused at once with their
// usage, /use refuses a conversation that is not the user's, and /help
// lists every command.
func TestChatCLIChecks(t *testing.T) {
	srv := servertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := startChatCLI(t, ctx, srv.URL, srv.Token("alice"))
	cli.do("/help", "/quit")
	for _, c := range chatCommands {
		if !strings.Contains(cli.out.String(), "  "+c.name) {
			t.Errorf("/help lacks %s", c.name)
		}
	}
	cli.do("/use 123", "conversation 123 is not one of yours")
	cli.do("/use abc", `"abc" is not a conversation id`)
	cli.do("/use", "usage: /use CONV")
	cli.do("/dm", "usage: /dm USER")
	cli.do("/dm a b", "usage: /dm USER")
	cli.do("/frobnicate", "unknown command /frobnicate")
	cli.do("hello?", "no current conversation")
	cli.do("/edit 3 x", "no current conversation")
	cli.do("/dm bob", "direct with bob")
	cli.do("/edit x new text", `"x" is not a message seq`)
	cli.do("/recall 0", `"0" is not a message seq`)
	cli.do("/history 0", "N must be 1..200")
	cli.do("/role bob king", `"king" is not member, admin or owner`)
	cli.do("/add b!b", `"b!b" is not a user id`)
	cli.do("/add carol", "invalid_argument") // not a group
	cli.do("/edit 99 x", "not_found")
	cli.do("/watch stranger", "not_member")
	cli.quit()
}

// TestChatCLIPresenceAndTyping: /watch shows the peer's presence as it
// changes, typing notices print both ways (/typing sends one).
func TestChatCLIPresenceAndTyping(t *testing.T) {
	srv := servertest.Start(t, servertest.WithConfig(func(c *config.Config) {
		c.Presence.Flush, c.Presence.MinGap = 50*time.Millisecond, 50*time.Millisecond
	}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := startChatCLI(t, ctx, srv.URL, srv.Token("alice"))
	cli.do("/dm bob", "direct with bob")
	cli.do("/watch bob", "bob is offline")
	bob := startSDKUser(t, ctx, srv, "bob")
	waitOutput(t, cli.out, "bob is online")
	conv, err := bob.OpenDirect(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if err := bob.Typing(ctx, conv.ConvID); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, cli.out, "bob is typing...")
	cli.write("/typing")
	bob.wait(t, "alice typing", func(ev client.Event) bool {
		return ev.Kind == client.EventTyping && ev.Typing.UserID == "alice"
	})
	bob.Close()
	waitOutput(t, cli.out, "bob is offline (last seen")
	cli.do("/watch", "watching nobody")
	cli.quit()
}

// TestChatCLIUnreachable: with no server, the CLI says where it connects,
// reports each failed attempt with its error and delay, and a command
// fails at once with a clear message instead of hanging.
func TestChatCLIUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := startChatCLI(t, ctx, "ws://"+addr, "any-token")
	waitOutput(t, cli.out, "* connecting to ws://"+addr)
	waitOutput(t, cli.out, "* reconnecting to ws://"+addr)
	waitOutput(t, cli.out, "connection refused")
	cli.do("/list", "! list: not connected to ws://"+addr)
	cli.do("/dm bob", "! dm: not connected")
	cli.do("/help", "/watch")
	cli.quit()
}

// TestChatCLIReconnects: a server that goes away is reported, commands
// fail fast meanwhile, and the CLI is back once the server is.
func TestChatCLIReconnects(t *testing.T) {
	srv := servertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cli := startChatCLI(t, ctx, srv.URL, srv.Token("alice"))
	cli.do("/dm bob", "direct with bob")
	srv.Close()
	waitOutput(t, cli.out, "* reconnecting to "+srv.URL)
	cli.do("/list", "! list: not connected")
	srv2 := servertest.Start(t, servertest.WithDataDir(srv.DataDir), servertest.WithKey(srv.Key()), servertest.WithConfig(func(c *config.Config) {
		c.Listen = strings.TrimPrefix(srv.URL, "ws://")
	}))
	_ = srv2
	waitOutput(t, cli.out, "* connected to")
	deadline := time.Now().Add(30 * time.Second)
	for {
		mark := len(cli.out.String())
		cli.write("/list")
		time.Sleep(200 * time.Millisecond)
		if strings.Contains(cli.out.String()[mark:], "direct with bob") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/list never worked again:\n%s", cli.out.String())
		}
	}
	cli.quit()
}

// FuzzChatText: the CLI's parsing of typed lines (mentions) and rendering
// of incoming messages (system events included) never panic, mentions are
// valid user ids each named once, and a line never spans two lines of
// output unless the body itself does.
func FuzzChatText(f *testing.F) {
	f.Add("hello @bob and @everyone!", `{"event":"member_added","actor":"alice","users":["bob"]}`)
	f.Add("@", `{"event":"role_changed","actor":"a","users":["b"],"role":"admin"}`)
	f.Add("@@x @a.b, @all", `{"event":"identity_changed","actor":"a","users":["a"],"device":"d"}`)
	f.Add("", "{")
	f.Fuzz(func(t *testing.T, line, sys string) {
		users, _ := mentions(line)
		for i, u := range users {
			if !protocol.ValidID(u) || slices.Contains(users[:i], u) {
				t.Fatalf("mentions(%q) = %q", line, users)
			}
		}
		for _, m := range []*protocol.Message{
			{Kind: protocol.KindSystem, Body: sys, Sender: "a"},
			{Kind: protocol.KindText, Body: line, Sender: "a", Mentions: users},
			{Kind: protocol.KindState, Body: line, CoalesceKey: "k", Sender: "a"},
			{Kind: protocol.KindEdit, Body: line, TargetSeq: 1, Sender: "a"},
		} {
			out := chatFormat(m, "b")
			if !strings.Contains(m.Body, "\n") && m.Kind != protocol.KindSystem && strings.Contains(out, "\n") {
				t.Fatalf("%q rendered over several lines: %q", m.Body, out)
			}
		}
	})
}

// A message arriving while no conversation is current makes its
// conversation current, so the next line typed answers it.
func TestChatCLIIncomingBecomesCurrent(t *testing.T) {
	srv := servertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bob := startSDKUser(t, ctx, srv, "bob")
	cli := startChatCLI(t, ctx, srv.URL, srv.Token("alice"))
	cli.do("/list", "no conversations") // connected, nothing current
	conv, err := bob.OpenDirect(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bob.Send(ctx, conv.ConvID, "are you there?"); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, cli.out, fmt.Sprintf("* conv %d: direct with bob (not encrypted)", conv.ConvID))
	cli.write("yes, here")
	bob.wait(t, "alice's answer", func(ev client.Event) bool {
		return ev.Kind == client.EventMessage && ev.ConvID == conv.ConvID && ev.Message.Body == "yes, here"
	})
	// A conversation chosen stays current when another one speaks.
	carol := startSDKUser(t, ctx, srv, "carol")
	other, err := carol.OpenDirect(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := carol.Send(ctx, other.ConvID, "hello alice"); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, cli.out, "carol: hello alice")
	cli.write("still for bob")
	bob.wait(t, "alice's second answer", func(ev client.Event) bool {
		return ev.Kind == client.EventMessage && ev.ConvID == conv.ConvID && ev.Message.Body == "still for bob"
	})
	cli.quit()
}

// /use takes a conversation id, a name (the peer of a direct
// conversation, a group's name) or the index /list printed.
func TestChatCLIUseByNameOrIndex(t *testing.T) {
	srv := servertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	startSDKUser(t, ctx, srv, "bob")
	startSDKUser(t, ctx, srv, "carol")
	cli := startChatCLI(t, ctx, srv.URL, srv.Token("alice"))
	cli.do("/dm bob", "direct with bob")
	cli.do("/group team bob carol", "group team")
	cli.do("/group carol bob", "group carol")
	cli.do("/dm carol", "direct with carol")

	mark := len(cli.out.String())
	cli.do("/list", "direct with carol")
	listed := regexp.MustCompile(`(?m)^. \[(\d+)\] (\d+)  (.*?)  unread`).FindAllStringSubmatch(cli.out.String()[mark:], -1)
	if len(listed) != 4 {
		t.Fatalf("/list printed %d indexed lines:\n%s", len(listed), cli.out.String()[mark:])
	}
	for _, l := range listed {
		cli.do("/use "+l[1], "* conv "+l[2]+": "+l[3])
		cli.do("/use "+l[2], "* conv "+l[2]+": "+l[3])
	}
	cli.do("/use bob", ": direct with bob")
	cli.do("/use team", ": group team")
	cli.do("/use carol", `! use: "carol" names 2 conversations`)
	cli.do("/use dave", `! use: "dave" is not a conversation id nor the name of one of yours`)
	cli.do("/use 9", "! use: conversation 9 is not one of yours nor an index of the last /list (1–4)")
	cli.quit()
}

// /history shows an edited or recalled message once, in its final form,
// not also as the edit or recall event after it; an event whose target
// is older than the page still shows.
func TestChatCLIHistoryEditOnce(t *testing.T) {
	srv := servertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	startSDKUser(t, ctx, srv, "bob")
	cli := startChatCLI(t, ctx, srv.URL, srv.Token("alice"))
	cli.do("/dm bob", "direct with bob")
	cli.do("first", "alice: first")
	cli.do("second draft", "alice: second draft")
	cli.do("third", "alice: third")
	out := cli.out.String()
	seqs := regexp.MustCompile(`\[\d+ (\d+)\] alice: (second draft|third)`).FindAllStringSubmatch(out, -1)
	if len(seqs) != 2 {
		t.Fatalf("seqs of the messages: %v\n%s", seqs, out)
	}
	cli.do("/edit "+seqs[0][1]+" second, final", "edited #"+seqs[0][1])
	cli.do("/recall "+seqs[1][1], "recalled #"+seqs[1][1])

	mark := len(cli.out.String())
	cli.do("/history 10", "second, final (edited)")
	time.Sleep(200 * time.Millisecond) // the whole page
	page := cli.out.String()[mark:]
	if n := strings.Count(page, "second, final"); n != 1 {
		t.Fatalf("/history shows the edit %d times:\n%s", n, page)
	}
	if strings.Contains(page, "recalled #") || !strings.Contains(page, "(recalled)") {
		t.Fatalf("/history shows the recall as an event, or not at all:\n%s", page)
	}
	// A page that holds the edit but not its target shows the event.
	mark = len(cli.out.String())
	cli.do("/history 2", "edited #"+seqs[0][1]+": second, final")
	cli.quit()
}
