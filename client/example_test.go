package client_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// The examples run against a real Parley node started in-process by
// servertest.Launch (a helper of this repository's tests). Against your
// own server, use its WebSocket URL and tokens from your auth service
// (`parley token -user NAME` in development).

// exampleServer starts a node on a temporary directory.
func exampleServer() (*servertest.Server, func()) {
	dir, err := os.MkdirTemp("", "parley-example-")
	if err != nil {
		panic(err)
	}
	srv, err := servertest.Launch(dir)
	if err != nil {
		panic(err)
	}
	return srv, func() { srv.Close(); os.RemoveAll(dir) }
}

// connect starts a client for user and waits until it is connected.
func connect(srv *servertest.Server, user string) *client.Client {
	c, err := client.New(client.Config{URL: srv.URL, Token: srv.Token(user), Device: "phone"})
	if err != nil {
		panic(err)
	}
	go c.Run(context.Background())
	next(c, func(ev client.Event) bool { return ev.Kind == client.EventConnected })
	return c
}

// next returns the first event of c that match accepts (others are
// skipped), or panics after 10 s.
func next(c *client.Client, match func(client.Event) bool) client.Event {
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-c.Events():
			if match(ev) {
				return ev
			}
		case <-timeout:
			panic("no such event")
		}
	}
}

func message(kind string) func(client.Event) bool {
	return func(ev client.Event) bool { return ev.Kind == client.EventMessage && ev.Message.Kind == kind }
}

// Two users chat in a direct conversation: Send returns once the message
// is stored (its seq); the peer receives it on its Events stream.
func Example() {
	srv, stop := exampleServer()
	defer stop()
	ctx := context.Background()
	alice, bob := connect(srv, "alice"), connect(srv, "bob")
	defer alice.Close()
	defer bob.Close()

	conv, err := alice.OpenDirect(ctx, "bob")
	if err != nil {
		fmt.Println(err)
		return
	}
	ack, err := alice.Send(ctx, conv.ConvID, "hello bob")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("stored at seq", ack.Seq)
	ev := next(bob, message(protocol.KindText))
	fmt.Printf("bob got %s: %s\n", ev.Message.Sender, ev.Message.Body)
	// Output:
	// stored at seq 1
	// bob got alice: hello bob
}

// Group administration: each change answers the group as it is now and
// reaches every member as a system message.
func ExampleClient_SetRole() {
	srv, stop := exampleServer()
	defer stop()
	ctx := context.Background()
	alice, bob := connect(srv, "alice"), connect(srv, "bob")
	defer alice.Close()
	defer bob.Close()

	g, _ := alice.CreateGroup(ctx, "team", []string{"bob", "carol", "dave"})
	_, _ = alice.SetRole(ctx, g.ConvID, "bob", protocol.RoleAdmin)
	_, _ = bob.Mute(ctx, g.ConvID, "carol", true)
	_, _ = bob.RemoveMembers(ctx, g.ConvID, []string{"dave"})
	_, _ = alice.SetRole(ctx, g.ConvID, "bob", protocol.RoleOwner) // hand over
	info, _ := alice.Leave(ctx, g.ConvID)
	fmt.Println("members left:", info.MemberCount)

	// A refusal carries its protocol code.
	_, err := alice.Send(ctx, g.ConvID, "still here?")
	fmt.Println("send after leaving:", client.CodeOf(err))

	for range 5 {
		ev := next(bob, message(protocol.KindSystem))
		se, _ := client.ParseSystemEvent(ev.Message)
		fmt.Println(strings.TrimSpace(fmt.Sprint(se.Actor, " ", se.Event, " ", se.Users, " ", se.Role)))
	}
	// Output:
	// members left: 2
	// send after leaving: not_member
	// alice role_changed [bob] admin
	// bob muted [carol]
	// bob member_removed [dave]
	// alice role_changed [bob] owner
	// alice member_left [alice]
}

// Mentions mark the mentioned member's conversation until they read it.
func ExampleClient_SendWith() {
	srv, stop := exampleServer()
	defer stop()
	ctx := context.Background()
	alice, bob := connect(srv, "alice"), connect(srv, "bob")
	defer alice.Close()
	defer bob.Close()

	g, _ := alice.CreateGroup(ctx, "team", []string{"bob", "carol"})
	ack, _ := alice.SendWith(ctx, g.ConvID, "@bob can you look?", client.SendOptions{Mentions: []string{"bob"}})
	list, _ := bob.Conversations(ctx)
	fmt.Println("bob mentioned:", list[0].Mentioned, "unread:", list[0].Unread)
	_ = bob.MarkRead(ctx, g.ConvID, ack.Seq)
	list, _ = bob.Conversations(ctx)
	fmt.Println("after reading:", list[0].Mentioned, "unread:", list[0].Unread)
	// Own messages are never unread.
	list, _ = alice.Conversations(ctx)
	fmt.Println("alice unread:", list[0].Unread)
	// Output:
	// bob mentioned: true unread: 1
	// after reading: false unread: 0
	// alice unread: 0
}

// State messages are coalescible updates: reads show only the latest of
// a key in full.
func ExampleClient_SendState() {
	srv, stop := exampleServer()
	defer stop()
	ctx := context.Background()
	alice := connect(srv, "alice")
	defer alice.Close()

	g, _ := alice.CreateGroup(ctx, "sale", []string{"bob"})
	for _, left := range []string{"3 left", "2 left", "1 left"} {
		_, _ = alice.SendState(ctx, g.ConvID, "stock", left)
	}
	page, _, _ := alice.History(ctx, g.ConvID, client.HistoryQuery{Forward: true})
	for _, m := range page {
		fmt.Printf("seq %d superseded=%v body=%q\n", m.Seq, m.Superseded, m.Body)
	}
	// Output:
	// seq 1 superseded=true body=""
	// seq 2 superseded=true body=""
	// seq 3 superseded=false body="1 left"
}

// Presence: watch users who share a conversation; changes arrive as
// EventPresence. Typing notices arrive as EventTyping.
func ExampleClient_WatchPresence() {
	srv, stop := exampleServer()
	defer stop()
	ctx := context.Background()
	alice := connect(srv, "alice")
	defer alice.Close()

	dm, _ := alice.OpenDirect(ctx, "bob")
	states, _ := alice.WatchPresence(ctx, []string{"bob"})
	fmt.Println("bob online:", states[0].Online)

	bob := connect(srv, "bob")
	defer bob.Close()
	ev := next(alice, func(ev client.Event) bool { return ev.Kind == client.EventPresence })
	fmt.Println("bob online:", ev.Presence[0].Online)

	_ = alice.Typing(ctx, dm.ConvID)
	ev = next(bob, func(ev client.Event) bool { return ev.Kind == client.EventTyping })
	fmt.Println(ev.Typing.UserID, "is typing")
	// Output:
	// bob online: false
	// bob online: true
	// alice is typing
}
