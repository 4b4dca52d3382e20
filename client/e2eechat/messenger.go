// Package e2eechat connects an e2ee.Device to a Parley client: it publishes
// the device's keys (and rotates them, Maintain), fetches bundles, encrypts to every device of the
// recipients and of the sender's own other devices, distributes Sender Keys
// in groups and opens what arrives. Every key answer is checked against
// the server's key transparency log, and this user's own entries in it
// are monitored (kt.go, kt_monitor.go). Decrypted messages are kept in the
// device's Store, which is also where local search looks: the server of an
// E2E conversation cannot search. Each content seals the labels the server
// shows beside it (conversation, kind, target, sender user and device, a
// counter), and Open refuses a message whose labels differ, an edit or
// recall by anyone but its target's author, and a replay. Every device,
// bundle and first-message sender must be certified by the account key
// this device trusts for its user (identity.go): a change of a user's
// account key is reported (OnIdentity), refused under e2ee.TrustStrict,
// and blocks sending to a verified user until Verify. Files (file.go) are
// encrypted before upload (SendFile: the server holds only ciphertext
// under a made-up name and type), described inside the content with
// their key and digest and a thumbnail made here, and decrypted by
// DownloadFile only after digest and MAC verify.
package e2eechat

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/protocol"
)

// Errors of Open.
var (
	// ErrNotForDevice: the message has no ciphertext for this device (it
	// was sent before the device published its keys).
	ErrNotForDevice = errors.New("e2eechat: no ciphertext for this device")
	// ErrOwnUnknown: a message this device sent whose plaintext it no
	// longer has (a sender cannot decrypt its own ciphertexts).
	ErrOwnUnknown = errors.New("e2eechat: own message without a local copy")
	// ErrMetadataMismatch: the server's labels of a message differ from
	// what its author sealed inside the encryption (conversation, kind,
	// target, sender user or device), an edit or recall targets a message
	// someone else wrote, or a content already opened comes again under
	// another seq. The error is a *MetadataError saying what differed;
	// nothing of the message is shown or kept.
	ErrMetadataMismatch = errors.New("e2eechat: the server's labels do not match the encrypted content")
	// ErrUnbound: the content carries no bound metadata (it was sealed by
	// an SDK that did not write it), so its labels are the server's word
	// alone. For a message the server labels a text (not edited)
	// Opened.Text holds the text, for the caller to show flagged as
	// unverified; it is not kept, and a sender key distribution, edit or
	// recall without bound metadata is not applied.
	ErrUnbound = errors.New("e2eechat: metadata not bound inside the encryption")
	// ErrUnauthenticatedRecall: a recall without an envelope of its
	// author's (sent by the server's moderation, by a client that seals
	// none, or forged). The target is not recalled on this device.
	ErrUnauthenticatedRecall = errors.New("e2eechat: recall not authenticated by the author")
)

// MetadataError is an ErrMetadataMismatch. Field is what differed:
// "conv", "kind", "target", "from" (sender user), "dev" (sender device),
// "author" (an edit or recall of a message written by someone else:
// Server is the target's author as this device kept it) or "seq" (a
// content opened before under another seq: Server is the new seq, Sealed
// the one it was first opened under).
type MetadataError struct {
	ConvID, Seq uint64 // the message as the server labelled it
	Field       string
	Server      string // the server's label
	Sealed      string // what the encrypted content (or this device's record of it) says
}

func (e *MetadataError) Error() string {
	return fmt.Sprintf("e2eechat: conv %d seq %d: refused: the server says %s %q, the encrypted content %q", e.ConvID, e.Seq, e.Field, e.Server, e.Sealed)
}

// Is makes errors.Is(err, ErrMetadataMismatch) true.
func (e *MetadataError) Is(target error) bool { return target == ErrMetadataMismatch }

// envelopeBudget is the part of max_body_bytes one envelope of sender-key
// distributions may use.
const envelopeBudget = 12 << 10

// content is what travels inside the encryption: the message (T and its
// payload) and the labels the server shows beside it, sealed by the author
// so that the receiver can compare them (docs/protocol.md, "Content inside
// the encryption").
type content struct {
	T    string `json:"t"` // "text", "skdm", "recall" or "file"
	Text string `json:"text,omitempty"`
	SKDM []byte `json:"skdm,omitempty"`
	File *File  `json:"file,omitempty"` // a file message's file (file.go)

	Conv   uint64 `json:"conv,string,omitempty"`
	Kind   string `json:"kind,omitempty"`   // the stored message's kind: text, state, edit, recall or file (a distribution travels as text)
	Target uint64 `json:"target,omitempty"` // an edit's or recall's target seq
	From   string `json:"from,omitempty"`
	Dev    string `json:"dev,omitempty"`
	// Ctr counts the contents this device sealed in the conversation,
	// from 1: a content is opened under one seq only.
	Ctr uint64  `json:"ctr,omitempty"`
	KT  *KTHead `json:"kt,omitempty"`
}

// shown is the text a content shows: a file's caption, else its text.
func (c content) shown() string {
	if c.File != nil {
		return c.File.Caption
	}
	return c.Text
}

// KTHead is a key transparency checkpoint (tree size and root hash) as
// the sender last verified it, carried inside the content so that its
// receivers can compare it with their own view of the log.
type KTHead struct {
	Size uint64 `json:"size"`
	Root []byte `json:"root"`
}

// kept is what this device records of a message it opened or sent: its
// labels as verified against the content, which later deliveries of the
// same seq must repeat (empty ones were not verified and are not
// compared), and what it shows (the text, following authenticated edits;
// none once its author recalled it).
type kept struct {
	From     string `json:"from,omitempty"`
	Dev      string `json:"dev,omitempty"`
	Kind     string `json:"kind,omitempty"`
	Target   uint64 `json:"target,omitempty"`
	Text     string `json:"text,omitempty"`
	File     *File  `json:"file,omitempty"`
	Recalled bool   `json:"recalled,omitempty"`
	// Legacy: made from the text alone an older store kept.
	Legacy bool `json:"-"`
}

// Opened is a decrypted message.
type Opened struct {
	ConvID       uint64
	Seq          uint64
	Sender       string
	SenderDevice string
	Kind         string // text, edit, recall, system, state, file
	TargetSeq    uint64
	Text         string // a file's caption for kind file
	// File is the file of a kind file message: its name, size, media
	// type, key and digest, thumbnail (DownloadFile fetches and decrypts
	// it).
	File *File
	// System is set for kind system.
	System *protocol.SystemEvent
	// Control is true for protocol messages (sender-key distributions) the
	// user does not see.
	Control bool
	// Recalled is set for a message its author recalled (an authenticated
	// recall this device applied). The server's recalled flag alone does
	// not set it: the kept text is shown.
	Recalled bool
}

// Messenger is the E2E side of one device. Safe for concurrent use.
type Messenger struct {
	c    *client.Client
	d    *e2ee.Device
	st   e2ee.Store
	self e2ee.Address

	mu   sync.Mutex
	devs map[string][]string // user → device ids with keys (cache)
	rot  Rotation            // SetRotation
	// onIdentity gets identity events; refused remembers the refused
	// devices already reported.
	onIdentity func(IdentityEvent)
	refused    map[string]bool

	// openMu makes Open atomic: a message delivered twice at once (push and
	// sync) is decrypted once, the second call gets the kept copy.
	openMu sync.Mutex

	// ctrMu serializes the counters of sealed contents (content.Ctr).
	ctrMu sync.Mutex

	// ktHead, when set, gives the checkpoint sealed into every content;
	// ktCheck, when set, vets the checkpoint of every content Open
	// accepts (nil when the sender sealed none) and its error is Open's.
	ktHead  func() *KTHead
	ktCheck func(sender e2ee.Address, head *KTHead) error

	kt ktState // key transparency (kt.go)
}

// New returns a Messenger for device d (whose state is in st) on client c.
func New(c *client.Client, d *e2ee.Device, st e2ee.Store) *Messenger {
	m := &Messenger{c: c, d: d, st: st, self: d.Address(), devs: map[string][]string{}, rot: DefaultRotation, refused: map[string]bool{}}
	m.ktHead, m.ktCheck = m.ktGossipHead, m.ktCheckGossip
	return m
}

// Device is the messenger's device.
func (m *Messenger) Device() *e2ee.Device { return m.d }

// PublishKeys generates n one-time prekeys of each kind (and the signed
// and last-resort keys on first use) and uploads them, in batches that fit
// a frame. The first batch carries the device's certificate by the
// account key (one is created if the device has none: the account's first
// device; the others import it, e2ee.Device.ImportAccountKey). A server
// that holds devices of this user under another account key answers
// account_conflict (client.Error): link the device, or ReplaceAccount.
func (m *Messenger) PublishKeys(ctx context.Context, n int) (protocol.KeyCounts, error) {
	up, err := m.d.GenerateKeys(n)
	if err != nil {
		return protocol.KeyCounts{}, err
	}
	first := protocol.KeyUpload{RegistrationID: up.RegistrationID, IdentityKey: up.IdentityKey.Bytes()}
	if err := m.certify(&first); err != nil {
		return protocol.KeyCounts{}, err
	}
	if up.SignedPreKey != nil {
		first.SignedPreKey = &protocol.PreKey{ID: up.SignedPreKey.ID, Key: up.SignedPreKey.Key.Bytes(), Sig: up.SignedPreKey.Sig}
	}
	if up.LastResortKEM != nil {
		first.LastResortKEM = &protocol.PreKey{ID: up.LastResortKEM.ID, Key: up.LastResortKEM.Key, Sig: up.LastResortKEM.Sig}
	}
	var counts protocol.KeyCounts
	batch := first
	for i := 0; ; i++ {
		for len(up.PreKeys) > 0 && len(batch.PreKeys) < protocol.MaxUploadKEMPreKeys {
			p := up.PreKeys[0]
			up.PreKeys = up.PreKeys[1:]
			batch.PreKeys = append(batch.PreKeys, protocol.PreKey{ID: p.ID, Key: p.Key.Bytes()})
		}
		for len(up.KEMPreKeys) > 0 && len(batch.KEMPreKeys) < protocol.MaxUploadKEMPreKeys {
			p := up.KEMPreKeys[0]
			up.KEMPreKeys = up.KEMPreKeys[1:]
			batch.KEMPreKeys = append(batch.KEMPreKeys, protocol.PreKey{ID: p.ID, Key: p.Key, Sig: p.Sig})
		}
		if counts, err = m.c.UploadKeys(ctx, batch); err != nil {
			return counts, err
		}
		if len(up.PreKeys) == 0 && len(up.KEMPreKeys) == 0 {
			return counts, nil
		}
		batch = protocol.KeyUpload{}
	}
}

// certify adds the device's account key and certificate to k, creating
// the account key if the device has none.
func (m *Messenger) certify(k *protocol.KeyUpload) error {
	if _, ok, err := m.d.AccountKey(); err != nil {
		return err
	} else if !ok {
		if _, err := m.d.CreateAccountKey(); err != nil {
			return err
		}
	}
	ak, sig, err := m.d.DeviceCertificate()
	if err != nil {
		return err
	}
	k.AccountKey, k.DeviceSig = ak.Bytes(), sig
	return nil
}

// Certify uploads the device's identity, current signed prekey and
// last-resort KEM key with its certificate by the account key it holds
// now: after ImportAccountKey (linking), or for a server that refused or
// forgot the device's first upload. One-time prekeys follow with
// PublishKeys.
func (m *Messenger) Certify(ctx context.Context) error {
	return m.uploadIdentity(ctx, false)
}

// ReplaceAccount starts the user's account over with this device's
// account key (created if it has none): the server removes the user's
// devices under any other account key, and contacts see the account key
// change (a new safety number).
func (m *Messenger) ReplaceAccount(ctx context.Context) error {
	return m.uploadIdentity(ctx, true)
}

func (m *Messenger) uploadIdentity(ctx context.Context, replace bool) error {
	up, err := m.d.PublicKeys()
	if err != nil {
		return err
	}
	if up.SignedPreKey == nil || up.LastResortKEM == nil {
		if _, err := m.d.GenerateKeys(0); err != nil {
			return err
		}
		if up, err = m.d.PublicKeys(); err != nil {
			return err
		}
	}
	k := protocol.KeyUpload{RegistrationID: up.RegistrationID, IdentityKey: up.IdentityKey.Bytes(), ReplaceAccount: replace,
		SignedPreKey:  &protocol.PreKey{ID: up.SignedPreKey.ID, Key: up.SignedPreKey.Key.Bytes(), Sig: up.SignedPreKey.Sig},
		LastResortKEM: &protocol.PreKey{ID: up.LastResortKEM.ID, Key: up.LastResortKEM.Key, Sig: up.LastResortKEM.Sig}}
	if err := m.certify(&k); err != nil {
		return err
	}
	_, err = m.c.UploadKeys(ctx, k)
	m.forget(m.self.User)
	return err
}

// KeyCounts asks the server how many one-time prekeys of this device it
// still holds (an upload with no keys). A device that was offline when a
// keys_low push went out checks this after connecting.
func (m *Messenger) KeyCounts(ctx context.Context) (protocol.KeyCounts, error) {
	return m.c.UploadKeys(ctx, protocol.KeyUpload{})
}

// Refill uploads n more one-time prekeys of each kind when the server
// holds fewer than protocol.KeysLowThreshold of either.
func (m *Messenger) Refill(ctx context.Context, n int) (protocol.KeyCounts, error) {
	c, err := m.KeyCounts(ctx)
	if err != nil || (c.PreKeys >= protocol.KeysLowThreshold && c.KEMPreKeys >= protocol.KeysLowThreshold) {
		return c, err
	}
	return m.PublishKeys(ctx, n)
}

// RotateSignedPreKey makes and uploads a new signed prekey. Maintain does
// it on a schedule, with the last-resort KEM key.
func (m *Messenger) RotateSignedPreKey(ctx context.Context) error {
	spk, err := m.d.RotateSignedPreKey()
	if err != nil {
		return err
	}
	_, err = m.c.UploadKeys(ctx, protocol.KeyUpload{SignedPreKey: &protocol.PreKey{ID: spk.ID, Key: spk.Key.Bytes(), Sig: spk.Sig}})
	return err
}

// Rotation is when Maintain replaces the device's signed prekey and
// last-resort KEM key, the two keys a bundle hands out to everyone (the
// one-time keys are used once). A replaced key's private half is kept for
// Grace, so that a first message sent on a bundle fetched before the
// rotation still opens; after, such a message fails with
// e2ee.ErrInvalidPreKey.
type Rotation struct {
	Every time.Duration // age at which a key is replaced; 0: DefaultRotation.Every
	Grace time.Duration // how long a replaced key is kept; 0: DefaultRotation.Grace
}

// DefaultRotation is Signal's schedule: its clients rotate the signed
// prekey and the last-resort Kyber key every two days
// (PreKeysSyncJob.REFRESH_INTERVAL) and delete replaced signed prekeys
// after thirty days (PreKeyUtil's archive age).
var DefaultRotation = Rotation{Every: 48 * time.Hour, Grace: 30 * 24 * time.Hour}

// SetRotation sets the rotation schedule (zero fields take
// DefaultRotation's); negative durations are an error.
func (m *Messenger) SetRotation(r Rotation) error {
	if r.Every < 0 || r.Grace < 0 {
		return fmt.Errorf("e2eechat: rotation every %v, grace %v: negative", r.Every, r.Grace)
	}
	if r.Every == 0 {
		r.Every = DefaultRotation.Every
	}
	if r.Grace == 0 {
		r.Grace = DefaultRotation.Grace
	}
	m.mu.Lock()
	m.rot = r
	m.mu.Unlock()
	return nil
}

func (m *Messenger) rotation() Rotation {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rot
}

// rotatePendingKey marks keys rotated locally whose upload has not
// succeeded yet.
const rotatePendingKey = "rotate/pending"

// Maintain keeps the device's published keys fresh: it replaces the
// signed prekey and the last-resort KEM key once older than the rotation
// interval and uploads them, then deletes the keys replaced more than the
// grace period ago (and the base keys remembered for them; see
// e2ee.Device.PruneRetiredKeys). Call it at start and then periodically
// (hourly is plenty); it is cheap when nothing is due. A failed upload is
// retried by the next call, and nothing is pruned until it succeeds.
func (m *Messenger) Maintain(ctx context.Context) error {
	r := m.rotation()
	spkDue, lrDue, err := m.d.RotationDue(r.Every)
	if err != nil {
		return err
	}
	pending, err := m.st.Load(rotatePendingKey)
	if err != nil {
		return err
	}
	if spkDue || lrDue {
		// Marked first: keys rotated here reach the server even if this
		// process stops before the upload.
		if err := m.st.Save(rotatePendingKey, []byte{1}); err != nil {
			return err
		}
		pending = []byte{1}
		if spkDue {
			if _, err := m.d.RotateSignedPreKey(); err != nil {
				return err
			}
		}
		if lrDue {
			if _, err := m.d.RotateLastResortKEM(); err != nil {
				return err
			}
		}
	}
	if pending != nil {
		spk, lr, err := m.d.CurrentPreKeys()
		if err != nil {
			return err
		}
		if _, err := m.c.UploadKeys(ctx, protocol.KeyUpload{
			SignedPreKey:  &protocol.PreKey{ID: spk.ID, Key: spk.Key.Bytes(), Sig: spk.Sig},
			LastResortKEM: &protocol.PreKey{ID: lr.ID, Key: lr.Key, Sig: lr.Sig},
		}); err != nil {
			return fmt.Errorf("e2eechat: upload rotated keys: %w", err)
		}
		if err := m.st.Delete(rotatePendingKey); err != nil {
			return err
		}
	}
	return m.d.PruneRetiredKeys(r.Grace)
}

func bundleFrom(b protocol.KeyBundle) (e2ee.Bundle, error) {
	out := e2ee.Bundle{Address: e2ee.Address{User: b.UserID, Device: b.DeviceID}, RegistrationID: b.RegistrationID}
	var err error
	if out.IdentityKey, err = e2ee.DecodePublicKey(b.IdentityKey); err != nil {
		return out, err
	}
	spk, err := e2ee.DecodePublicKey(b.SignedPreKey.Key)
	if err != nil {
		return out, err
	}
	out.SignedPreKey = e2ee.SignedPreKey{ID: b.SignedPreKey.ID, Key: spk, Sig: b.SignedPreKey.Sig}
	if b.PreKey != nil {
		k, err := e2ee.DecodePublicKey(b.PreKey.Key)
		if err != nil {
			return out, err
		}
		out.PreKey = &e2ee.PublicPreKey{ID: b.PreKey.ID, Key: k}
	}
	if b.KEMPreKey != nil {
		out.KEMPreKey = &e2ee.KEMPreKey{ID: b.KEMPreKey.ID, Key: b.KEMPreKey.Key, Sig: b.KEMPreKey.Sig}
	}
	return out, nil
}

// Devices returns the devices of user with keys (fresh from the server
// when refresh is set or nothing is cached) that are certified by the
// account key this device trusts for user (e2ee.Device.AcceptDevices): a
// device the server lists without such a certificate is left out and
// reported to OnIdentity, and so is a change of the user's account key.
// Under e2ee.TrustStrict a changed account key is an
// *e2ee.UntrustedAccountError until AcceptIdentity.
func (m *Messenger) Devices(ctx context.Context, user string, refresh bool) ([]string, error) {
	m.mu.Lock()
	ids, ok := m.devs[user]
	m.mu.Unlock()
	if ok && !refresh {
		return ids, nil
	}
	list, err := m.keyDevices(ctx, user)
	if err != nil {
		return nil, err
	}
	certs := make([]e2ee.DeviceCert, 0, len(list))
	for _, d := range list {
		c := e2ee.DeviceCert{Address: e2ee.Address{User: user, Device: d.DeviceID}, AccountKey: d.AccountKey, Sig: d.DeviceSig}
		if c.IdentityKey, err = e2ee.DecodePublicKey(d.IdentityKey); err != nil {
			c.Sig = nil // refused below
		}
		certs = append(certs, c)
	}
	chk, err := m.d.AcceptDevices(user, certs)
	m.report(user, chk)
	if err != nil {
		return nil, err
	}
	ids = make([]string, 0, len(chk.Accepted))
	for _, c := range chk.Accepted {
		ids = append(ids, c.Device)
	}
	sort.Strings(ids)
	m.mu.Lock()
	m.devs[user] = ids
	m.mu.Unlock()
	return ids, nil
}

func (m *Messenger) forget(users ...string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, u := range users {
		delete(m.devs, u)
	}
}

// ensureSession makes sure there is a session with a whose peer identity
// is the one certified for a: a session with an identity no longer
// certified (the device re-keyed, the account changed) is superseded by a
// new one from a fresh bundle, itself certified by the trusted account
// key.
func (m *Messenger) ensureSession(ctx context.Context, a e2ee.Address) error {
	if id, ok, err := m.d.SessionIdentity(a); err != nil {
		return err
	} else if ok {
		if certified, err := m.d.Certified(a, id); err != nil || certified {
			return err
		}
	}
	bs, err := m.fetchBundles(ctx, a.User, a.Device)
	if err != nil {
		return err
	}
	if len(bs) != 1 {
		return fmt.Errorf("e2eechat: no bundle for %s", a)
	}
	b, err := bundleFrom(bs[0])
	if err != nil {
		return err
	}
	cert := e2ee.DeviceCert{Address: b.Address, IdentityKey: b.IdentityKey, AccountKey: bs[0].AccountKey, Sig: bs[0].DeviceSig}
	if err := m.d.AcceptDevice(cert); errors.Is(err, e2ee.ErrBadCertificate) {
		// The user's account key not seen yet, or the device re-keyed
		// since the list was read: the whole list decides, then the
		// bundle must fit it.
		if _, err := m.Devices(ctx, a.User, true); err != nil {
			return err
		}
		if err := m.d.AcceptDevice(cert); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	return m.d.ProcessBundle(b)
}

// targets lists every device of users (this device excluded).
func (m *Messenger) targets(ctx context.Context, users []string, refresh bool) ([]e2ee.Address, error) {
	var out []e2ee.Address
	seen := map[string]bool{}
	for _, u := range users {
		if seen[u] {
			continue
		}
		seen[u] = true
		ids, err := m.Devices(ctx, u, refresh)
		if err != nil {
			return nil, err
		}
		if err := m.d.MaySend(u); err != nil {
			return nil, err
		}
		for _, d := range ids {
			a := e2ee.Address{User: u, Device: d}
			if a != m.self {
				out = append(out, a)
			}
		}
	}
	return out, nil
}

func (m *Messenger) seal(ctx context.Context, to []e2ee.Address, c content) ([]protocol.EnvelopeTo, error) {
	plain, _ := json.Marshal(c)
	out := make([]protocol.EnvelopeTo, 0, len(to))
	for _, a := range to {
		if err := m.ensureSession(ctx, a); err != nil {
			return nil, fmt.Errorf("e2eechat: session with %s: %w", a, err)
		}
		t, ct, err := m.d.Encrypt(a, plain)
		if err != nil {
			return nil, err
		}
		out = append(out, protocol.EnvelopeTo{User: a.User, Device: a.Device, Type: int(t), Body: ct})
	}
	return out, nil
}

// bind fills c's metadata for a message of kind (the frame's) in conv
// and takes the next counter, persisted before it is used: a counter is
// never sealed twice, a failed send only leaves a gap.
func (m *Messenger) bind(conv uint64, kind string, target uint64, c content) (content, error) {
	m.ctrMu.Lock()
	defer m.ctrMu.Unlock()
	key := "ctr/" + groupName(conv)
	var n uint64
	if b, err := m.st.Load(key); err != nil {
		return c, err
	} else if b != nil {
		if n, err = strconv.ParseUint(string(b), 10, 64); err != nil {
			return c, fmt.Errorf("e2eechat: counter of conv %d: %w", conv, err)
		}
	}
	n++
	if err := m.st.Save(key, []byte(strconv.FormatUint(n, 10))); err != nil {
		return c, err
	}
	c.Conv, c.Kind, c.Target, c.From, c.Dev, c.Ctr = conv, kind, target, m.self.User, m.self.Device, n
	if m.ktHead != nil {
		c.KT = m.ktHead()
	}
	return c, nil
}

// frameKind is the kind the server gives the message f stores.
func frameKind(f protocol.Frame) string {
	switch {
	case f.Type == protocol.TypeEdit:
		return protocol.KindEdit
	case f.Type == protocol.TypeRecall:
		return protocol.KindRecall
	case f.Kind == "":
		return protocol.KindText
	}
	return f.Kind
}

// keptKey is the record of message seq this device opened or sent.
func keptKey(conv, seq uint64) string {
	return "kept/" + strconv.FormatUint(conv, 10) + "/" + strconv.FormatUint(seq, 10)
}

// plainKey is where a store written before the records kept a message's
// text alone, with no labels.
func plainKey(conv, seq uint64) string {
	return "plain/" + strconv.FormatUint(conv, 10) + "/" + strconv.FormatUint(seq, 10)
}

// loadKept is the record of message seq, or one made from the text an
// older store kept (Legacy, no labels); nil if neither.
func (m *Messenger) loadKept(conv, seq uint64) (*kept, error) {
	b, err := m.st.Load(keptKey(conv, seq))
	if err != nil {
		return nil, err
	}
	if b == nil {
		t, err := m.st.Load(plainKey(conv, seq))
		if err != nil || t == nil {
			return nil, err
		}
		return &kept{Text: string(t), Legacy: true}, nil
	}
	var k kept
	if err := json.Unmarshal(b, &k); err != nil {
		return nil, fmt.Errorf("e2eechat: record of conv %d seq %d: %w", conv, seq, err)
	}
	return &k, nil
}

// saveKept writes the record of message seq (replacing an older store's
// text, which search would find twice).
func (m *Messenger) saveKept(conv, seq uint64, k *kept) error {
	b, _ := json.Marshal(k)
	if err := m.st.Save(keptKey(conv, seq), b); err != nil {
		return err
	}
	if k.Legacy {
		k.Legacy = false
		return m.st.Delete(plainKey(conv, seq))
	}
	return nil
}

// editKept applies an authenticated edit by author to the record of
// target. A target never opened here is recorded as the author's: the
// server cannot later show its text as someone else's.
func (m *Messenger) editKept(conv, target uint64, author, text string) error {
	k, err := m.loadKept(conv, target)
	switch {
	case err != nil:
		return err
	case k == nil:
		k = &kept{From: author, Kind: protocol.KindText}
	case k.Recalled:
		return nil // a recalled message stays recalled
	}
	k.Text = text
	return m.saveKept(conv, target, k)
}

// recall applies an authenticated recall of target by author: its text is
// dropped (search no longer finds it) and later openings say Recalled.
func (m *Messenger) recall(conv, target uint64, author string) error {
	k, err := m.loadKept(conv, target)
	if err != nil {
		return err
	}
	if k == nil {
		k = &kept{From: author, Kind: protocol.KindText}
	}
	k.Text, k.File, k.Recalled = "", nil, true
	return m.saveKept(conv, target, k)
}

// SendDirect encrypts text to every device of peer and to this user's
// other devices and stores it in direct conversation convID. The device
// lists are read fresh, so a device added since the last message gets it.
func (m *Messenger) SendDirect(ctx context.Context, convID uint64, peer, text string) (client.Ack, error) {
	return m.direct(ctx, protocol.Frame{Type: protocol.TypeSend, ConvID: convID, Kind: protocol.KindText}, peer, text)
}

// EditDirect replaces message target of a direct conversation with text
// (a new ciphertext).
func (m *Messenger) EditDirect(ctx context.Context, convID, target uint64, peer, text string) (client.Ack, error) {
	return m.direct(ctx, protocol.Frame{Type: protocol.TypeEdit, ConvID: convID, TargetSeq: target}, peer, text)
}

// RecallDirect recalls message target of a direct conversation with an
// envelope sealed to every device of peer and of this user: receivers
// apply a recall only when its author sealed it.
func (m *Messenger) RecallDirect(ctx context.Context, convID, target uint64, peer string) (client.Ack, error) {
	return m.direct(ctx, protocol.Frame{Type: protocol.TypeRecall, ConvID: convID, TargetSeq: target}, peer, "")
}

func (m *Messenger) direct(ctx context.Context, f protocol.Frame, peer, text string) (client.Ack, error) {
	to, err := m.targets(ctx, []string{peer, m.self.User}, true)
	if err != nil {
		return client.Ack{}, err
	}
	if len(to) == 0 {
		return client.Ack{}, fmt.Errorf("e2eechat: %s has no device with keys", peer)
	}
	c := content{T: "text", Text: text}
	if f.Type == protocol.TypeRecall {
		c = content{T: "recall"}
	}
	if c, err = m.bind(f.ConvID, frameKind(f), f.TargetSeq, c); err != nil {
		return client.Ack{}, err
	}
	env, err := m.seal(ctx, to, c)
	if err != nil {
		return client.Ack{}, err
	}
	f.Body = protocol.EncodeEnvelope(protocol.Envelope{To: env})
	return m.sendOwn(ctx, f, c)
}

func groupName(conv uint64) string { return strconv.FormatUint(conv, 10) }

func ownKey(conv uint64, clientMsgID string) string {
	return "own/" + strconv.FormatUint(conv, 10) + "/" + clientMsgID
}

// sent is what a device keeps of a message it sends, under its
// client_msg_id: the content as sealed and, once acknowledged, its seq.
type sent struct {
	Content content `json:"content"`
	Seq     uint64  `json:"seq,omitempty"`
}

// sendOwn sends f, keeping its content c under its client_msg_id first:
// the echo push of this device's own message may arrive before the ack,
// and a sender cannot decrypt its own ciphertext. Once acknowledged, the
// message is recorded under its seq too (and an edit applied to its
// target's record), and a recall is applied here.
func (m *Messenger) sendOwn(ctx context.Context, f protocol.Frame, c content) (client.Ack, error) {
	if f.ClientMsgID == "" {
		f.ClientMsgID = client.NewClientMsgID()
	}
	key := "sent/" + ownKey(f.ConvID, f.ClientMsgID)
	rec := sent{Content: c}
	b, _ := json.Marshal(rec)
	if err := m.st.Save(key, b); err != nil {
		return client.Ack{}, err
	}
	ack, err := m.c.SendFrame(ctx, f)
	if err != nil {
		return ack, err
	}
	rec.Seq = ack.Seq
	b, _ = json.Marshal(rec)
	if err := m.st.Save(key, b); err != nil {
		return ack, err
	}
	if c.Kind == protocol.KindRecall {
		return ack, m.recall(f.ConvID, f.TargetSeq, c.From)
	}
	if err := m.saveKept(f.ConvID, ack.Seq, &kept{From: c.From, Dev: c.Dev, Kind: c.Kind, Target: c.Target, Text: c.shown(), File: c.File}); err != nil {
		return ack, err
	}
	if c.Kind == protocol.KindEdit {
		err = m.editKept(f.ConvID, f.TargetSeq, c.From, c.Text)
	}
	return ack, err
}

// distKey records which devices have this device's current sender key,
// one line per device: its address, a space and the identity key (hex) of
// the session the key was sealed on. A device reinstalled under the same
// id has a new identity, so it is not taken for one that has the key.
func distKey(conv uint64, chain uint32) string {
	return "skdist/" + groupName(conv) + "/" + strconv.FormatUint(uint64(chain), 10)
}

// distribute sends this device's sender key to the member devices that do
// not have it yet, over pairwise sessions, in envelopes stored in the
// group itself (so they come before the messages that need them).
func (m *Messenger) distribute(ctx context.Context, conv uint64, members []string, refresh bool) error {
	skdm, err := m.d.GroupDistribution(groupName(conv), e2ee.FormatModern)
	if err != nil {
		return err
	}
	parsed, err := e2ee.ParseSenderKeyDistributionMessage(skdm, e2ee.FormatModern)
	if err != nil {
		return err
	}
	have := map[string]string{} // address → identity key the sender key went to
	if b, err := m.st.Load(distKey(conv, parsed.ChainID)); err != nil {
		return err
	} else if b != nil {
		for _, line := range strings.Split(string(b), "\n") {
			a, id, _ := strings.Cut(line, " ")
			have[a] = id
		}
	}
	to, err := m.targets(ctx, members, refresh)
	if err != nil {
		return err
	}
	var missing []e2ee.Address
	sealedTo := map[e2ee.Address]string{}
	for _, a := range to {
		if err := m.ensureSession(ctx, a); err != nil {
			return fmt.Errorf("e2eechat: session with %s: %w", a, err)
		}
		id, ok, err := m.d.SessionIdentity(a)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("e2eechat: session with %s: %w", a, e2ee.ErrNoSession)
		}
		if hexID := hex.EncodeToString(id.Bytes()); have[a.String()] != hexID {
			missing = append(missing, a)
			sealedTo[a] = hexID
		}
	}
	for len(missing) > 0 {
		var batch []protocol.EnvelopeTo
		size := 0
		for len(missing) > 0 && size < envelopeBudget && len(batch) < protocol.MaxEnvelopeTo {
			c, err := m.bind(conv, protocol.KindText, 0, content{T: "skdm", SKDM: skdm})
			if err != nil {
				return err
			}
			env, err := m.seal(ctx, missing[:1], c)
			if err != nil {
				return err
			}
			batch = append(batch, env...)
			size += len(env[0].Body)*4/3 + 64
			have[missing[0].String()] = sealedTo[missing[0]]
			missing = missing[1:]
		}
		body := protocol.EncodeEnvelope(protocol.Envelope{To: batch})
		cmid := client.NewClientMsgID()
		if err := m.st.Save("ownctl/"+ownKey(conv, cmid), []byte{1}); err != nil {
			return err
		}
		if _, err := m.c.SendFrame(ctx, protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: cmid, Kind: protocol.KindText, Body: body}); err != nil {
			return err
		}
		lines := make([]string, 0, len(have))
		for a, id := range have {
			lines = append(lines, a+" "+id)
		}
		sort.Strings(lines)
		if err := m.st.Save(distKey(conv, parsed.ChainID), []byte(strings.Join(lines, "\n"))); err != nil {
			return err
		}
	}
	return nil
}

// SendGroup sends text to E2E group convID with members (user ids, this
// user included for its other devices): one Sender Key ciphertext for
// everyone, after distributing the sender key to devices that lack it.
func (m *Messenger) SendGroup(ctx context.Context, convID uint64, members []string, text string) (client.Ack, error) {
	return m.group(ctx, protocol.Frame{Type: protocol.TypeSend, ConvID: convID, Kind: protocol.KindText}, members, text)
}

// EditGroup replaces message target of a group with text.
func (m *Messenger) EditGroup(ctx context.Context, convID, target uint64, members []string, text string) (client.Ack, error) {
	return m.group(ctx, protocol.Frame{Type: protocol.TypeEdit, ConvID: convID, TargetSeq: target}, members, text)
}

// RecallGroup recalls message target of a group with a Sender Key
// envelope: receivers apply a recall only when its author sealed it.
func (m *Messenger) RecallGroup(ctx context.Context, convID, target uint64, members []string) (client.Ack, error) {
	return m.group(ctx, protocol.Frame{Type: protocol.TypeRecall, ConvID: convID, TargetSeq: target}, members, "")
}

func (m *Messenger) group(ctx context.Context, f protocol.Frame, members []string, text string) (client.Ack, error) {
	c := content{T: "text", Text: text}
	if f.Type == protocol.TypeRecall {
		c = content{T: "recall"}
	}
	body, c, err := m.groupEnvelope(ctx, f.ConvID, members, frameKind(f), f.TargetSeq, c)
	if err != nil {
		return client.Ack{}, err
	}
	f.Body = body
	return m.sendOwn(ctx, f, c)
}

// groupEnvelope binds c to a message of kind in group conv and seals it
// under this device's sender key, after distributing the key to the
// member devices that lack it.
func (m *Messenger) groupEnvelope(ctx context.Context, conv uint64, members []string, kind string, target uint64, c content) (string, content, error) {
	if err := m.distribute(ctx, conv, append(members, m.self.User), false); err != nil {
		return "", c, err
	}
	c, err := m.bind(conv, kind, target, c)
	if err != nil {
		return "", c, err
	}
	plain, _ := json.Marshal(c)
	ct, err := m.d.GroupEncrypt(groupName(conv), plain, e2ee.FormatModern)
	if err != nil {
		return "", c, err
	}
	return protocol.EncodeEnvelope(protocol.Envelope{Group: ct}), c, nil
}

// RotateGroup drops this device's sender key of convID: the next
// SendGroup distributes a new one to the members of that moment. Open
// calls it when a member leaves or is removed.
func (m *Messenger) RotateGroup(convID uint64) error {
	keys, err := m.st.List("skdist/" + groupName(convID) + "/")
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := m.st.Delete(k); err != nil {
			return err
		}
	}
	return m.d.RotateGroup(groupName(convID))
}

// Open decrypts a message of an E2E conversation (a push, a sync or a
// history entry). Opening the same message again returns the kept copy.
//
// The labels the server gives the message (conversation, kind, target,
// sender user and device, seq) are checked against those its author
// sealed inside the encryption, and an edit or recall must come from the
// author of its target: a mismatch is a *MetadataError
// (ErrMetadataMismatch), a content without sealed labels ErrUnbound, a
// recall without the author's envelope ErrUnauthenticatedRecall. A
// ciphertext opened once is never decrypted again: its content is kept
// and checked against each new delivery, so the same content under
// another seq is refused too. The errors of e2ee pass through for
// errors.Is: a replayed first message is e2ee.ErrReusedBaseKey, a classic
// X3DH one for a new session e2ee.ErrDowngrade (sending to a device whose
// bundle lacks a KEM prekey fails with it too). A first message from an
// identity key the sender's account key did not certify is
// ErrUncertified. System events about devices (device_added,
// device_removed, identity_changed) only make the next send read the
// device list again: they reset no session and change no trust.
func (m *Messenger) Open(msg protocol.Message) (Opened, error) {
	m.openMu.Lock()
	defer m.openMu.Unlock()
	o := Opened{ConvID: msg.ConvID, Seq: msg.Seq, Sender: msg.Sender, SenderDevice: msg.SenderDevice, Kind: msg.Kind, TargetSeq: msg.TargetSeq}
	if msg.Kind == protocol.KindSystem {
		return m.openSystem(msg, o)
	}
	k, err := m.loadKept(msg.ConvID, msg.Seq) // an edited target's record follows its edits
	switch {
	case err != nil:
		return o, err
	case msg.Recalled:
		return m.openRecalled(msg, o, k)
	case k != nil:
		if err := checkKept(msg, k); err != nil {
			return o, err
		}
		o.Text, o.File, o.Recalled = k.Text, k.File, k.Recalled
		return o, nil
	}
	if b, err := m.st.Load("ctl/" + plainKey(msg.ConvID, msg.Seq)); err != nil {
		return o, err
	} else if b != nil {
		o.Control = true
		return o, nil
	}
	if msg.Sender == m.self.User && msg.SenderDevice == m.self.Device {
		return m.openOwn(msg, o)
	}
	if msg.Body == "" && msg.Kind == protocol.KindRecall {
		return o, ErrUnauthenticatedRecall
	}
	sender := e2ee.Address{User: msg.Sender, Device: msg.SenderDevice}
	c, err := m.decrypt(msg, sender)
	if err != nil {
		return o, err
	}
	if err := m.verify(msg, c); err != nil {
		if errors.Is(err, ErrUnbound) && c.T == "text" && msg.Kind == protocol.KindText && !msg.Edited {
			o.Text = c.Text
		}
		return o, err
	}
	if m.ktCheck != nil {
		if err := m.ktCheck(sender, c.KT); err != nil {
			return o, err
		}
	}
	return m.apply(msg, c, o)
}

func (m *Messenger) openSystem(msg protocol.Message, o Opened) (Opened, error) {
	var ev protocol.SystemEvent
	if err := json.Unmarshal([]byte(msg.Body), &ev); err != nil {
		return o, err
	}
	o.System = &ev
	switch ev.Event {
	case "device_added", "device_removed", "identity_changed":
		// The server's word only: the device list is read again at the
		// next send and checked against the account key; sessions and
		// trust stay as they are (ensureSession replaces a session whose
		// identity is no longer certified).
		m.forget(ev.Users...)
	case "member_removed", "member_left":
		if err := m.RotateGroup(msg.ConvID); err != nil {
			return o, err
		}
	}
	return o, nil
}

// openRecalled opens a message the server shows recalled (k is this
// device's record of it): Recalled if its author's recall was applied
// here, else the kept text (the server's flag alone recalls nothing; with
// nothing kept there is nothing to show).
func (m *Messenger) openRecalled(msg protocol.Message, o Opened, k *kept) (Opened, error) {
	if k == nil {
		return o, nil
	}
	if err := checkKept(msg, k); err != nil {
		return o, err
	}
	o.Text, o.File, o.Recalled = k.Text, k.File, k.Recalled
	return o, nil
}

// checkKept compares msg's labels with k, the record of the message this
// device opened at its seq.
func checkKept(msg protocol.Message, k *kept) error {
	bad := func(field, server, sealed string) error {
		return &MetadataError{ConvID: msg.ConvID, Seq: msg.Seq, Field: field, Server: server, Sealed: sealed}
	}
	switch {
	case k.From != "" && k.From != msg.Sender:
		return bad("from", msg.Sender, k.From)
	case k.Dev != "" && k.Dev != msg.SenderDevice:
		return bad("dev", msg.SenderDevice, k.Dev)
	case k.Kind != "" && k.Kind != msg.Kind:
		return bad("kind", msg.Kind, k.Kind)
	case k.Kind != "" && k.Target != msg.TargetSeq:
		return bad("target", seqString(msg.TargetSeq), seqString(k.Target))
	case k.File != nil && !msg.Recalled && msg.AttachmentID != k.File.AttachmentID:
		return bad("attachment", seqString(msg.AttachmentID), seqString(k.File.AttachmentID))
	}
	return nil
}

func seqString(seq uint64) string { return strconv.FormatUint(seq, 10) }

// openOwn opens a message this device sent, from the content it kept
// under the message's client_msg_id.
func (m *Messenger) openOwn(msg protocol.Message, o Opened) (Opened, error) {
	own := ownKey(msg.ConvID, msg.ClientMsgID)
	if b, err := m.st.Load("ownctl/" + own); err != nil {
		return o, err
	} else if b != nil {
		o.Control = true
		return o, nil
	}
	bad := func(field, server, sealed string) error {
		return &MetadataError{ConvID: msg.ConvID, Seq: msg.Seq, Field: field, Server: server, Sealed: sealed}
	}
	var rec sent
	if b, err := m.st.Load("sent/" + own); err != nil {
		return o, err
	} else if b != nil {
		if err := json.Unmarshal(b, &rec); err != nil {
			return o, fmt.Errorf("e2eechat: own content: %w", err)
		}
	} else if b, err := m.st.Load(own); err != nil { // an older store: the text alone
		return o, err
	} else if b != nil {
		rec.Content = content{T: "text", Text: string(b), Kind: msg.Kind, Target: msg.TargetSeq}
	} else if msg.Kind == protocol.KindRecall {
		return o, ErrUnauthenticatedRecall
	} else {
		return o, ErrOwnUnknown
	}
	c := rec.Content
	switch {
	case c.Kind != msg.Kind:
		return o, bad("kind", msg.Kind, c.Kind)
	case c.Target != msg.TargetSeq:
		return o, bad("target", seqString(msg.TargetSeq), seqString(c.Target))
	case rec.Seq != 0 && rec.Seq != msg.Seq:
		return o, bad("seq", seqString(msg.Seq), seqString(rec.Seq))
	case c.File != nil && c.File.AttachmentID != msg.AttachmentID:
		return o, bad("attachment", seqString(msg.AttachmentID), seqString(c.File.AttachmentID))
	case msg.Kind == protocol.KindRecall:
		return o, nil // applied when it was sent
	}
	o.Text, o.File = c.shown(), c.File
	return o, m.saveKept(msg.ConvID, msg.Seq, &kept{From: msg.Sender, Dev: msg.SenderDevice, Kind: msg.Kind, Target: msg.TargetSeq, Text: c.shown(), File: c.File})
}

// openedCT is what Open keeps of a ciphertext it decrypted, under the
// ciphertext's hash: its content, and the seq it was accepted under.
type openedCT struct {
	Content json.RawMessage `json:"content"`
	Seq     uint64          `json:"seq,omitempty"`
}

// decrypted is a content and where Open keeps it.
type decrypted struct {
	content
	key   string
	rec   openedCT
	saved bool // rec is stored as it is
}

// decrypt returns the content of msg's ciphertext for this device. A
// ciphertext is decrypted once (a second decryption fails: its message key
// is gone): Open keeps its content under its hash (see accept), so an
// edited target that carries its edit's envelope, and a replay, are
// checked like any delivery.
func (m *Messenger) decrypt(msg protocol.Message, sender e2ee.Address) (decrypted, error) {
	var d decrypted
	env, err := protocol.ParseEnvelope(msg.Body)
	if err != nil {
		return d, err
	}
	ct, typ := env.Group, -1
	if len(ct) == 0 {
		for _, t := range env.To {
			if t.User == m.self.User && t.Device == m.self.Device {
				ct, typ = t.Body, t.Type
				break
			}
		}
		if ct == nil {
			return d, ErrNotForDevice
		}
	}
	sum := sha256.Sum256(ct)
	d.key = "ct/" + hex.EncodeToString(sum[:])
	if b, err := m.st.Load(d.key); err != nil {
		return d, err
	} else if b != nil {
		if err := json.Unmarshal(b, &d.rec); err != nil {
			return d, fmt.Errorf("e2eechat: kept content: %w", err)
		}
		d.saved = true
	} else {
		var plain []byte
		if typ < 0 {
			plain, err = m.d.GroupDecrypt(groupName(msg.ConvID), sender, ct, e2ee.FormatModern)
		} else {
			if e2ee.MessageType(typ) == e2ee.TypePreKey {
				if err := m.certifiedSender(sender, ct); err != nil {
					return d, err
				}
			}
			plain, err = m.d.Decrypt(sender, e2ee.MessageType(typ), ct)
		}
		if err != nil {
			return d, err
		}
		if !json.Valid(plain) {
			return d, errors.New("e2eechat: content is not JSON")
		}
		d.rec.Content = plain
	}
	if err := json.Unmarshal(d.rec.Content, &d.content); err != nil {
		return d, fmt.Errorf("e2eechat: content: %w", err)
	}
	return d, nil
}

// rewritten reports whether msg is an edited target shown with the
// envelope of its edit c (the server rewrites the target with the edit's
// body): c's labels are the edit event's, checked against the target.
func rewritten(msg protocol.Message, c content) bool {
	return msg.Edited && msg.Kind == protocol.KindText && c.Kind == protocol.KindEdit && c.Target == msg.Seq
}

// verify checks the server's labels of msg against its content d and
// keeps d (refused or not: its message key is spent), with msg's seq once
// accepted.
func (m *Messenger) verify(msg protocol.Message, d decrypted) error {
	err := m.check(msg, d.content, d.rec.Seq)
	if err == nil && d.rec.Seq == 0 && !rewritten(msg, d.content) {
		d.rec.Seq, d.saved = msg.Seq, false
	}
	if !d.saved {
		b, _ := json.Marshal(d.rec)
		if serr := m.st.Save(d.key, b); serr != nil && err == nil {
			err = serr
		}
	}
	return err
}

// check compares the server's labels of msg with content c, first
// accepted under seq first (0: not yet).
func (m *Messenger) check(msg protocol.Message, c content, first uint64) error {
	if c.Ctr == 0 || c.Kind == "" {
		return ErrUnbound
	}
	bad := func(field, server, sealed string) error {
		return &MetadataError{ConvID: msg.ConvID, Seq: msg.Seq, Field: field, Server: server, Sealed: sealed}
	}
	rw := rewritten(msg, c)
	switch {
	case c.Conv != msg.ConvID:
		return bad("conv", seqString(msg.ConvID), seqString(c.Conv))
	case c.From != msg.Sender:
		return bad("from", msg.Sender, c.From)
	case rw:
		// The target's labels are its first version's: its sender device
		// may differ from the edit's.
	case c.Dev != msg.SenderDevice:
		return bad("dev", msg.SenderDevice, c.Dev)
	case c.Kind != msg.Kind:
		return bad("kind", msg.Kind, c.Kind)
	case c.Target != msg.TargetSeq:
		return bad("target", seqString(msg.TargetSeq), seqString(c.Target))
	case first != 0 && first != msg.Seq:
		return bad("seq", seqString(msg.Seq), seqString(first))
	}
	switch {
	case c.T == "text" && (c.Kind == protocol.KindText || c.Kind == protocol.KindState || c.Kind == protocol.KindEdit) && (c.Kind == protocol.KindEdit) == (c.Target != 0):
	case c.T == "skdm" && c.Kind == protocol.KindText && c.Target == 0:
	case c.T == "recall" && c.Kind == protocol.KindRecall && c.Target != 0:
	case c.T == "file" && c.Kind == protocol.KindFile && c.Target == 0:
		if err := c.File.valid(); err != nil {
			return err
		}
		if c.File.AttachmentID != msg.AttachmentID {
			return bad("attachment", seqString(msg.AttachmentID), seqString(c.File.AttachmentID))
		}
	default:
		return fmt.Errorf("e2eechat: content %q sealed as kind %q, target %d", c.T, c.Kind, c.Target)
	}
	if c.Target != 0 {
		k, err := m.loadKept(msg.ConvID, c.Target)
		if err != nil {
			return err
		}
		if k != nil && k.From != "" && k.From != c.From {
			return bad("author", k.From, c.From)
		}
	}
	return nil
}

// apply acts on a verified content: records a text (an edit's in its
// target's record too), processes a sender key distribution, applies a
// recall.
func (m *Messenger) apply(msg protocol.Message, d decrypted, o Opened) (Opened, error) {
	c := d.content
	switch c.T {
	case "skdm":
		sender := e2ee.Address{User: msg.Sender, Device: msg.SenderDevice}
		if err := m.d.ProcessGroupDistribution(groupName(msg.ConvID), sender, c.SKDM, e2ee.FormatModern); err != nil {
			return o, err
		}
		o.Control = true
		return o, m.st.Save("ctl/"+plainKey(msg.ConvID, msg.Seq), []byte{1})
	case "recall":
		return o, m.recall(msg.ConvID, c.Target, c.From)
	case "file":
		o.Text, o.File = c.File.Caption, c.File
		return o, m.saveKept(msg.ConvID, msg.Seq, &kept{From: c.From, Dev: c.Dev, Kind: c.Kind, Text: c.File.Caption, File: c.File})
	}
	o.Text = c.Text
	if rewritten(msg, c) {
		// Only the author is verified: the first version's device is not.
		return o, m.saveKept(msg.ConvID, msg.Seq, &kept{From: c.From, Kind: protocol.KindText, Text: c.Text})
	}
	if err := m.saveKept(msg.ConvID, msg.Seq, &kept{From: c.From, Dev: c.Dev, Kind: c.Kind, Target: c.Target, Text: c.Text}); err != nil {
		return o, err
	}
	if c.Kind != protocol.KindEdit {
		return o, nil
	}
	return o, m.editKept(msg.ConvID, c.Target, c.From, c.Text)
}

// Hit is one local search result.
type Hit struct {
	ConvID uint64
	Seq    uint64
	Text   string
}

// Search looks through the messages this device has decrypted or sent
// (case-insensitive substring): the server of an E2E conversation cannot.
func (m *Messenger) Search(query string) ([]Hit, error) {
	q := strings.ToLower(query)
	var out []Hit
	for _, prefix := range []string{"kept/", "plain/"} {
		keys, err := m.st.List(prefix)
		if err != nil {
			return nil, err
		}
		for _, key := range keys {
			b, err := m.st.Load(key)
			if err != nil {
				return nil, err
			}
			text := string(b)
			if prefix == "kept/" {
				var k kept
				if err := json.Unmarshal(b, &k); err != nil {
					return nil, fmt.Errorf("e2eechat: record %s: %w", key, err)
				}
				text = k.Text
			}
			if !strings.Contains(strings.ToLower(text), q) {
				continue
			}
			parts := strings.Split(key, "/")
			conv, _ := strconv.ParseUint(parts[1], 10, 64)
			seq, _ := strconv.ParseUint(parts[2], 10, 64)
			out = append(out, Hit{ConvID: conv, Seq: seq, Text: text})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].ConvID != out[j].ConvID {
			return out[i].ConvID < out[j].ConvID
		}
		return out[i].Seq < out[j].Seq
	})
	return out, nil
}

// Send sends text to E2E conversation convID, reading its kind and members
// from the server (conv_info): SendDirect for a direct conversation,
// SendGroup for a group (at most 1,000 members are listed; larger groups
// need SendGroup with the member list).
func (m *Messenger) Send(ctx context.Context, convID uint64, text string) (client.Ack, error) {
	peer, members, err := m.route(ctx, convID)
	if err != nil {
		return client.Ack{}, err
	}
	if peer != "" {
		return m.SendDirect(ctx, convID, peer, text)
	}
	return m.SendGroup(ctx, convID, members, text)
}

// Reply sends text to E2E conversation convID as Send does, answering
// message replyTo: the reference travels beside the envelope (reply_to),
// as the server needs it to check that the sender may see that message.
func (m *Messenger) Reply(ctx context.Context, convID, replyTo uint64, text string) (client.Ack, error) {
	peer, members, err := m.route(ctx, convID)
	if err != nil {
		return client.Ack{}, err
	}
	f := protocol.Frame{Type: protocol.TypeSend, ConvID: convID, Kind: protocol.KindText, ReplyTo: replyTo}
	if peer != "" {
		return m.direct(ctx, f, peer, text)
	}
	return m.group(ctx, f, members, text)
}

// Edit replaces message target of E2E conversation convID with text as
// Send sends: EditDirect or EditGroup after reading the conversation.
func (m *Messenger) Edit(ctx context.Context, convID, target uint64, text string) (client.Ack, error) {
	peer, members, err := m.route(ctx, convID)
	if err != nil {
		return client.Ack{}, err
	}
	if peer != "" {
		return m.EditDirect(ctx, convID, target, peer, text)
	}
	return m.EditGroup(ctx, convID, target, members, text)
}

// Recall recalls message target of E2E conversation convID as Send
// sends: RecallDirect or RecallGroup after reading the conversation.
func (m *Messenger) Recall(ctx context.Context, convID, target uint64) (client.Ack, error) {
	peer, members, err := m.route(ctx, convID)
	if err != nil {
		return client.Ack{}, err
	}
	if peer != "" {
		return m.RecallDirect(ctx, convID, target, peer)
	}
	return m.RecallGroup(ctx, convID, target, members)
}

// route reads E2E conversation convID: the peer of a direct one, or the
// members of a group.
func (m *Messenger) route(ctx context.Context, convID uint64) (peer string, members []string, err error) {
	info, err := m.c.ConvInfo(ctx, convID)
	if err != nil {
		return "", nil, err
	}
	if !info.E2E {
		return "", nil, fmt.Errorf("e2eechat: conversation %d is not end-to-end encrypted", convID)
	}
	if info.Kind == protocol.ConvDirect {
		for _, u := range info.Members {
			if u != m.self.User {
				return u, nil, nil
			}
		}
		return "", nil, fmt.Errorf("e2eechat: direct conversation %d has no peer", convID)
	}
	if info.MemberCount > len(info.Members) {
		return "", nil, fmt.Errorf("e2eechat: group %d has %d members, more than conv_info lists: use SendGroup", convID, info.MemberCount)
	}
	return "", info.Members, nil
}
