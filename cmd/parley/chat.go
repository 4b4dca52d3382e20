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
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/protocol"
)

const chatHelp = `commands:
  /dm USER              open the direct conversation with USER and make it current
  /group NAME USER...   create a group with USERs and make it current
  /use CONV             make conversation CONV current
  /list                 conversations with unread counts
  /history [N]          the last N messages of the current conversation (default 20)
  /read                 mark the current conversation read up to the last message seen
  /quit                 leave (end of input does the same)
` + chatE2EHelp + `anything else is sent to the current conversation.
`

// chatCommandTimeout bounds one command, so a script piped into a client
// that cannot reach its server ends instead of hanging.
const chatCommandTimeout = 30 * time.Second

// runChat is `parley chat`: a line-oriented terminal client on the client
// SDK. Incoming messages print as "[conv seq] sender: body"; input lines
// are commands or messages. It works the same with stdin from a pipe.
func runChat(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("chat", flag.ContinueOnError)
	fs.SetOutput(stdout)
	url := fs.String("url", "ws://127.0.0.1:7480", "server WebSocket URL")
	token := fs.String("token", "", "bearer token (default $PARLEY_TOKEN)")
	device := fs.String("device", "cli", "device id of this client")
	keys := fs.String("keys", defaultKeysDir(), `directory of this device's end-to-end encryption keys ("" disables E2E)`)
	fs.Usage = func() {
		fmt.Fprintln(stdout, "usage: parley chat [-url URL] [-token TOKEN] [-device ID] [-keys DIR]")
		fs.PrintDefaults()
		fmt.Fprint(stdout, "\n"+chatHelp)
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *token == "" {
		*token = os.Getenv("PARLEY_TOKEN")
	}
	if *token == "" {
		return errors.New("chat: -token or PARLEY_TOKEN is required (mint one with 'parley token -user NAME')")
	}
	c, err := client.New(client.Config{URL: *url, Token: *token, Device: *device, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return fmt.Errorf("chat: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := &chatSession{c: c, out: stdout, printed: make(map[[2]uint64]bool),
		e2e: &e2eState{dir: *keys, device: *device, convs: map[uint64]e2eConv{}, ctx: ctx}}

	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(ctx) }()
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
	if err := <-runErr; err != nil {
		return fmt.Errorf("chat: %w", err)
	}
	return nil
}

// chatLoop runs input lines until /quit, end of input, ctx, or Run ending.
func chatLoop(ctx context.Context, s *chatSession, lines <-chan string, runErr chan error) {
	for {
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

// chatSession is the state of one `parley chat`: the current conversation
// (input goroutine only) and the output, shared with the event printer.
type chatSession struct {
	c       *client.Client
	current uint64
	e2e     *e2eState

	mu  sync.Mutex // guards out, me and printed
	out io.Writer
	me  string
	// printed holds (conv, seq) of this device's own messages, printed
	// when the ack or the echo push arrives, whichever is first.
	printed map[[2]uint64]bool
}

func (s *chatSession) printf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.out, format+"\n", args...)
}

func chatFormat(m *protocol.Message) string {
	switch m.Kind {
	case protocol.KindEdit:
		return fmt.Sprintf("[%d %d] %s edited #%d: %s", m.ConvID, m.Seq, m.Sender, m.TargetSeq, m.Body)
	case protocol.KindRecall:
		return fmt.Sprintf("[%d %d] %s recalled #%d", m.ConvID, m.Seq, m.Sender, m.TargetSeq)
	case protocol.KindSystem:
		return fmt.Sprintf("[%d %d] * %s", m.ConvID, m.Seq, m.Body)
	}
	body := m.Body
	if m.Recalled {
		body = "(recalled)"
	}
	return fmt.Sprintf("[%d %d] %s: %s", m.ConvID, m.Seq, m.Sender, body)
}

// printOnce prints a message unless it was printed already.
func (s *chatSession) printOnce(m *protocol.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := [2]uint64{m.ConvID, m.Seq}
	if s.printed[key] {
		delete(s.printed, key) // each is printed by ack and echo at most once
		return
	}
	if m.Sender == s.me {
		s.printed[key] = true
	}
	fmt.Fprintln(s.out, chatFormat(m))
}

func (s *chatSession) event(ev client.Event) {
	switch ev.Kind {
	case client.EventMessage:
		m, _ := s.openE2E(ev.Message)
		if m != nil {
			s.printOnce(m)
		}
	case client.EventReceipt:
		s.mu.Lock()
		me := s.me
		s.mu.Unlock()
		if ev.Receipt.State == protocol.StateRead && ev.Receipt.UserID != me {
			s.printf("* conv %d: %s read up to %d", ev.ConvID, ev.Receipt.UserID, ev.Receipt.Seq)
		}
	case client.EventSnapshot:
		if ev.Skipped > 0 {
			s.printf("* conv %d: %d earlier unread messages skipped (see /use %d then /history)", ev.ConvID, ev.Skipped, ev.ConvID)
		}
	case client.EventConnected:
		s.mu.Lock()
		s.me = ev.Hello.UserID
		s.mu.Unlock()
		s.printf("* connected to %s as %s/%s", ev.Hello.Node, ev.Hello.UserID, ev.Hello.DeviceID)
		if s.e2e.dir != "" {
			s.e2e.bg.Go(s.publishKeys) // so that E2E contacts can reach this device
		}
	case client.EventKeysLow:
		if ev.KeysLow.DeviceID == s.e2e.device {
			s.e2e.bg.Go(s.refillKeys)
		}
	case client.EventDisconnected:
		if ev.Err != nil {
			s.printf("* disconnected: %v", ev.Err)
		}
	}
}

// command runs one input line; it returns false to leave.
func (s *chatSession) command(ctx context.Context, line string) bool {
	if line == "" {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, chatCommandTimeout)
	defer cancel()
	if !strings.HasPrefix(line, "/") {
		s.chatSend(ctx, line)
		return true
	}
	fields := strings.Fields(line)
	cmd, args := fields[0], fields[1:]
	var err error
	switch cmd {
	case "/quit", "/exit":
		return false
	case "/help":
		s.printf("%s", strings.TrimRight(chatHelp, "\n"))
	case "/dm":
		err = s.chatDM(ctx, args)
	case "/group":
		err = s.chatGroup(ctx, args)
	case "/use":
		err = s.chatUse(args)
	case "/list":
		err = s.chatList(ctx)
	case "/history":
		err = s.chatHistory(ctx, args)
	case "/read":
		err = s.chatRead(ctx)
	case "/sdm":
		err = s.chatSDM(ctx, args)
	case "/sgroup":
		err = s.chatSGroup(ctx, args)
	case "/safety":
		err = s.chatSafety(ctx, args)
	default:
		err = fmt.Errorf("unknown command %s (try /help)", cmd)
	}
	if err != nil {
		s.printf("! %v", err)
	}
	return true
}

func (s *chatSession) chatSend(ctx context.Context, body string) {
	if s.current == 0 {
		s.printf("! no current conversation: use /dm USER, /group NAME USER... or /use CONV")
		return
	}
	seq, isE2E, err := s.sendE2E(ctx, s.current, body)
	if err != nil {
		s.printf("! send: %v", err)
		return
	}
	ack := client.Ack{ConvID: s.current, Seq: seq}
	if !isE2E {
		if ack, err = s.c.Send(ctx, s.current, body); err != nil {
			s.printf("! send: %v", err)
			return
		}
	}
	s.mu.Lock()
	me := s.me
	s.mu.Unlock()
	if me == "" {
		if h, ok := s.c.Hello(); ok {
			me = h.UserID
		}
	}
	s.printOnce(&protocol.Message{ConvID: ack.ConvID, Seq: ack.Seq, Sender: me, Kind: protocol.KindText, Body: body})
}

func (s *chatSession) chatDM(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return errors.New("usage: /dm USER")
	}
	info, err := s.c.OpenDirect(ctx, args[0])
	if err != nil {
		return fmt.Errorf("dm: %w", err)
	}
	s.current = info.ConvID
	s.printf("* conv %d: direct with %s", info.ConvID, args[0])
	return nil
}

func (s *chatSession) chatGroup(ctx context.Context, args []string) error {
	if len(args) < 2 {
		return errors.New("usage: /group NAME USER...")
	}
	info, err := s.c.CreateGroup(ctx, args[0], args[1:])
	if err != nil {
		return fmt.Errorf("group: %w", err)
	}
	s.current = info.ConvID
	s.printf("* conv %d: group %s with %s", info.ConvID, args[0], strings.Join(info.Members, ", "))
	return nil
}

func (s *chatSession) chatUse(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: /use CONV")
	}
	id, err := strconv.ParseUint(args[0], 10, 64)
	if err != nil || id == 0 {
		return fmt.Errorf("use: %q is not a conversation id", args[0])
	}
	s.current = id
	s.printf("* conv %d", id)
	return nil
}

func (s *chatSession) chatList(ctx context.Context) error {
	list, err := s.c.Conversations(ctx)
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	if len(list) == 0 {
		s.printf("* no conversations")
	}
	for _, cv := range list {
		what := "group " + cv.Name
		if cv.Kind == protocol.ConvDirect {
			what = "direct with " + cv.Peer
		}
		mark := " "
		if cv.ConvID == s.current {
			mark = ">"
		}
		if cv.E2E {
			what += "  [e2e]"
			if _, known := s.e2eConv(cv.ConvID); !known {
				s.setE2EConv(cv.ConvID, e2eConv{})
			}
		}
		s.printf("%s %d  %s  unread %d  last %d", mark, cv.ConvID, what, cv.Unread, cv.LastSeq)
	}
	return nil
}

func (s *chatSession) chatHistory(ctx context.Context, args []string) error {
	if s.current == 0 {
		return errors.New("history: no current conversation")
	}
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
	for i := range msgs {
		if m, _ := s.openE2E(&msgs[i]); m != nil {
			s.printf("%s", chatFormat(m))
		}
	}
	return nil
}

func (s *chatSession) chatRead(ctx context.Context) error {
	if s.current == 0 {
		return errors.New("read: no current conversation")
	}
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
