package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/protocol"
)

// chatCommandTimeout bounds one command while connected, so a script piped
// into a client whose server stops answering ends instead of hanging.
// While disconnected commands fail at once (chatSession.ready).
const chatCommandTimeout = 15 * time.Second

// chatCmd is one command of `parley-chat`: its usage line, the argument
// counts it accepts (max -1: any), whether it needs the server and a
// current conversation, and what it does.
type chatCmd struct {
	name, args, help string
	min, max         int
	offline          bool // runs without a connection (/help, /quit)
	needConv         bool // needs a current conversation
	long             bool // moves a file: fileCommandTimeout, not chatCommandTimeout
	run              func(s *chatSession, ctx context.Context, args []string) error
}

// chatCommands is the command table: dispatch, argument checks and /help
// all come from it.
var chatCommands []chatCmd

func init() {
	chatCommands = []chatCmd{
		{name: "/dm", args: "USER", help: "open the direct conversation with USER and make it current", min: 1, max: 1, run: (*chatSession).chatDM},
		{name: "/group", args: "NAME USER...", help: "create a group with USERs and make it current", min: 2, max: -1, run: (*chatSession).chatGroup},
		{name: "/use", args: "CONV", help: "make conversation CONV current: its id, its index in /list, or a name (the peer of a direct conversation, a group's name)", min: 1, max: 1, run: (*chatSession).chatUse},
		{name: "/list", help: "your conversations with unread counts (@ = you were mentioned)", run: (*chatSession).chatList},
		{name: "/info", help: "members, your role and the tier of the current conversation", needConv: true, run: (*chatSession).chatInfo},
		{name: "/history", args: "[N]", help: "the last N messages of the current conversation (default 20)", max: 1, needConv: true, run: (*chatSession).chatHistory},
		{name: "/search", args: "TEXT", help: "find TEXT (a phrase; Chinese as typed) in your plain conversations, newest first", min: 1, max: -1, run: (*chatSession).chatSearch},
		{name: "/readby", args: "SEQ", help: "who of the members has read message SEQ (read by N of M)", min: 1, max: 1, needConv: true, run: (*chatSession).chatReadBy},
		{name: "/read", help: "mark the current conversation read up to the last message seen", needConv: true, run: (*chatSession).chatRead},
		{name: "/reply", args: "SEQ TEXT", help: "send TEXT as a reply to message SEQ", min: 2, max: -1, needConv: true, run: (*chatSession).chatReply},
		{name: "/react", args: "SEQ EMOJI", help: "react to message SEQ with EMOJI (one of the server's set; /react lists it)", max: 2, needConv: true, run: (*chatSession).chatReact},
		{name: "/unreact", args: "SEQ EMOJI", help: "take your EMOJI reaction to message SEQ back", min: 2, max: 2, needConv: true, run: (*chatSession).chatUnreact},
		{name: "/edit", args: "SEQ TEXT", help: "replace the text of your message SEQ", min: 2, max: -1, needConv: true, run: (*chatSession).chatEdit},
		{name: "/recall", args: "SEQ", help: "recall (unsend) your message SEQ", min: 1, max: 1, needConv: true, run: (*chatSession).chatRecall},
		{name: "/file", args: "PATH", help: "send the file at PATH (encrypted first in an E2E conversation); run again after an interruption, it resumes", min: 1, max: -1, needConv: true, long: true, run: (*chatSession).chatFile},
		{name: "/save", args: "SEQ [PATH]", help: "save the file of message SEQ to PATH (default: its name, in the current directory)", min: 1, max: 2, needConv: true, long: true, run: (*chatSession).chatSave},
		{name: "/state", args: "KEY TEXT", help: "send a state message: only your latest of KEY is kept in full", min: 2, max: -1, needConv: true, run: (*chatSession).chatState},
		{name: "/add", args: "USER...", help: "add USERs to the current group (owner, admin)", min: 1, max: -1, needConv: true, run: (*chatSession).chatAdd},
		{name: "/remove", args: "USER...", help: "remove USERs from the current group (owner; admin: plain members)", min: 1, max: -1, needConv: true, run: (*chatSession).chatRemove},
		{name: "/role", args: "USER member|admin|owner", help: "set USER's role (owner only; owner hands the group over)", min: 2, max: 2, needConv: true, run: (*chatSession).chatRole},
		{name: "/mute", args: "USER", help: "mute USER in the current group", min: 1, max: 1, needConv: true, run: (*chatSession).chatMute},
		{name: "/unmute", args: "USER", help: "unmute USER in the current group", min: 1, max: 1, needConv: true, run: (*chatSession).chatUnmute},
		{name: "/notify", args: "off [DURATION]|on", help: "stop your notifications of the current conversation (for DURATION, e.g. 8h; else until /notify on), or resume them", min: 1, max: 2, needConv: true, run: (*chatSession).chatNotify},
		{name: "/dnd", args: "[DURATION|off]", help: "do-not-disturb: no notifications for DURATION (e.g. 1h30m), off, or (no argument) show it", max: 1, run: (*chatSession).chatDND},
		{name: "/leave", help: "leave the current group (the owner hands it over first)", needConv: true, run: (*chatSession).chatLeave},
		{name: "/watch", args: "[USER...]", help: "show when USERs go on or off line (no USER: stop watching)", max: -1, run: (*chatSession).chatWatch},
		{name: "/typing", help: "tell the current conversation you are typing", needConv: true, run: (*chatSession).chatTyping},
		{name: "/sdm", args: "USER", help: "open the end-to-end encrypted direct conversation with USER", min: 1, max: 1, run: (*chatSession).chatSDM},
		{name: "/sgroup", args: "NAME USER...", help: "create an end-to-end encrypted group", min: 2, max: -1, run: (*chatSession).chatSGroup},
		{name: "/safety", args: "USER", help: "the safety number with USER (compare it out of band)", min: 1, max: 1, run: (*chatSession).chatSafety},
		{name: "/verify", args: "USER", help: "mark USER verified after comparing the safety number: a change then blocks sending", min: 1, max: 1, run: (*chatSession).chatVerify},
		{name: "/export-account", args: "FILE", help: "write your account key to FILE (0600) to link another device (-link FILE)", min: 1, max: 1, run: (*chatSession).chatExportAccount},
		{name: "/help", help: "this list", offline: true, run: func(s *chatSession, _ context.Context, _ []string) error {
			s.printf("%s", strings.TrimRight(chatHelp(), "\n"))
			return nil
		}},
		{name: "/quit", help: "leave (end of input does the same)", offline: true},
	}
}

func chatHelp() string {
	var b strings.Builder
	b.WriteString("commands:\n")
	for _, c := range chatCommands {
		fmt.Fprintf(&b, "  %-32s %s\n", strings.TrimSpace(c.name+" "+c.args), c.help)
	}
	b.WriteString(`anything else is sent to the current conversation (on a terminal the prompt
names it and says whether it is encrypted: "conv 5 e2e>", "conv 4 plain>"); in a group, @USER mentions
USER and @everyone (or @all) everyone. Incoming lines are "[CONV SEQ] sender: text"; a file
is "[CONV SEQ] sender: 📎 NAME (SIZE, TYPE)" (/save SEQ fetches it).
`)
	return b.String()
}

func chatLookup(name string) (chatCmd, bool) {
	if name == "/exit" {
		name = "/quit"
	}
	for _, c := range chatCommands {
		if c.name == name {
			return c, true
		}
	}
	return chatCmd{}, false
}

// runChat is `parley-chat`: a line-oriented terminal client on the client
// SDK. Incoming messages print as "[conv seq] sender: body"; input lines
// are commands or messages. It works the same with stdin from a pipe.
func runChat(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("parley-chat", flag.ContinueOnError)
	fs.SetOutput(stdout)
	url := fs.String("url", "ws://127.0.0.1:7480", "server WebSocket URL")
	token := fs.String("token", "", "bearer token (default $PARLEY_TOKEN)")
	device := fs.String("device", "cli", "device id of this client")
	keys := fs.String("keys", defaultKeysDir(), `directory of this device's end-to-end encryption keys, one per server ("" disables E2E)`)
	link := fs.String("link", "", "link this device to your account: import the account key from FILE (written by /export-account on another device)")
	newAccount := fs.Bool("new-account", false, "start your E2E account over with this device's account key: the server drops your devices under another one, contacts see a new safety number")
	fs.Usage = func() {
		fmt.Fprintln(stdout, "usage: parley-chat [-url URL] [-token TOKEN] [-device ID] [-keys DIR] [-link FILE] [-new-account]")
		fs.PrintDefaults()
		fmt.Fprint(stdout, "\n"+chatHelp())
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *token == "" {
		*token = os.Getenv("PARLEY_TOKEN")
	}
	if *token == "" {
		return errors.New("-token or PARLEY_TOKEN is required (mint one with 'parley token -user NAME')")
	}
	server, err := serverDir(*url)
	if err != nil {
		return err
	}
	c, err := client.New(client.Config{URL: *url, Token: *token, Device: *device, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := &chatSession{c: c, out: stdout, url: *url, printed: make(map[[2]uint64]bool), kinds: make(map[uint64]string),
		incoming: make(chan uint64, 16),
		e2e: &e2eState{dir: *keys, server: server, device: *device, convs: map[uint64]e2eConv{}, ctx: ctx,
			link: *link, newAccount: *newAccount}}
	s.conn.changed = make(chan struct{})
	s.prompt = isTerminal(stdin)
	s.printf("* connecting to %s as device %s ...", *url, *device)

	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(ctx) }()
	if s.e2e.dir != "" {
		s.e2e.bg.Go(s.maintainKeys)
	}
	var printer sync.WaitGroup
	printer.Add(1)
	go func() {
		defer printer.Done()
		for ev := range c.Events() {
			s.event(ev)
		}
	}()

	// A read from a terminal cannot be interrupted, so the reader is not
	// waited for: it ends at the next line or at end of input.
	lines := make(chan string)
	go chatReadLines(stdin, lines, ctx.Done())
	chatLoop(ctx, s, lines, runErr)
	// Close returns after Run has; Run's error is nil when it was stopped
	// here, and says why when it stopped on its own (e.g. a refused token).
	c.Close()
	printer.Wait()
	cancel()        // ends the E2E key uploads still running
	s.e2e.bg.Wait() // they write to -keys DIR: done before returning
	s.e2e.close()
	if err := <-runErr; err != nil {
		return err
	}
	return nil
}

// isTerminal reports whether r is a terminal (not a pipe or a file).
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// promptText says which conversation a line typed now goes to and
// whether it is encrypted: "conv 5 e2e> ", "conv 4 plain> ".
func (s *chatSession) promptText() string {
	if s.current == 0 {
		return "no conversation> "
	}
	if _, ok := s.e2eConv(s.current); ok {
		return fmt.Sprintf("conv %d e2e> ", s.current)
	}
	return fmt.Sprintf("conv %d plain> ", s.current)
}

// chatLoop runs input lines until /quit, end of input, ctx, or Run ending.
func chatLoop(ctx context.Context, s *chatSession, lines <-chan string, runErr chan error) {
	for {
		if s.prompt {
			p := s.promptText() // before s.mu: messenger holds e2e.mu, then takes s.mu
			s.mu.Lock()
			fmt.Fprint(s.out, p)
			s.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case err := <-runErr:
			runErr <- err // for runChat
			return
		case line, ok := <-lines:
			if !ok || !s.command(ctx, strings.TrimSpace(line)) {
				return
			}
		case id := <-s.incoming:
			if s.current == 0 {
				if err := s.chatUse(ctx, []string{strconv.FormatUint(id, 10)}); err != nil {
					s.printf("! %v", err)
				}
			}
		}
	}
}

func chatReadLines(r io.Reader, lines chan<- string, done <-chan struct{}) {
	defer close(lines)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), protocol.DefaultLimits.MaxFrameBytes)
	for sc.Scan() {
		select {
		case lines <- sc.Text():
		case <-done:
			return
		}
	}
}

// Connection states of a chat session.
const (
	chatConnecting = iota // the first attempt is under way: commands wait for it
	chatUp                // connected: commands run
	chatDown              // an attempt failed or the connection dropped: commands fail at once
)

// chatSession is the state of one `parley-chat`: the current conversation
// (input goroutine only) and the output, shared with the event printer.
type chatSession struct {
	c       *client.Client
	url     string
	current uint64
	// incoming carries the conversations of messages from others to the
	// input loop (which owns current): with none current, the first
	// becomes current, so a line typed next answers it.
	incoming chan uint64
	// listed holds the conversation ids the last /list printed, in its
	// order: /use N takes the Nth.
	listed []uint64
	e2e    *e2eState
	prompt bool // input is a terminal: a prompt names the current conversation

	// conn is the connection state, set by the event printer.
	conn struct {
		sync.Mutex
		state   int
		err     error     // why the last attempt failed or the connection ended
		retryAt time.Time // when the client tries again
		changed chan struct{}
		lost    chan struct{} // closed when an up connection goes down
	}

	mu  sync.Mutex // guards out, me, printed and kinds
	out io.Writer
	me  string
	// printed holds (conv, seq) of this device's own messages, printed
	// when the ack or the echo push arrives, whichever is first.
	printed map[[2]uint64]bool
	// kinds remembers each conversation's kind (direct or group) seen in
	// answers, for @mentions.
	kinds map[uint64]string
	// shown is the highest seq printed per conversation; a read receipt
	// beyond it waits in heldReads (conv → reader → seq) until the
	// message it names is printed, so "read up to N" never comes
	// before message N (the receipt can overtake the ack being printed).
	shown     map[uint64]uint64
	heldReads map[uint64]map[string]uint64
}

func (s *chatSession) printf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.out, format+"\n", args...)
}

func (s *chatSession) user() string {
	s.mu.Lock()
	me := s.me
	s.mu.Unlock()
	if me == "" {
		if h, ok := s.c.Hello(); ok {
			me = h.UserID
		}
	}
	return me
}

func (s *chatSession) setKind(conv uint64, kind string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kinds[conv] = kind
}

func (s *chatSession) kind(conv uint64) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kinds[conv]
}

// setConn moves the connection state and wakes commands waiting for it.
func (s *chatSession) setConn(state int, err error, retryAt time.Time) {
	s.conn.Lock()
	defer s.conn.Unlock()
	if state == chatUp && s.conn.state != chatUp {
		s.conn.lost = make(chan struct{})
	}
	if state != chatUp && s.conn.state == chatUp && s.conn.lost != nil {
		close(s.conn.lost)
	}
	s.conn.state, s.conn.err, s.conn.retryAt = state, err, retryAt
	close(s.conn.changed)
	s.conn.changed = make(chan struct{})
}

// ready waits for the first connection while it is being made, and
// returns at once with an error saying why while the client is
// disconnected. It returns a channel closed if the connection is lost.
func (s *chatSession) ready(ctx context.Context) (<-chan struct{}, error) {
	for {
		s.conn.Lock()
		state, err, retryAt, changed, lost := s.conn.state, s.conn.err, s.conn.retryAt, s.conn.changed, s.conn.lost
		s.conn.Unlock()
		switch state {
		case chatUp:
			return lost, nil
		case chatDown:
			msg := "not connected to " + s.url
			if err != nil {
				msg += ": " + err.Error()
			}
			if wait := time.Until(retryAt); wait > 0 {
				msg += fmt.Sprintf(" (next attempt in %s)", wait.Round(100*time.Millisecond))
			}
			return nil, errors.New(msg + "; try again once connected")
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("still connecting to %s", s.url)
		}
	}
}

// chatFormat renders a message for the terminal; me marks mentions of
// the reader.
func chatFormat(m *protocol.Message, me string) string {
	head := fmt.Sprintf("[%d %d]", m.ConvID, m.Seq)
	switch m.Kind {
	case protocol.KindEdit:
		return fmt.Sprintf("%s %s edited #%d: %s", head, m.Sender, m.TargetSeq, m.Body)
	case protocol.KindRecall:
		return fmt.Sprintf("%s %s recalled #%d", head, m.Sender, m.TargetSeq)
	case protocol.KindReact, protocol.KindUnreact:
		if m.Body == "" {
			return fmt.Sprintf("%s * reactions on #%d: %s", head, m.TargetSeq, reactionText(m.Reactions, "none"))
		}
		verb := "reacted"
		if m.Kind == protocol.KindUnreact {
			verb = "took back"
		}
		return fmt.Sprintf("%s %s %s %s on #%d (%s)", head, m.Sender, verb, m.Body, m.TargetSeq, reactionText(m.Reactions, "none left"))
	case protocol.KindSystem:
		return head + " * " + systemText(m)
	case protocol.KindState:
		body := m.Body
		if m.Superseded {
			body = "(superseded)"
		}
		return fmt.Sprintf("%s %s set %s: %s", head, m.Sender, m.CoalesceKey, body)
	case protocol.KindFile:
		if m.Recalled {
			return fmt.Sprintf("%s %s: (recalled)", head, m.Sender)
		}
		if b, err := client.ParseFileBody(*m); err == nil {
			return fmt.Sprintf("%s %s: %s", head, m.Sender, fileLine(b))
		}
		return fmt.Sprintf("%s %s: 📎 %s", head, m.Sender, m.Body)
	}
	body := m.Body
	switch {
	case m.Recalled:
		body = "(recalled)"
	case m.Edited:
		body += " (edited)"
	}
	if m.ReplyTo != 0 {
		reply := fmt.Sprintf("(re #%d) ", m.ReplyTo)
		if m.ReplyRecalled {
			reply = fmt.Sprintf("(re #%d, recalled) ", m.ReplyTo)
		}
		body = reply + body
	}
	line := fmt.Sprintf("%s %s: %s", head, m.Sender, body)
	if len(m.Reactions) > 0 {
		line += "  [" + reactionText(m.Reactions, "") + "]"
	}
	if me != "" && m.Sender != me && (m.MentionAll || slices.Contains(m.Mentions, me)) {
		line += "   <- @" + me
	}
	return line
}

// reactionText renders counts ("👍 2 ❤️ 1*", * marking the reader's own),
// none when there are none.
func reactionText(rs []protocol.Reaction, none string) string {
	if len(rs) == 0 {
		return none
	}
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = r.Emoji + " " + strconv.Itoa(r.Count)
		if r.Me {
			parts[i] += "*"
		}
	}
	return strings.Join(parts, " ")
}

// systemText turns a system event into a sentence ("alice added carol").
func systemText(m *protocol.Message) string {
	ev, err := client.ParseSystemEvent(m)
	if err != nil {
		return m.Body
	}
	users := strings.Join(ev.Users, ", ")
	switch ev.Event {
	case "member_added":
		return ev.Actor + " added " + users
	case "member_removed":
		return ev.Actor + " removed " + users
	case "member_left":
		return ev.Actor + " left"
	case "role_changed":
		if ev.Role == protocol.RoleOwner {
			return ev.Actor + " handed the group over to " + users + " (now the owner)"
		}
		article := "a "
		if ev.Role == protocol.RoleAdmin {
			article = "an "
		}
		return ev.Actor + " made " + users + " " + article + ev.Role
	case "muted":
		return ev.Actor + " muted " + users
	case "unmuted":
		return ev.Actor + " unmuted " + users
	case "device_added":
		return ev.Actor + " added device " + ev.Device
	case "device_removed":
		return ev.Actor + " removed device " + ev.Device
	case "identity_changed":
		return ev.Actor + "'s device " + ev.Device + " has a new identity key (checked against " + ev.Actor + "'s account key when used)"
	}
	return fmt.Sprintf("%s: %s %s", ev.Event, ev.Actor, users)
}

// printOnce prints a message unless it was printed already.
func (s *chatSession) printOnce(m *protocol.Message) {
	if (m.Kind == protocol.KindReact || m.Kind == protocol.KindUnreact) && m.Superseded {
		return // a later stub of the same target carries the counts
	}
	me := s.user() // the sync's messages come before EventConnected
	s.mu.Lock()
	defer s.mu.Unlock()
	key := [2]uint64{m.ConvID, m.Seq}
	if s.printed[key] {
		delete(s.printed, key) // each is printed by ack and echo at most once
		return
	}
	if m.Sender == me {
		s.printed[key] = true
	}
	fmt.Fprintln(s.out, chatFormat(m, me))
	if s.shown == nil {
		s.shown = make(map[uint64]uint64)
	}
	s.shown[m.ConvID] = max(s.shown[m.ConvID], m.Seq)
	for reader, seq := range s.heldReads[m.ConvID] {
		if seq <= s.shown[m.ConvID] {
			fmt.Fprintf(s.out, "* conv %d: %s read up to %d\n", m.ConvID, reader, seq)
			delete(s.heldReads[m.ConvID], reader)
		}
	}
}

// readReceipt prints that reader read conv up to seq — at once if that
// message is printed (or nothing of the conversation was printed in this
// session), else when it is.
func (s *chatSession) readReceipt(conv uint64, reader string, seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if shown, ok := s.shown[conv]; !ok || seq <= shown {
		fmt.Fprintf(s.out, "* conv %d: %s read up to %d\n", conv, reader, seq)
		return
	}
	if s.heldReads == nil {
		s.heldReads = make(map[uint64]map[string]uint64)
	}
	if s.heldReads[conv] == nil {
		s.heldReads[conv] = make(map[string]uint64)
	}
	s.heldReads[conv][reader] = max(s.heldReads[conv][reader], seq)
}

func (s *chatSession) event(ev client.Event) {
	switch ev.Kind {
	case client.EventMessage:
		if ev.Message.Kind == protocol.KindSystem {
			s.systemE2E(ev.Message)
		}
		m, _ := s.openE2E(ev.Message)
		if m != nil {
			s.printOnce(m)
		}
		if ev.Message.Sender != s.user() && ev.Message.Kind != protocol.KindSystem {
			select {
			case s.incoming <- ev.ConvID:
			default: // the loop has plenty to adopt already
			}
		}
	case client.EventReceipt:
		if ev.Receipt.State == protocol.StateRead && ev.Receipt.UserID != s.user() {
			s.readReceipt(ev.ConvID, ev.Receipt.UserID, ev.Receipt.Seq)
		}
	case client.EventSnapshot:
		s.setKind(ev.ConvID, ev.Snapshot.Kind)
		if ev.Skipped > 0 {
			s.printf("* conv %d: %d earlier unread messages skipped (see /use %d then /history)", ev.ConvID, ev.Skipped, ev.ConvID)
		}
	case client.EventPresence:
		for _, st := range ev.Presence {
			switch {
			case st.Online:
				s.printf("* %s is online", st.UserID)
			case st.LastSeen > 0:
				s.printf("* %s is offline (last seen %s)", st.UserID, time.UnixMilli(st.LastSeen).Format("2006-01-02 15:04:05"))
			default:
				s.printf("* %s is offline", st.UserID)
			}
		}
	case client.EventTyping:
		s.printf("* conv %d: %s is typing...", ev.ConvID, ev.Typing.UserID)
	case client.EventConnected:
		s.mu.Lock()
		s.me = ev.Hello.UserID
		s.mu.Unlock()
		s.setConn(chatUp, nil, time.Time{})
		s.printf("* connected to %s as %s/%s", ev.Hello.Node, ev.Hello.UserID, ev.Hello.DeviceID)
		if s.e2e.dir != "" {
			s.e2e.bg.Go(s.publishKeys) // so that E2E contacts can reach this device
		}
	case client.EventKeysLow:
		if ev.KeysLow.DeviceID == s.e2e.device {
			s.e2e.bg.Go(s.refillKeys)
		}
	case client.EventDisconnected:
		s.setConn(chatDown, ev.Err, time.Time{})
		if ev.Err != nil {
			s.printf("* disconnected: %v", ev.Err)
		}
	case client.EventReconnecting:
		s.setConn(chatDown, ev.Err, time.Now().Add(ev.Delay))
		if d := ev.Delay.Round(100 * time.Millisecond); d > 0 {
			s.printf("* reconnecting to %s in %s: %v", ev.URL, d, ev.Err)
		} else {
			s.printf("* reconnecting to %s now: %v", ev.URL, ev.Err)
		}
	}
}

// command runs one input line; it returns false to leave.
func (s *chatSession) command(ctx context.Context, line string) bool {
	if line == "" {
		return true
	}
	if !strings.HasPrefix(line, "/") {
		s.run(ctx, chatCmd{name: "send", needConv: true, run: func(s *chatSession, ctx context.Context, _ []string) error {
			return s.chatSend(ctx, line)
		}}, nil)
		return true
	}
	fields := strings.Fields(line)
	cmd, ok := chatLookup(fields[0])
	if !ok {
		s.printf("! unknown command %s (try /help)", fields[0])
		return true
	}
	if cmd.name == "/quit" {
		return false
	}
	args := fields[1:]
	if len(args) < cmd.min || (cmd.max >= 0 && len(args) > cmd.max) {
		s.printf("! usage: %s", strings.TrimSpace(cmd.name+" "+cmd.args))
		return true
	}
	if cmd.name == "/file" {
		// The path keeps its spaces: everything after the command.
		args = []string{strings.TrimSpace(strings.TrimPrefix(line, fields[0]))}
	}
	if cmd.name == "/edit" || cmd.name == "/state" || cmd.name == "/reply" {
		// The text keeps its spacing: everything after the first argument.
		rest := strings.TrimSpace(strings.TrimPrefix(line, fields[0]))
		rest = strings.TrimSpace(strings.TrimPrefix(rest, args[0]))
		args = []string{args[0], rest}
	}
	s.run(ctx, cmd, args)
	return true
}

// run checks what cmd needs (a connection, a current conversation) and
// runs it with a deadline, cancelled if the connection is lost meanwhile.
func (s *chatSession) run(ctx context.Context, cmd chatCmd, args []string) {
	if cmd.needConv && s.current == 0 {
		s.printf("! no current conversation: use /dm USER, /sdm USER, /group NAME USER... or /use CONV")
		return
	}
	timeout := chatCommandTimeout
	if cmd.long {
		timeout = fileCommandTimeout
	}
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, errors.New("no answer from the server"))
	defer cancel()
	if !cmd.offline {
		lost, err := s.ready(ctx)
		if err != nil {
			s.printf("! %s: %v", strings.TrimPrefix(cmd.name, "/"), err)
			return
		}
		cctx, ccancel := context.WithCancelCause(ctx)
		defer ccancel(nil)
		go func() {
			select {
			case <-lost:
				ccancel(errors.New("connection lost; the request may or may not have been done"))
			case <-cctx.Done():
			}
		}()
		ctx = cctx
	}
	if err := cmd.run(s, ctx, args); err != nil {
		if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
			err = fmt.Errorf("%s: %w", strings.TrimPrefix(cmd.name, "/"), cause)
		}
		s.printf("! %v", err)
	}
}

// mentions finds @USER and @everyone/@all words in a group message.
func mentions(body string) (users []string, all bool) {
	for _, w := range strings.Fields(body) {
		if !strings.HasPrefix(w, "@") {
			continue
		}
		name := strings.TrimRight(w[1:], ".,:;!?")
		switch {
		case name == "everyone" || name == "all":
			all = true
		case protocol.ValidID(name) && !slices.Contains(users, name):
			users = append(users, name)
		}
	}
	return users, all
}

func (s *chatSession) chatSend(ctx context.Context, body string) error {
	conv := s.current
	seq, isE2E, err := s.sendE2E(ctx, conv, body)
	if err != nil {
		return fmt.Errorf("send: %w", err)
	}
	ack := client.Ack{ConvID: conv, Seq: seq}
	msg := &protocol.Message{ConvID: conv, Sender: s.user(), Kind: protocol.KindText, Body: body}
	if !isE2E {
		var opts client.SendOptions
		if s.kind(conv) == protocol.ConvGroup {
			opts.Mentions, opts.MentionAll = mentions(body)
			msg.Mentions, msg.MentionAll = opts.Mentions, opts.MentionAll
		}
		if ack, err = s.c.SendWith(ctx, conv, body, opts); err != nil {
			return fmt.Errorf("send: %w", err)
		}
	}
	msg.Seq = ack.Seq
	s.printOnce(msg)
	return nil
}

func (s *chatSession) chatDM(ctx context.Context, args []string) error {
	info, err := s.c.OpenDirect(ctx, args[0])
	if err != nil {
		return fmt.Errorf("dm: %w", err)
	}
	s.setKind(info.ConvID, info.Kind)
	s.current = info.ConvID
	s.printf("* conv %d: direct with %s (not encrypted)", info.ConvID, args[0])
	return nil
}

func (s *chatSession) chatGroup(ctx context.Context, args []string) error {
	info, err := s.c.CreateGroup(ctx, args[0], args[1:])
	if err != nil {
		return fmt.Errorf("group: %w", err)
	}
	s.setKind(info.ConvID, info.Kind)
	s.current = info.ConvID
	s.printf("* conv %d: group %s with %s (not encrypted)", info.ConvID, args[0], strings.Join(info.Members, ", "))
	return nil
}

// chatUse accepts only a conversation of the user's (current or former:
// a former member still reads its history), named by its id, its index in
// the last /list or a name.
func (s *chatSession) chatUse(ctx context.Context, args []string) error {
	list, err := s.c.Conversations(ctx)
	if err != nil {
		return fmt.Errorf("use: %w", err)
	}
	i, err := s.pickConv(list, args[0])
	if err != nil {
		return fmt.Errorf("use: %w", err)
	}
	cv := list[i]
	id := cv.ConvID
	s.setKind(id, cv.Kind)
	if cv.E2E {
		s.setE2EConv(id, e2eConv{group: cv.Kind == protocol.ConvGroup})
	}
	s.current = id
	note := ""
	if !cv.E2E {
		note = " (not encrypted)"
	}
	if cv.LeaveSeq != 0 {
		note += fmt.Sprintf(" (you are no longer a member: history up to %d only)", cv.LeaveSeq)
	}
	s.printf("* conv %d: %s%s", id, convTitle(cv), note)
	return nil
}

// pickConv finds arg in list: a conversation id, an index of the last
// /list (ids are far larger than any index), or the peer of a direct
// conversation or a group's name, which must name exactly one.
func (s *chatSession) pickConv(list []protocol.ConvSummary, arg string) (int, error) {
	if n, err := strconv.ParseUint(arg, 10, 64); err == nil {
		if i := slices.IndexFunc(list, func(cv protocol.ConvSummary) bool { return cv.ConvID == n }); i >= 0 {
			return i, nil
		}
		if n >= 1 && n <= uint64(len(s.listed)) {
			id := s.listed[n-1]
			if i := slices.IndexFunc(list, func(cv protocol.ConvSummary) bool { return cv.ConvID == id }); i >= 0 {
				return i, nil
			}
		}
		if len(s.listed) == 0 {
			return 0, fmt.Errorf("conversation %d is not one of yours (see /list; an index needs a /list first)", n)
		}
		return 0, fmt.Errorf("conversation %d is not one of yours nor an index of the last /list (1–%d)", n, len(s.listed))
	}
	var found []int
	for i, cv := range list {
		if cv.Kind == protocol.ConvDirect && cv.Peer == arg || cv.Kind == protocol.ConvGroup && cv.Name == arg {
			found = append(found, i)
		}
	}
	switch len(found) {
	case 0:
		return 0, fmt.Errorf("%q is not a conversation id nor the name of one of yours (see /list)", arg)
	case 1:
		return found[0], nil
	}
	var which []string
	for _, i := range found {
		which = append(which, fmt.Sprintf("%d (%s)", list[i].ConvID, convTitle(list[i])))
	}
	return 0, fmt.Errorf("%q names %d conversations: %s; use the id or the /list index", arg, len(found), strings.Join(which, ", "))
}

func convTitle(cv protocol.ConvSummary) string {
	what := "group " + cv.Name
	if cv.Kind == protocol.ConvDirect {
		what = "direct with " + cv.Peer
	}
	if cv.E2E {
		what += "  [e2e]"
	}
	return what
}

func (s *chatSession) chatList(ctx context.Context, _ []string) error {
	list, err := s.c.Conversations(ctx)
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	if len(list) == 0 {
		s.printf("* no conversations")
	}
	s.listed = s.listed[:0]
	for n, cv := range list {
		s.listed = append(s.listed, cv.ConvID)
		s.setKind(cv.ConvID, cv.Kind)
		mark := " "
		if cv.ConvID == s.current {
			mark = ">"
		}
		if cv.E2E {
			if _, known := s.e2eConv(cv.ConvID); !known {
				s.setE2EConv(cv.ConvID, e2eConv{group: cv.Kind == protocol.ConvGroup})
			}
		}
		extra := ""
		if cv.Mentioned {
			extra += "  @"
		}
		if cv.LeaveSeq != 0 {
			extra += "  (left)"
		}
		if cv.MuteUntil != 0 {
			extra += "  (notifications off)"
		}
		s.printf("%s [%d] %d  %s  unread %d  last %d%s", mark, n+1, cv.ConvID, convTitle(cv), cv.Unread, cv.LastSeq, extra)
	}
	return nil
}

func (s *chatSession) chatInfo(ctx context.Context, _ []string) error {
	info, err := s.c.ConvInfo(ctx, s.current)
	if err != nil {
		return fmt.Errorf("info: %w", err)
	}
	s.setKind(info.ConvID, info.Kind)
	tier := ""
	if info.Tier != "" {
		tier = ", tier " + info.Tier
	}
	s.printf("* conv %d: %s %s, %d members%s; you are %s", info.ConvID, info.Kind, info.Name, info.MemberCount, tier, info.Role)
	s.printf("* members: %s", strings.Join(info.Members, ", "))
	return nil
}

func (s *chatSession) chatHistory(ctx context.Context, args []string) error {
	n := 20
	if len(args) > 0 {
		v, err := strconv.Atoi(args[0])
		if err != nil || v < 1 || v > protocol.DefaultLimits.MaxHistory {
			return fmt.Errorf("history: N must be 1..%d", protocol.DefaultLimits.MaxHistory)
		}
		n = v
	}
	msgs, _, err := s.c.History(ctx, s.current, client.HistoryQuery{Limit: n})
	if err != nil {
		return fmt.Errorf("history: %w", err)
	}
	me := s.user()
	// A target in the page already shows its final text (edited) or
	// (recalled): its edit and recall events would show it twice.
	inPage := make(map[uint64]bool, len(msgs))
	for _, m := range msgs {
		inPage[m.Seq] = true
	}
	for i := range msgs {
		m, _ := s.openE2E(&msgs[i])
		if m == nil || (m.Kind == protocol.KindEdit || m.Kind == protocol.KindRecall || m.Kind == protocol.KindReact || m.Kind == protocol.KindUnreact) && inPage[m.TargetSeq] {
			continue
		}
		s.printf("%s", chatFormat(m, me))
	}
	return nil
}

func (s *chatSession) chatSearch(ctx context.Context, args []string) error {
	res, err := s.c.Search(ctx, protocol.SearchQuery{Text: strings.Join(args, " ")})
	if err != nil {
		return fmt.Errorf("search: %w", err)
	}
	if len(res.Hits) == 0 {
		s.printf("* nothing found")
		return nil
	}
	for _, h := range res.Hits {
		// The matches between [ and ].
		var b strings.Builder
		at := 0
		for _, hl := range h.Highlights {
			start, end, ok := protocol.HighlightBytes(h.Snippet, hl)
			if !ok || start < at {
				continue
			}
			b.WriteString(h.Snippet[at:start] + "[" + h.Snippet[start:end] + "]")
			at = end
		}
		b.WriteString(h.Snippet[at:])
		s.printf("conv %d #%d %s: %s", h.ConvID, h.Seq, h.Sender, b.String())
	}
	return nil
}

func (s *chatSession) chatRead(ctx context.Context, _ []string) error {
	seq, ok := s.c.LastSeq(s.current)
	if !ok || seq == 0 {
		return fmt.Errorf("read: nothing seen in conv %d yet", s.current)
	}
	if err := s.c.MarkRead(ctx, s.current, seq); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	s.printf("* conv %d read up to %d", s.current, seq)
	return nil
}

func parseSeq(cmd, arg string) (uint64, error) {
	seq, err := strconv.ParseUint(strings.TrimPrefix(arg, "#"), 10, 64)
	if err != nil || seq == 0 {
		return 0, fmt.Errorf("%s: %q is not a message seq (the second number of [CONV SEQ])", cmd, arg)
	}
	return seq, nil
}

func (s *chatSession) chatReadBy(ctx context.Context, args []string) error {
	seq, err := parseSeq("readby", args[0])
	if err != nil {
		return err
	}
	rb, err := s.c.ReadBy(ctx, s.current, seq)
	if err != nil {
		return fmt.Errorf("readby: %w", err)
	}
	line := fmt.Sprintf("* #%d read by %d of %d", seq, rb.ReadCount, rb.MemberCount)
	if len(rb.Users) > 0 {
		line += ": " + strings.Join(rb.Users, ", ")
	}
	s.printf("%s", line)
	return nil
}

func (s *chatSession) chatReply(ctx context.Context, args []string) error {
	seq, err := parseSeq("reply", args[0])
	if err != nil {
		return err
	}
	conv, body := s.current, args[1]
	var ack client.Ack
	m, isE2E, err := s.e2eMessenger(ctx, conv)
	switch {
	case err != nil:
	case isE2E:
		ack, err = m.Reply(ctx, conv, seq, body)
	default:
		opts := client.SendOptions{ReplyTo: seq}
		if s.kind(conv) == protocol.ConvGroup {
			opts.Mentions, opts.MentionAll = mentions(body)
		}
		ack, err = s.c.SendWith(ctx, conv, body, opts)
	}
	if err != nil {
		return fmt.Errorf("reply: %w", err)
	}
	s.printOnce(&protocol.Message{ConvID: conv, Seq: ack.Seq, Sender: s.user(), Kind: protocol.KindText, Body: body, ReplyTo: seq})
	return nil
}

func (s *chatSession) chatReact(ctx context.Context, args []string) error {
	if len(args) < 2 {
		if h, ok := s.c.Hello(); ok && len(h.Reactions) > 0 {
			s.printf("* reactions: %s (at most %d on one message)", strings.Join(h.Reactions, " "), h.MaxReactionsPerUser)
			return nil
		}
		return errors.New("react: SEQ EMOJI")
	}
	return s.react(ctx, args, false)
}

func (s *chatSession) chatUnreact(ctx context.Context, args []string) error {
	return s.react(ctx, args, true)
}

// react adds (or takes back) a reaction; the event comes back as a push.
func (s *chatSession) react(ctx context.Context, args []string, remove bool) error {
	what := map[bool]string{false: "react", true: "unreact"}[remove]
	seq, err := parseSeq(what, args[0])
	if err != nil {
		return err
	}
	if remove {
		_, err = s.c.Unreact(ctx, s.current, seq, args[1])
	} else {
		_, err = s.c.React(ctx, s.current, seq, args[1])
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

func (s *chatSession) chatEdit(ctx context.Context, args []string) error {
	seq, err := parseSeq("edit", args[0])
	if err != nil {
		return err
	}
	ack, ok, err := s.editE2E(ctx, s.current, seq, args[1])
	if !ok {
		ack, err = s.c.Edit(ctx, s.current, seq, args[1])
	}
	if err != nil {
		return fmt.Errorf("edit: %w", err)
	}
	s.printOnce(&protocol.Message{ConvID: s.current, Seq: ack.Seq, Sender: s.user(), Kind: protocol.KindEdit, TargetSeq: seq, Body: args[1]})
	return nil
}

func (s *chatSession) chatRecall(ctx context.Context, args []string) error {
	seq, err := parseSeq("recall", args[0])
	if err != nil {
		return err
	}
	ack, ok, err := s.recallE2E(ctx, s.current, seq)
	if !ok {
		ack, err = s.c.Recall(ctx, s.current, seq)
	}
	if err != nil {
		return fmt.Errorf("recall: %w", err)
	}
	s.printOnce(&protocol.Message{ConvID: s.current, Seq: ack.Seq, Sender: s.user(), Kind: protocol.KindRecall, TargetSeq: seq})
	return nil
}

func (s *chatSession) chatState(ctx context.Context, args []string) error {
	if len(args[0]) > protocol.DefaultLimits.MaxClientMsgID {
		return fmt.Errorf("state: KEY is at most %d bytes", protocol.DefaultLimits.MaxClientMsgID)
	}
	ack, err := s.c.SendState(ctx, s.current, args[0], args[1])
	if err != nil {
		return fmt.Errorf("state: %w", err)
	}
	s.printOnce(&protocol.Message{ConvID: s.current, Seq: ack.Seq, Sender: s.user(), Kind: protocol.KindState, CoalesceKey: args[0], Body: args[1]})
	return nil
}

// checkUsers refuses malformed user ids before they reach the server.
func checkUsers(cmd string, users []string) error {
	for _, u := range users {
		if !protocol.ValidID(u) {
			return fmt.Errorf("%s: %q is not a user id (1-64 of A-Z a-z 0-9 . _ @ -)", cmd, u)
		}
	}
	return nil
}

// groupChanged prints the group after a change; the change itself prints
// as the system event it caused.
func (s *chatSession) groupChanged(info protocol.ConvInfo) {
	s.printf("* conv %d: %d members: %s", info.ConvID, info.MemberCount, strings.Join(info.Members, ", "))
}

func (s *chatSession) chatAdd(ctx context.Context, args []string) error {
	if err := checkUsers("add", args); err != nil {
		return err
	}
	info, err := s.c.AddMembers(ctx, s.current, args)
	if err != nil {
		return fmt.Errorf("add: %w", err)
	}
	s.groupChanged(info)
	return nil
}

func (s *chatSession) chatRemove(ctx context.Context, args []string) error {
	if err := checkUsers("remove", args); err != nil {
		return err
	}
	info, err := s.c.RemoveMembers(ctx, s.current, args)
	if err != nil {
		return fmt.Errorf("remove: %w", err)
	}
	if info.E2E && s.e2e.dir != "" {
		// Without waiting for the member_removed push: the next line
		// typed must not go out under a key the removed members hold.
		m, err := s.messenger(ctx)
		if err == nil {
			err = m.RotateGroup(info.ConvID)
		}
		if err != nil {
			return fmt.Errorf("remove: e2e: %w", err)
		}
	}
	s.groupChanged(info)
	return nil
}

func (s *chatSession) chatRole(ctx context.Context, args []string) error {
	if err := checkUsers("role", args[:1]); err != nil {
		return err
	}
	switch args[1] {
	case protocol.RoleMember, protocol.RoleAdmin, protocol.RoleOwner:
	default:
		return fmt.Errorf("role: %q is not member, admin or owner", args[1])
	}
	info, err := s.c.SetRole(ctx, s.current, args[0], args[1])
	if err != nil {
		return fmt.Errorf("role: %w", err)
	}
	s.printf("* conv %d: you are %s", info.ConvID, info.Role)
	return nil
}

func (s *chatSession) chatMute(ctx context.Context, args []string) error {
	return s.mute(ctx, "mute", args[0], true)
}

func (s *chatSession) chatUnmute(ctx context.Context, args []string) error {
	return s.mute(ctx, "unmute", args[0], false)
}

func (s *chatSession) mute(ctx context.Context, cmd, user string, muted bool) error {
	if err := checkUsers(cmd, []string{user}); err != nil {
		return err
	}
	if _, err := s.c.Mute(ctx, s.current, user, muted); err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	return nil
}

func (s *chatSession) chatNotify(ctx context.Context, args []string) error {
	switch {
	case args[0] == "on" && len(args) == 1:
		if _, err := s.c.UnmuteConv(ctx, s.current); err != nil {
			return fmt.Errorf("notify: %w", err)
		}
		s.printf("* conv %d: notifications on", s.current)
		return nil
	case args[0] != "off":
		return fmt.Errorf("notify: off [DURATION] or on")
	}
	var until time.Time
	if len(args) == 2 {
		d, err := time.ParseDuration(args[1])
		if err != nil || d <= 0 {
			return fmt.Errorf("notify: %q is not a duration (8h, 30m)", args[1])
		}
		until = time.Now().Add(d)
	}
	info, err := s.c.MuteConv(ctx, s.current, until)
	if err != nil {
		return fmt.Errorf("notify: %w", err)
	}
	s.printf("* conv %d: notifications off %s", info.ConvID, untilText(info.MuteUntil))
	return nil
}

// untilText says until when a mute or do-not-disturb holds.
func untilText(ms int64) string {
	if ms >= protocol.MuteForever {
		return "until you turn them on"
	}
	return "until " + time.UnixMilli(ms).Format("2006-01-02 15:04")
}

func (s *chatSession) chatDND(ctx context.Context, args []string) error {
	var (
		d   protocol.DND
		err error
	)
	switch {
	case len(args) == 0:
		d, err = s.c.DND(ctx)
	case args[0] == "off":
		d, err = s.c.SetDND(ctx, protocol.DND{})
	default:
		dur, perr := time.ParseDuration(args[0])
		if perr != nil || dur <= 0 {
			return fmt.Errorf("dnd: %q is not a duration (1h, 30m) or off", args[0])
		}
		d, err = s.c.SetDND(ctx, protocol.DND{Until: time.Now().Add(dur).UnixMilli()})
	}
	if err != nil {
		return fmt.Errorf("dnd: %w", err)
	}
	switch {
	case d.Until != 0:
		s.printf("* do-not-disturb on %s", untilText(d.Until))
	case d.Daily != nil:
		s.printf("* do-not-disturb every day %02d:%02d-%02d:%02d (UTC%+03d:%02d)", d.Daily.Start/60, d.Daily.Start%60, d.Daily.End/60, d.Daily.End%60, d.Daily.UTCOffset/60, abs(d.Daily.UTCOffset%60))
	default:
		s.printf("* do-not-disturb off")
	}
	return nil
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

func (s *chatSession) chatLeave(ctx context.Context, _ []string) error {
	if _, err := s.c.Leave(ctx, s.current); err != nil {
		return fmt.Errorf("leave: %w", err)
	}
	s.printf("* you left conv %d", s.current)
	s.current = 0
	return nil
}

func (s *chatSession) chatWatch(ctx context.Context, args []string) error {
	if err := checkUsers("watch", args); err != nil {
		return err
	}
	states, err := s.c.WatchPresence(ctx, args)
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	if len(args) == 0 {
		s.printf("* watching nobody")
	}
	s.event(client.Event{Kind: client.EventPresence, Presence: states})
	return nil
}

func (s *chatSession) chatTyping(ctx context.Context, _ []string) error {
	if err := s.c.Typing(ctx, s.current); err != nil {
		return fmt.Errorf("typing: %w", err)
	}
	return nil
}
