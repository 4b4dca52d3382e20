package e2eechat

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/parley-im/parley/client/e2ee"
)

// Identity: every user has an account key that certifies each of the
// user's devices (e2ee, "Account keys and device certificates"). The
// Messenger checks every device the server lists, every bundle and the
// sender of every first message against the account key it trusts for
// the user, and reports what does not fit to OnIdentity. Safety numbers
// are computed from account keys: one per pair of users, whatever their
// devices.

// ErrUncertified: a first message (PreKeySignalMessage) whose identity
// key no certificate of the sender's trusted account key covers — another
// identity labelled as the sender by the server. Nothing is stored.
var ErrUncertified = errors.New("e2eechat: the sender's identity key is not certified by their account key")

// IdentityEventKind says what an IdentityEvent reports.
type IdentityEventKind int

const (
	// AccountChanged: a user's account key is not the one trusted before
	// (a reinstall, an account started over, or a server substituting
	// keys); SafetyNumber is the new safety number.
	AccountChanged IdentityEventKind = iota + 1
	// DeviceRefused: the server listed a device of the user (or sent a
	// first message as one) that the trusted account key did not certify;
	// nothing is encrypted to it or accepted from it.
	DeviceRefused
)

// IdentityEvent is what OnIdentity hears.
type IdentityEvent struct {
	Kind IdentityEventKind
	User string
	// Device is the refused device (DeviceRefused).
	Device string
	// OldSafetyNumber and SafetyNumber: before and after the change
	// (AccountChanged), 60 digits (e2ee.FormatSafetyNumber groups them).
	OldSafetyNumber, SafetyNumber string
	// WasVerified: the user was verified (Verify); sending to them is
	// refused (e2ee.ErrVerifiedChanged) until Verify again.
	WasVerified bool
	// Accepted: the new account key is in use (trust on first use). False
	// under e2ee.TrustStrict: sending and new sessions are refused
	// (*e2ee.UntrustedAccountError) until AcceptIdentity or Verify.
	Accepted bool
}

// OnIdentity sets the function that hears identity events. It is called
// synchronously from the call that noticed the event (a send, Open,
// Devices); it must not call back into the Messenger's sending methods.
func (m *Messenger) OnIdentity(f func(IdentityEvent)) {
	m.mu.Lock()
	m.onIdentity = f
	m.mu.Unlock()
}

func (m *Messenger) emit(ev IdentityEvent) {
	m.mu.Lock()
	f := m.onIdentity
	m.mu.Unlock()
	if f != nil {
		f(ev)
	}
}

// report turns what AcceptDevices decided into events: a change each
// time, a refused device once per identity and account key.
func (m *Messenger) report(user string, chk e2ee.DeviceCheck) {
	if c := chk.Change; c != nil {
		ev := IdentityEvent{Kind: AccountChanged, User: user, WasVerified: c.WasVerified, Accepted: c.Accepted}
		if own, ok, err := m.d.AccountKey(); err == nil && ok {
			ev.OldSafetyNumber = e2ee.SafetyNumber(m.self.User, own, user, c.Old)
			ev.SafetyNumber = e2ee.SafetyNumber(m.self.User, own, user, c.New)
		}
		m.emit(ev)
	}
	for _, r := range chk.Refused {
		m.refusedOnce(r.Address, fmt.Sprintf("%x/%x", r.IdentityKey[:], r.AccountKey))
	}
}

func (m *Messenger) refusedOnce(a e2ee.Address, what string) {
	key := a.String() + "/" + what
	m.mu.Lock()
	seen := m.refused[key]
	m.refused[key] = true
	m.mu.Unlock()
	if !seen {
		m.emit(IdentityEvent{Kind: DeviceRefused, User: a.User, Device: a.Device})
	}
}

// openTimeout bounds the device-list fetch Open makes for a first message
// from an identity it has not seen certified.
const openTimeout = 15 * time.Second

// certifiedSender checks that the identity key of a first message from
// sender is certified by the sender's trusted account key, reading the
// sender's device list again once if it is not known yet (a new device,
// a re-keyed one).
func (m *Messenger) certifiedSender(sender e2ee.Address, body []byte) error {
	p, err := e2ee.ParsePreKeySignalMessage(body)
	if err != nil {
		return err
	}
	if ok, err := m.d.Certified(sender, p.IdentityKey); err != nil || ok {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	if _, err := m.Devices(ctx, sender.User, true); err != nil {
		return fmt.Errorf("e2eechat: checking %s's identity: %w", sender, err)
	}
	if ok, err := m.d.Certified(sender, p.IdentityKey); err != nil || ok {
		return err
	}
	m.refusedOnce(sender, fmt.Sprintf("%x", p.IdentityKey[:]))
	return fmt.Errorf("%w: %s", ErrUncertified, sender)
}

// SafetyNumber is the safety number of this user and user: libsignal's
// 60-digit fingerprint of the two account keys (e2ee.SafetyNumber), the
// same on both sides, to compare out of band. It reads user's devices
// first if no account key of theirs was seen yet.
func (m *Messenger) SafetyNumber(ctx context.Context, user string) (string, error) {
	if user == m.self.User {
		return "", errors.New("e2eechat: a safety number is between two users")
	}
	own, ok, err := m.d.AccountKey()
	if err != nil {
		return "", err
	}
	if !ok {
		return "", e2ee.ErrNoAccount
	}
	t, ok, err := m.d.PeerAccount(user)
	if err == nil && !ok {
		if _, err = m.Devices(ctx, user, true); err == nil {
			t, ok, err = m.d.PeerAccount(user)
		}
	}
	if err != nil {
		return "", err
	}
	if !ok {
		return "", fmt.Errorf("e2eechat: %s has no certified device", user)
	}
	return e2ee.SafetyNumber(m.self.User, own, user, t.Key), nil
}

// Verify marks user verified after the safety number was compared out of
// band (the newest account key seen, one waiting under TrustStrict
// included): a later change of their account key blocks sending to them
// until Verify again. It returns the safety number verified.
func (m *Messenger) Verify(ctx context.Context, user string) (string, error) {
	if _, ok, err := m.d.PeerAccount(user); err != nil {
		return "", err
	} else if !ok {
		if _, err := m.Devices(ctx, user, true); err != nil && !errors.Is(err, e2ee.ErrUntrusted) {
			return "", err
		}
	}
	if _, err := m.d.VerifyAccount(user); err != nil {
		return "", err
	}
	m.forget(user)
	return m.SafetyNumber(ctx, user)
}

// AcceptIdentity accepts user's new account key refused under
// e2ee.TrustStrict (AccountChanged with Accepted false). A user who was
// verified stays blocked until Verify.
func (m *Messenger) AcceptIdentity(user string) error {
	if err := m.d.TrustAccount(user); err != nil {
		return err
	}
	m.forget(user)
	return nil
}
