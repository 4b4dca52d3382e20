package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/client/e2eechat"
	"github.com/parley-im/parley/protocol"
)

// End-to-end encrypted conversations in `parley-chat`: /sdm and /sgroup
// open them, messages in them are encrypted with this device's keys (kept
// in -keys DIR/<server>/<user>/<device>, files 0600, locked while a
// parley-chat uses them: a second one on the same device is refused, as it
// would reuse message keys), /safety prints
// safety numbers. Keys are kept per server: an identity one server knows
// is never offered to another, and a fresh server gets a fresh device.

// e2eState is the E2E side of a chat session.
type e2eState struct {
	dir    string // -keys
	server string // the directory of -url's server under dir
	device string

	// ctx is runChat's; bg tracks the key uploads started from events.
	ctx context.Context
	bg  sync.WaitGroup

	mu     sync.Mutex
	st     *e2ee.FileStore // open (and locked) from the first use to close
	m      *e2eechat.Messenger
	convs  map[uint64]e2eConv
	failed error
}

// e2eConv marks a conversation this session knows to be E2E; sends read
// its members from the server (conv_info) each time.
type e2eConv struct {
	group bool
}

// serverDir names a server's directory of keys after its URL's host and
// path, with every byte outside [A-Za-z0-9.-] written as '_' (so
// "ws://127.0.0.1:7480" is "127.0.0.1_7480"); ws and wss share it.
func serverDir(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("e2e: -url %q has no host", raw)
	}
	b := []byte(strings.ToLower(u.Host) + strings.TrimRight(u.Path, "/"))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-') {
			b[i] = '_'
		}
	}
	return string(b), nil
}

func defaultKeysDir() string {
	if d, err := os.UserConfigDir(); err == nil {
		return filepath.Join(d, "parley", "e2ee")
	}
	return ".parley-e2ee"
}

// messenger returns the session's Messenger, opening the device's store
// and publishing its keys the first time.
func (s *chatSession) messenger(ctx context.Context) (*e2eechat.Messenger, error) {
	e := s.e2e
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m != nil {
		return e.m, nil
	}
	if e.dir == "" {
		return nil, errors.New("e2e: disabled (-keys \"\")")
	}
	me := s.user()
	if me == "" {
		return nil, errors.New("e2e: not connected yet")
	}
	dir := filepath.Join(e.dir, e.server, me, e.device)
	if e.st == nil {
		st, err := e2ee.OpenFileStore(dir)
		if errors.Is(err, e2ee.ErrLocked) {
			return nil, fmt.Errorf("e2e: another parley-chat is using the keys of device %s (%s): quit it, or start this one with another -device", e.device, dir)
		}
		if err != nil {
			return nil, fmt.Errorf("e2e: key store: %w", err)
		}
		e.st = st
	}
	st := e.st
	d, err := e2ee.OpenDevice(st, e2ee.Address{User: me, Device: e.device})
	if err != nil {
		return nil, fmt.Errorf("e2e: %w", err)
	}
	m := e2eechat.New(s.c, d, st)
	if b, err := st.Load("published"); err != nil {
		return nil, err
	} else if b == nil {
		if _, err := m.PublishKeys(ctx, 20); err != nil {
			return nil, fmt.Errorf("e2e: publish keys: %w", err)
		}
		if err := st.Save("published", []byte{1}); err != nil {
			return nil, err
		}
	} else {
		// A server whose data was reset no longer knows the device; its
		// identity stays where it is rather than being replaced unasked.
		devs, err := m.Devices(ctx, me, true)
		if err != nil {
			return nil, fmt.Errorf("e2e: key devices: %w", err)
		}
		if !slices.Contains(devs, e.device) {
			return nil, fmt.Errorf("e2e: %s does not know the keys of device %s (its data was reset?); to start the device afresh there, move %s away", s.url, e.device, dir)
		}
		if _, err := m.Refill(ctx, 20); err != nil { // keys_low may have come while offline
			return nil, fmt.Errorf("e2e: refill keys: %w", err)
		}
	}
	// Keys due for rotation while the CLI was not running are replaced
	// now; a failure is retried by maintainKeys and blocks nothing.
	if err := m.Maintain(ctx); err != nil {
		s.printf("! e2e: key rotation: %v", err)
	}
	e.m = m
	return m, nil
}

// keyMaintenanceEvery is how often a running parley-chat checks whether
// its signed prekey and last-resort KEM key are due for rotation
// (e2eechat.DefaultRotation: every two days, kept thirty).
const keyMaintenanceEvery = time.Hour

// maintainKeys rotates the device's keys on schedule while the session
// runs (once its E2E state is open).
func (s *chatSession) maintainKeys() {
	t := time.NewTicker(keyMaintenanceEvery)
	defer t.Stop()
	for {
		select {
		case <-s.e2e.ctx.Done():
			return
		case <-t.C:
		}
		s.e2e.mu.Lock()
		m := s.e2e.m
		s.e2e.mu.Unlock()
		if m == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(s.e2e.ctx, chatCommandTimeout)
		if err := m.Maintain(ctx); err != nil && s.e2e.ctx.Err() == nil {
			s.printf("! e2e: key rotation: %v", err)
		}
		cancel()
	}
}

// close releases the device's key directory (its lock) once nothing
// writes to it any more.
func (e *e2eState) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.st != nil {
		e.st.Close()
		e.st, e.m = nil, nil
	}
}

func (s *chatSession) setE2EConv(id uint64, c e2eConv) {
	s.e2e.mu.Lock()
	defer s.e2e.mu.Unlock()
	s.e2e.convs[id] = c
}

func (s *chatSession) e2eConv(id uint64) (e2eConv, bool) {
	s.e2e.mu.Lock()
	defer s.e2e.mu.Unlock()
	c, ok := s.e2e.convs[id]
	return c, ok
}

// leaveOnFailure is deferred by /sdm and /sgroup: when they fail, the
// conversation that was current is no longer, so a line meant for the
// encrypted conversation is not sent in plaintext somewhere else.
func (s *chatSession) leaveOnFailure(err *error) {
	if *err == nil || s.current == 0 {
		return
	}
	*err = fmt.Errorf("%w\n* no current conversation (conv %d is not the encrypted one you asked for)", *err, s.current)
	s.current = 0
}

func (s *chatSession) chatSDM(ctx context.Context, args []string) (err error) {
	if len(args) != 1 {
		return errors.New("usage: /sdm USER")
	}
	defer s.leaveOnFailure(&err)
	if _, err := s.messenger(ctx); err != nil {
		return err
	}
	info, err := s.c.OpenDirectE2E(ctx, args[0])
	if err != nil {
		return fmt.Errorf("sdm: %w", err)
	}
	s.setE2EConv(info.ConvID, e2eConv{})
	s.current = info.ConvID
	s.printf("* conv %d: end-to-end encrypted direct with %s", info.ConvID, args[0])
	return nil
}

func (s *chatSession) chatSGroup(ctx context.Context, args []string) (err error) {
	if len(args) < 2 {
		return errors.New("usage: /sgroup NAME USER...")
	}
	defer s.leaveOnFailure(&err)
	if _, err := s.messenger(ctx); err != nil {
		return err
	}
	info, err := s.c.CreateGroupE2E(ctx, args[0], args[1:])
	if err != nil {
		return fmt.Errorf("sgroup: %w", err)
	}
	s.setE2EConv(info.ConvID, e2eConv{group: true})
	s.current = info.ConvID
	s.printf("* conv %d: end-to-end encrypted group %s with %s", info.ConvID, args[0], strings.Join(info.Members, ", "))
	return nil
}

func (s *chatSession) chatSafety(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return errors.New("usage: /safety USER")
	}
	m, err := s.messenger(ctx)
	if err != nil {
		return err
	}
	devs, err := m.Devices(ctx, args[0], true)
	if err != nil {
		return fmt.Errorf("safety: %w", err)
	}
	if len(devs) == 0 {
		return fmt.Errorf("safety: %s has no device with keys", args[0])
	}
	for _, d := range devs {
		n, err := m.SafetyNumber(ctx, e2ee.Address{User: args[0], Device: d})
		if err != nil {
			return fmt.Errorf("safety: %w", err)
		}
		s.printf("* safety number with %s/%s: %s", args[0], d, e2ee.FormatSafetyNumber(n))
	}
	return nil
}

// sendE2E sends body in E2E conversation c; it reports false when the
// conversation is not one this session knows as E2E.
func (s *chatSession) sendE2E(ctx context.Context, conv uint64, body string) (uint64, bool, error) {
	if _, ok := s.e2eConv(conv); !ok {
		info, err := s.c.ConvInfo(ctx, conv)
		if err != nil || !info.E2E {
			return 0, false, nil // the plaintext path reports the error, if any
		}
		s.setE2EConv(conv, e2eConv{group: info.Kind == protocol.ConvGroup})
	}
	m, err := s.messenger(ctx)
	if err != nil {
		return 0, true, err
	}
	// Members are read at each send: they change.
	ack, err := m.Send(ctx, conv, body)
	return ack.Seq, true, err
}

// recallE2E recalls seq in E2E conversation conv with an envelope the
// receivers authenticate (they apply no other recall); it reports false
// when the conversation is not one this session knows as E2E.
func (s *chatSession) recallE2E(ctx context.Context, conv, seq uint64) (client.Ack, bool, error) {
	if _, ok := s.e2eConv(conv); !ok {
		info, err := s.c.ConvInfo(ctx, conv)
		if err != nil || !info.E2E {
			return client.Ack{}, false, nil // the plaintext path reports the error, if any
		}
		s.setE2EConv(conv, e2eConv{group: info.Kind == protocol.ConvGroup})
	}
	m, err := s.messenger(ctx)
	if err != nil {
		return client.Ack{}, true, err
	}
	ack, err := m.Recall(ctx, conv, seq)
	return ack, true, err
}

// openE2E decrypts an E2E message for display; ok is false for a message
// that is not an E2E conversation's. A nil result with ok means "do not
// print": a protocol message, or one refused (a warning line says why: the
// server's labels do not match what the sender sealed, or a recall is not
// the author's).
func (s *chatSession) openE2E(msg *protocol.Message) (*protocol.Message, bool) {
	if msg.Kind == protocol.KindSystem {
		return msg, false
	}
	_, known := s.e2eConv(msg.ConvID)
	if _, err := protocol.ParseEnvelope(msg.Body); err != nil && !(known && (msg.Kind == protocol.KindRecall || msg.Recalled)) {
		return msg, false
	}
	m, err := s.messenger(context.Background())
	out := *msg
	if err != nil {
		out.Body = "(encrypted: " + err.Error() + ")"
		return &out, true
	}
	o, err := m.Open(*msg)
	switch {
	case errors.Is(err, e2eechat.ErrNotForDevice):
		out.Body = "(encrypted for other devices)"
	case errors.Is(err, e2eechat.ErrUnbound) && o.Text != "":
		s.printf("! e2e: conv %d seq %d: %v: shown unverified", msg.ConvID, msg.Seq, err)
		out.Body = o.Text + " (unverified)"
	case errors.Is(err, e2eechat.ErrMetadataMismatch), errors.Is(err, e2eechat.ErrUnbound), errors.Is(err, e2eechat.ErrUnauthenticatedRecall):
		s.printf("! e2e: conv %d seq %d refused: %v", msg.ConvID, msg.Seq, err)
		return nil, true
	case err != nil:
		out.Body = "(cannot decrypt: " + err.Error() + ")"
	case o.Control:
		return nil, true
	case msg.Recalled && !o.Recalled:
		// The server's recall flag, without the author's recall.
		out.Recalled = false
		out.Body = o.Text + " (hidden by the server, not recalled by " + msg.Sender + ")"
		if o.Text == "" {
			out.Body = "(removed by the server)"
		}
	default:
		out.Body = o.Text
	}
	return &out, true
}

// systemE2E hands a system event that arrived (a push or a sync, not
// /history: an event is acted on once) to the E2E layer, which rotates
// this device's sender key of a group a member left or was removed from
// and forgets device lists and sessions that changed. It is done before
// the event prints, so a line typed after seeing it uses the new state.
func (s *chatSession) systemE2E(msg *protocol.Message) {
	if s.e2e.dir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(s.e2e.ctx, chatCommandTimeout)
	defer cancel()
	m, err := s.messenger(ctx)
	if err != nil {
		return // the next E2E send or open reports it
	}
	if _, err := m.Open(*msg); err != nil {
		s.printf("! e2e: conv %d seq %d: %v", msg.ConvID, msg.Seq, err)
	}
}

// publishKeys opens the device's E2E state after connecting: the first
// time it publishes the device's keys, later it refills them if low.
func (s *chatSession) publishKeys() {
	ctx, cancel := context.WithTimeout(s.e2e.ctx, chatCommandTimeout)
	defer cancel()
	if _, err := s.messenger(ctx); err != nil {
		s.printf("! %v", err)
	}
}

// refillKeys uploads more one-time prekeys after a keys_low push.
func (s *chatSession) refillKeys() {
	ctx, cancel := context.WithTimeout(s.e2e.ctx, chatCommandTimeout)
	defer cancel()
	m, err := s.messenger(ctx)
	if err == nil {
		_, err = m.PublishKeys(ctx, 20)
	}
	if err != nil {
		s.printf("! e2e: refilling prekeys: %v", err)
	}
}
