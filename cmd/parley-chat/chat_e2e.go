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
	"github.com/parley-im/parley/protocol/e2ekeys"
)

// End-to-end encrypted conversations in `parley-chat`: /sdm and /sgroup
// open them, messages in them are encrypted with this device's keys (kept
// in -keys DIR/<server>/<user>/<device>, files 0600, locked while a
// parley-chat uses them: a second one on the same device is refused, as it
// would reuse message keys), /safety prints safety numbers, /verify marks
// a peer verified. Keys are kept per server: an identity one server knows
// is never offered to another, and a fresh server gets a fresh device.
// The user's account key, which certifies each of the user's devices, is
// shared by the devices under the same -keys DIR
// (DIR/<server>/<user>/+account: '+' is in no user or device id); -link
// FILE and /export-account FILE move it to devices elsewhere.

// e2eState is the E2E side of a chat session.
type e2eState struct {
	dir    string // -keys
	server string // the directory of -url's server under dir
	device string
	// link is -link (an account key file to import), newAccount
	// -new-account (start the account over with this device's key).
	link       string
	newAccount bool

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
	if err := e.account(d, filepath.Join(e.dir, e.server, me, accountFile)); err != nil {
		return nil, err
	}
	m := e2eechat.New(s.c, d, st)
	m.OnIdentity(s.identityEvent)
	m.OnKT(s.ktEvent)
	if b, err := st.Load("published"); err != nil {
		return nil, err
	} else if b == nil {
		if err := s.firstUpload(ctx, m); err != nil {
			return nil, err
		}
		if err := st.Save("published", []byte{1}); err != nil {
			return nil, err
		}
	} else {
		// A server whose data was reset no longer knows the device; its
		// identity stays where it is rather than being replaced unasked.
		devs, err := s.c.KeyDevices(ctx, me)
		if err != nil {
			return nil, fmt.Errorf("e2e: key devices: %w", err)
		}
		i := slices.IndexFunc(devs, func(k protocol.DeviceKeyInfo) bool { return k.DeviceID == e.device })
		if i < 0 {
			return nil, fmt.Errorf("e2e: %s does not know the keys of device %s (its data was reset?); to start the device afresh there, move %s away", s.url, e.device, dir)
		}
		// The server's certificate of the device is not by the account
		// key the device holds (linked since, or published before account
		// keys): upload the current one.
		own, _, err := d.AccountKey()
		if err != nil {
			return nil, err
		}
		if e.newAccount {
			err = m.ReplaceAccount(ctx)
		} else if !slices.Equal(devs[i].AccountKey, own.Bytes()) ||
			!e2ekeys.VerifyDeviceCert(devs[i].AccountKey, me, e.device, devs[i].IdentityKey, devs[i].DeviceSig) {
			err = m.Certify(ctx)
		}
		if err != nil {
			return nil, s.accountErr(err)
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
	e.newAccount = false // done: a reconnect does not start over again
	e.m = m
	e.bg.Go(func() { s.monitorKeys(m) })
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
		s.monitorKeys(m)
	}
}

// monitorTimeout bounds one pass of key transparency monitoring (the first
// reads the whole log: 1,000 entries a request).
const monitorTimeout = 5 * time.Minute

// monitorKeys reads the key transparency log for entries of this user the
// user's devices did not publish (at start and with the hourly key
// maintenance); what it finds is reported by ktEvent.
func (s *chatSession) monitorKeys(m *e2eechat.Messenger) {
	ctx, cancel := context.WithTimeout(s.e2e.ctx, monitorTimeout)
	defer cancel()
	err := m.MonitorKeys(ctx)
	switch {
	case err == nil, s.e2e.ctx.Err() != nil, errors.Is(err, e2eechat.ErrKTUnavailable),
		errors.Is(err, e2eechat.ErrKTGhost), errors.Is(err, e2eechat.ErrKTFork), errors.Is(err, e2eechat.ErrKTProof):
		// nothing to say, or ktEvent said it
	default:
		s.printf("! key transparency: monitoring: %v", err)
	}
}

// ktEvent warns of a key answer or message the key transparency checks
// refused, and of keys the server published for this user.
func (s *chatSession) ktEvent(ev e2eechat.KTEvent) {
	switch {
	case errors.Is(ev.Err, e2eechat.ErrKTGhost):
		s.printf("! KEY TRANSPARENCY: the server published keys or devices for you that none of your devices created")
		s.printf("!   %v", ev.Err)
	case errors.Is(ev.Err, e2eechat.ErrKTFork):
		s.printf("! KEY TRANSPARENCY: the server showed a key log that contradicts what you or %s saw before (a forked or rolled-back log); nothing from it is used", ev.User)
		s.printf("!   %v", ev.Err)
	default:
		s.printf("! key transparency: a key answer for %s was refused: %v", ev.User, ev.Err)
	}
}

// accountFile is the name of the user's account key under
// DIR/<server>/<user>.
const accountFile = "+account"

// account gives d its user's account key: -link's file, or the one the
// user's devices under this -keys DIR share, or (the user's first device
// here) its own, created and shared.
func (e *e2eState) account(d *e2ee.Device, shared string) error {
	if e.link != "" {
		b, err := os.ReadFile(e.link)
		if err != nil {
			return fmt.Errorf("e2e: -link: %w", err)
		}
		if _, err := d.ImportAccountKey(b); err != nil {
			return fmt.Errorf("e2e: -link %s: %w", e.link, err)
		}
		e.link = ""
		return writeSecret(shared, b)
	}
	if _, ok, err := d.AccountKey(); err != nil {
		return err
	} else if ok {
		if _, err := os.Stat(shared); errors.Is(err, os.ErrNotExist) {
			b, err := d.ExportAccountKey()
			if err != nil {
				return err
			}
			return writeSecret(shared, b)
		}
		return nil
	}
	if b, err := os.ReadFile(shared); err == nil {
		if _, err := d.ImportAccountKey(b); err != nil {
			return fmt.Errorf("e2e: account key %s: %w", shared, err)
		}
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("e2e: account key: %w", err)
	}
	if _, err := d.CreateAccountKey(); err != nil {
		return err
	}
	b, err := d.ExportAccountKey()
	if err != nil {
		return err
	}
	return writeSecret(shared, b)
}

// writeSecret writes b to path, 0600, its directory 0700, through a
// temporary file and a rename so a crash leaves the old file or the new.
func writeSecret(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".account-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// firstUpload publishes the device's keys the first time: its identity
// and certificate (starting the account over with -new-account), then
// one-time prekeys. The identity goes up whole each time, so a first
// upload refused (account_conflict) can be made again after -link.
func (s *chatSession) firstUpload(ctx context.Context, m *e2eechat.Messenger) error {
	up := m.Certify
	if s.e2e.newAccount {
		up = m.ReplaceAccount
	}
	if err := up(ctx); err != nil {
		return s.accountErr(err)
	}
	if _, err := m.PublishKeys(ctx, 20); err != nil {
		return s.accountErr(err)
	}
	return nil
}

// accountErr explains account_conflict: the server holds this user's
// devices under another account key.
func (s *chatSession) accountErr(err error) error {
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != protocol.CodeAccountConflict {
		return fmt.Errorf("e2e: publish keys: %w", err)
	}
	return fmt.Errorf("e2e: %s already has devices under another account key; this device cannot join them on its own:\n"+
		"* link it: on one of those devices run /export-account FILE, then start this one with -link FILE;\n"+
		"* or start your account over with -new-account: those devices are dropped and your contacts see a new safety number", s.user())
}

// identityEvent prints what the E2E layer noticed about a peer's keys.
func (s *chatSession) identityEvent(ev e2eechat.IdentityEvent) {
	switch ev.Kind {
	case e2eechat.AccountChanged:
		s.printf("! SAFETY NUMBER CHANGED with %s: their account key is new (a reinstall, or someone in between)", ev.User)
		s.printf("!   new safety number: %s", e2ee.FormatSafetyNumber(ev.SafetyNumber))
		if ev.OldSafetyNumber != "" {
			s.printf("!   was:               %s", e2ee.FormatSafetyNumber(ev.OldSafetyNumber))
		}
		if ev.WasVerified {
			s.printf("!   you had verified %s: sending to them is blocked until you compare the new number and /verify %s", ev.User, ev.User)
		} else {
			s.printf("!   compare it with %s out of band, then /verify %s", ev.User, ev.User)
		}
	case e2eechat.DeviceRefused:
		s.printf("! e2e: refused device %s/%s: %s's account key did not certify it (added by the server?); nothing is encrypted to it", ev.User, ev.Device, ev.User)
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
	m, err := s.messenger(ctx)
	if err != nil {
		return err
	}
	n, err := m.SafetyNumber(ctx, args[0])
	if err != nil {
		return fmt.Errorf("safety: %w", err)
	}
	what := "not verified: compare it out of band, then /verify " + args[0]
	if t, ok, err := m.Device().PeerAccount(args[0]); err == nil && ok {
		switch {
		case t.Blocked:
			what = "CHANGED since you verified: sending is blocked until /verify " + args[0]
		case t.Verified:
			what = "verified"
		}
	}
	s.printf("* safety number with %s: %s (%s)", args[0], e2ee.FormatSafetyNumber(n), what)
	return nil
}

func (s *chatSession) chatVerify(ctx context.Context, args []string) error {
	m, err := s.messenger(ctx)
	if err != nil {
		return err
	}
	n, err := m.Verify(ctx, args[0])
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	s.printf("* %s verified, safety number %s: if it changes, sending to %s stops until you /verify again", args[0], e2ee.FormatSafetyNumber(n), args[0])
	return nil
}

func (s *chatSession) chatExportAccount(ctx context.Context, args []string) error {
	m, err := s.messenger(ctx)
	if err != nil {
		return err
	}
	b, err := m.Device().ExportAccountKey()
	if err != nil {
		return fmt.Errorf("export-account: %w", err)
	}
	if err := writeSecret(args[0], b); err != nil {
		return fmt.Errorf("export-account: %w", err)
	}
	s.printf("* account key written to %s (0600): start the other device with -link %s, then delete the file (whoever holds it can add devices to your account)", args[0], args[0])
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
	if errors.Is(err, e2ee.ErrVerifiedChanged) {
		err = fmt.Errorf("%w\n* not sent: the safety number of someone you verified changed; compare the new one (/safety USER) and /verify USER to send again", err)
	}
	return ack.Seq, true, err
}

// recallE2E recalls seq in E2E conversation conv with an envelope the
// receivers authenticate (they apply no other recall); it reports false
// when the conversation is not one this session knows as E2E.
func (s *chatSession) recallE2E(ctx context.Context, conv, seq uint64) (client.Ack, bool, error) {
	m, ok, err := s.e2eMessenger(ctx, conv)
	if !ok || err != nil {
		return client.Ack{}, ok, err
	}
	ack, err := m.Recall(ctx, conv, seq)
	return ack, true, err
}

// editE2E replaces seq in E2E conversation conv with text, sealed; it
// reports false when the conversation is not one this session knows as
// E2E.
func (s *chatSession) editE2E(ctx context.Context, conv, seq uint64, text string) (client.Ack, bool, error) {
	m, ok, err := s.e2eMessenger(ctx, conv)
	if !ok || err != nil {
		return client.Ack{}, ok, err
	}
	ack, err := m.Edit(ctx, conv, seq, text)
	return ack, true, err
}

// e2eMessenger returns the messenger for conv, or false when conv is not
// an E2E conversation (asking the server about one this session has not
// seen yet).
func (s *chatSession) e2eMessenger(ctx context.Context, conv uint64) (*e2eechat.Messenger, bool, error) {
	if _, ok := s.e2eConv(conv); !ok {
		info, err := s.c.ConvInfo(ctx, conv)
		if err != nil || !info.E2E {
			return nil, false, nil // the plaintext path reports the error, if any
		}
		s.setE2EConv(conv, e2eConv{group: info.Kind == protocol.ConvGroup})
	}
	m, err := s.messenger(ctx)
	return m, true, err
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
	case o.File != nil:
		out.Body = e2eFileJSON(o.File)
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
