package e2eechat

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/mod/sumdb/note"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/protocol"
	"github.com/parley-im/parley/protocol/kt"
)

// Key transparency on the client (docs/protocol.md, "Key transparency"):
// the server's log keys are pinned on first use; every bundles and devices
// answer must come with the asked user's entry, proven in a signed
// checkpoint, and list only devices of that entry; every checkpoint must
// extend the last one this device accepted; the checkpoint a sender
// sealed into a message must be consistent with this device's own (one
// log shown to both); MonitorKeys reads the whole log for the entries
// under this user's own label (kt_monitor.go).

// Errors of key transparency. Each is also reported to OnKT.
var (
	// ErrKTProof: an answer's key transparency proof is missing or does
	// not verify (checkpoint signature, VRF label, inclusion), or lists a
	// device that is not in the user's logged entry as it is, or gives an
	// older entry of the user than one already seen.
	ErrKTProof = errors.New("e2eechat: key transparency: the server's proof does not verify")
	// ErrKTFork: the server showed a checkpoint that does not extend the
	// one this device accepted before (a forked or rolled-back log), or a
	// sender's client was shown a log this device's checkpoint is not
	// consistent with (a split view). errors.Is also matches kt.ErrFork or
	// kt.ErrRollback when a proof was refused.
	ErrKTFork = errors.New("e2eechat: key transparency: the server showed a forked or rolled-back log")
	// ErrKTGhost: the log holds an entry under this user's own label whose
	// account key is not this account's or whose device certificates do
	// not verify with it (MonitorKeys).
	ErrKTGhost = errors.New("e2eechat: key transparency: the server published a key or device for you that you did not create")
	// ErrKTUnavailable: the server keeps no key transparency log and none
	// was pinned (MonitorKeys, and every answer under RequireKT).
	ErrKTUnavailable = errors.New("e2eechat: key transparency: the server keeps no log")
)

// KTEvent reports a key transparency failure: an answer, or the
// checkpoint inside a message, this device refused, or an entry for this
// user that MonitorKeys found.
type KTEvent struct {
	User string // whose keys were checked, who sent the message, or this user (MonitorKeys)
	Err  error  // wraps ErrKTProof, ErrKTFork or ErrKTGhost
}

// ktGossipTimeout bounds the proof requests Open makes for a gossiped
// checkpoint new to this device: Open takes no context, and other Opens
// wait for it.
const ktGossipTimeout = 10 * time.Second

// ktSeenMax bounds the gossiped checkpoints remembered as proven.
const ktSeenMax = 1024

// Store keys of the key transparency state.
const (
	ktKeysKey    = "kt/keys" // the pinned kt_keys answer (JSON)
	ktHeadKey    = "kt/head" // the latest accepted checkpoint, as signed
	ktVersionPfx = "kt/version/"
	ktMonitorKey = "kt/monitor" // MonitorKeys' position (JSON ktMonitor)
)

// ktState is a Messenger's key transparency state.
type ktState struct {
	// mu serializes loading, pinning and advancing the head; it is held
	// across the proof requests so two answers never advance at once.
	mu      sync.Mutex
	loaded  bool
	keys    *ktKeys // nil until pinned
	off     bool    // the server said it keeps no log and nothing is pinned
	require bool

	// head is the latest accepted checkpoint (read without mu by the
	// content hook).
	head    atomic.Pointer[kt.Checkpoint]
	onEvent atomic.Pointer[func(KTEvent)]

	seenMu sync.Mutex
	seen   map[kt.Checkpoint]bool // gossiped checkpoints proven consistent with head

	// monMu serializes MonitorKeys.
	monMu sync.Mutex

	// Verified once, under mu: the last checkpoint text opened, and each
	// user's label with the (deterministic) VRF proof that gave it.
	lastText string
	last     kt.Checkpoint
	labels   map[string]ktLabel
}

type ktLabel struct {
	proof []byte
	label [32]byte
}

// ktLabelsMax bounds the users whose VRF proof is remembered as verified.
const ktLabelsMax = 10_000

// ktOpen opens a signed checkpoint (a text opened before is not verified
// again); m.kt.mu is held.
func (m *Messenger) ktOpen(keys *ktKeys, text string) (kt.Checkpoint, error) {
	if text == m.kt.lastText && text != "" {
		return m.kt.last, nil
	}
	c, err := kt.OpenCheckpoint(keys.verifier, []byte(text))
	if err != nil {
		return c, err
	}
	m.kt.lastText, m.kt.last = text, c
	return c, nil
}

// ktLabel checks user's VRF proof (one verified before for the user is not
// verified again); m.kt.mu is held.
func (m *Messenger) ktLabel(keys *ktKeys, user string, proof []byte) ([32]byte, error) {
	if l, ok := m.kt.labels[user]; ok && bytes.Equal(l.proof, proof) {
		return l.label, nil
	}
	label, err := keys.vrf.VerifyLabel(user, proof)
	if err != nil {
		return label, err
	}
	if m.kt.labels == nil || len(m.kt.labels) >= ktLabelsMax {
		m.kt.labels = map[string]ktLabel{}
	}
	m.kt.labels[user] = ktLabel{proof: bytes.Clone(proof), label: label}
	return label, nil
}

type ktKeys struct {
	origin   string
	verifier note.Verifier
	vrf      kt.VRFPublicKey
}

// OnKT sets the function told of every key transparency failure (called
// synchronously, from the goroutine that made the check).
func (m *Messenger) OnKT(f func(KTEvent)) {
	if f == nil {
		m.kt.onEvent.Store(nil)
		return
	}
	m.kt.onEvent.Store(&f)
}

// RequireKT makes a server without a key transparency log an error
// (ErrKTUnavailable) for every bundles and devices answer. Off (the
// default), such a server is used unverified as long as no log keys were
// ever pinned; once pinned, answers without proofs are always refused.
func (m *Messenger) RequireKT(on bool) {
	m.kt.mu.Lock()
	m.kt.require = on
	m.kt.mu.Unlock()
}

// KTCheckpoint returns the latest checkpoint this device accepted.
func (m *Messenger) KTCheckpoint() (kt.Checkpoint, bool) {
	h := m.kt.head.Load()
	if h == nil {
		return kt.Checkpoint{}, false
	}
	return *h, true
}

func (m *Messenger) ktReport(user string, err error) {
	if f := m.kt.onEvent.Load(); f != nil {
		(*f)(KTEvent{User: user, Err: err})
	}
}

func ktProofErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrKTProof, fmt.Sprintf(format, args...))
}

func ktForkErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrKTFork, fmt.Sprintf(format, args...))
}

// ktLoad returns the pinned keys, pinning the server's on first use (nil
// when the server keeps no log and nothing is pinned); m.kt.mu is held.
func (m *Messenger) ktLoad(ctx context.Context) (*ktKeys, error) {
	s := &m.kt
	if s.keys != nil {
		return s.keys, nil
	}
	if !s.loaded {
		b, err := m.st.Load(ktKeysKey)
		if err != nil {
			return nil, err
		}
		if b != nil {
			var k protocol.KTKeys
			if err := json.Unmarshal(b, &k); err != nil {
				return nil, fmt.Errorf("e2eechat: key transparency: pinned keys: %w", err)
			}
			if s.keys, err = parseKTKeys(k); err != nil {
				return nil, fmt.Errorf("e2eechat: key transparency: pinned keys: %w", err)
			}
			if err := m.ktLoadHead(); err != nil {
				s.keys = nil
				return nil, err
			}
		}
		s.loaded = true
		if s.keys != nil {
			return s.keys, nil
		}
	}
	if s.off && !s.require {
		return nil, nil
	}
	k, err := m.c.KTKeys(ctx)
	if err != nil {
		if c := client.CodeOf(err); c == protocol.CodeNotFound || c == protocol.CodeUnknownType {
			if s.require {
				return nil, ErrKTUnavailable
			}
			s.off = true
			return nil, nil
		}
		return nil, fmt.Errorf("e2eechat: key transparency: %w", err)
	}
	keys, err := parseKTKeys(k)
	if err != nil {
		return nil, ktProofErr("kt_keys: %v", err)
	}
	b, _ := json.Marshal(k)
	if err := m.st.Save(ktKeysKey, b); err != nil {
		return nil, err
	}
	s.keys = keys
	return keys, nil
}

func (m *Messenger) ktLoadHead() error {
	b, err := m.st.Load(ktHeadKey)
	if err != nil || b == nil {
		return err
	}
	c, err := kt.OpenCheckpoint(m.kt.keys.verifier, b)
	if err != nil {
		return fmt.Errorf("e2eechat: key transparency: stored checkpoint: %w", err)
	}
	m.kt.head.Store(&c)
	return nil
}

func parseKTKeys(k protocol.KTKeys) (*ktKeys, error) {
	v, err := note.NewVerifier(k.NoteKey)
	if err != nil {
		return nil, err
	}
	if v.Name() != k.Origin {
		return nil, fmt.Errorf("note key %q for origin %q", v.Name(), k.Origin)
	}
	if len(k.VRFKey) != kt.VRFPublicSize {
		return nil, fmt.Errorf("vrf key of %d bytes", len(k.VRFKey))
	}
	out := &ktKeys{origin: k.Origin, verifier: v}
	copy(out.vrf[:], k.VRFKey)
	return out, nil
}

// ktDevice is a device as a bundles or devices answer gives it.
type ktDevice struct {
	id                           string
	identityKey, accountKey, sig []byte
}

// keyDevices is KeyDevices with its key transparency proof verified.
func (m *Messenger) keyDevices(ctx context.Context, user string) ([]protocol.DeviceKeyInfo, error) {
	list, p, err := m.c.KeyDevicesKT(ctx, user)
	if err != nil {
		return nil, err
	}
	devs := make([]ktDevice, len(list))
	for i, d := range list {
		devs[i] = ktDevice{id: d.DeviceID, identityKey: d.IdentityKey, accountKey: d.AccountKey, sig: d.DeviceSig}
	}
	if _, err := m.ktVerify(ctx, user, p, devs); err != nil {
		return nil, err
	}
	return list, nil
}

// fetchBundles is FetchBundles with its key transparency proof verified.
func (m *Messenger) fetchBundles(ctx context.Context, user, device string) ([]protocol.KeyBundle, error) {
	bs, p, err := m.c.FetchBundlesKT(ctx, user, device)
	if err != nil {
		return nil, err
	}
	devs := make([]ktDevice, len(bs))
	for i, b := range bs {
		if b.UserID != user {
			return nil, ktProofErr("a bundle of %s in the answer for %s", b.UserID, user)
		}
		devs[i] = ktDevice{id: b.DeviceID, identityKey: b.IdentityKey, accountKey: b.AccountKey, sig: b.DeviceSig}
	}
	if _, err := m.ktVerify(ctx, user, p, devs); err != nil {
		return nil, err
	}
	return bs, nil
}

// ktVerify checks an answer's kt object for user and the devices it
// lists, and advances the head to its checkpoint. It returns the user's
// label (zero when the server keeps no log).
func (m *Messenger) ktVerify(ctx context.Context, user string, p *protocol.KTProof, devs []ktDevice) ([32]byte, error) {
	m.kt.mu.Lock()
	defer m.kt.mu.Unlock()
	keys, err := m.ktLoad(ctx)
	if err != nil || keys == nil {
		if errors.Is(err, ErrKTProof) || errors.Is(err, ErrKTUnavailable) {
			m.ktReport(user, err)
		}
		return [32]byte{}, err
	}
	label, err := m.ktVerifyLocked(ctx, keys, user, p, devs)
	if errors.Is(err, ErrKTProof) || errors.Is(err, ErrKTFork) {
		m.ktReport(user, err)
	}
	return label, err
}

func (m *Messenger) ktVerifyLocked(ctx context.Context, keys *ktKeys, user string, p *protocol.KTProof, devs []ktDevice) ([32]byte, error) {
	var label [32]byte
	if p == nil {
		return label, ktProofErr("the answer for %s carries no proof", user)
	}
	c, err := m.ktOpen(keys, p.Checkpoint)
	if err != nil {
		return label, ktProofErr("%s: %v", user, err)
	}
	if label, err = m.ktLabel(keys, user, p.VRFProof); err != nil {
		return label, ktProofErr("label of %s: %v", user, err)
	}
	if !bytes.Equal(p.Label, label[:]) {
		return label, ktProofErr("label of %s is not its VRF output", user)
	}
	seen, err := m.ktVersion(user)
	if err != nil {
		return label, err
	}
	var version uint64
	if len(p.Entry) == 0 {
		if len(devs) > 0 {
			return label, ktProofErr("%d devices of %s without a logged entry", len(devs), user)
		}
		if seen > 0 {
			return label, ktProofErr("no entry for %s, whose version %d was shown before", user, seen)
		}
	} else {
		if err := kt.VerifyInclusion(c, p.Index, p.Entry, p.Proof); err != nil {
			return label, ktProofErr("entry of %s: %v", user, err)
		}
		e, err := kt.UnmarshalEntry(p.Entry)
		if err != nil {
			return label, ktProofErr("entry of %s: %v", user, err)
		}
		if e.Label != label {
			return label, ktProofErr("the entry given for %s is another label's", user)
		}
		if e.Version < seen {
			return label, ktProofErr("entry of %s at version %d, version %d was shown before", user, e.Version, seen)
		}
		for _, d := range devs {
			ed, ok := e.Device(d.id)
			switch {
			case !ok:
				return label, ktProofErr("device %s/%s is not in the logged entry", user, d.id)
			case !bytes.Equal(ed.IdentityKey, d.identityKey):
				return label, ktProofErr("device %s/%s: identity key differs from the logged one", user, d.id)
			case !bytes.Equal(ed.Sig, d.sig):
				return label, ktProofErr("device %s/%s: certificate differs from the logged one", user, d.id)
			case !bytes.Equal(e.Account, d.accountKey):
				return label, ktProofErr("device %s/%s: account key differs from the logged one", user, d.id)
			}
		}
		version = e.Version
	}
	if err := m.ktAdvance(ctx, c, p.Checkpoint); err != nil {
		return label, err
	}
	if version > seen {
		if err := m.st.Save(ktVersionPfx+user, []byte(strconv.FormatUint(version, 10))); err != nil {
			return label, err
		}
	}
	return label, nil
}

// ktVersion is the highest entry version of user this device was shown.
func (m *Messenger) ktVersion(user string) (uint64, error) {
	b, err := m.st.Load(ktVersionPfx + user)
	if err != nil || b == nil {
		return 0, err
	}
	v, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("e2eechat: key transparency: version of %s: %w", user, err)
	}
	return v, nil
}

// ktAdvance accepts checkpoint c (signed text) if it is consistent with
// the head: a larger one becomes the head once the server proves it
// extends it, a smaller one must be proven a prefix of it; m.kt.mu is
// held.
func (m *Messenger) ktAdvance(ctx context.Context, c kt.Checkpoint, text string) error {
	old := m.kt.head.Load()
	switch {
	case old == nil:
	case c == *old:
		return nil
	case c.Size > old.Size:
		if err := m.ktConsistent(ctx, *old, c); err != nil {
			return err
		}
	default:
		// An older checkpoint (a process of the cluster that had not
		// caught up yet) is fine if it is a prefix of the head.
		return m.ktConsistent(ctx, c, *old)
	}
	if err := m.st.Save(ktHeadKey, []byte(text)); err != nil {
		return err
	}
	m.kt.head.Store(&c)
	return nil
}

// ktConsistent asks the server to prove that the log a heads is a prefix
// of the log b heads, and checks the proof.
func (m *Messenger) ktConsistent(ctx context.Context, a, b kt.Checkpoint) error {
	if a.Size > b.Size {
		return ktForkErr("a log of %d leaves after one of %d: %v", b.Size, a.Size, kt.ErrRollback)
	}
	var proof [][]byte
	if a.Size > 0 && a.Size < b.Size {
		p, err := m.c.KTConsistency(ctx, a.Size, b.Size)
		if err != nil {
			if client.CodeOf(err) == protocol.CodeInvalidArgument {
				// The server's log is smaller than a checkpoint it signed.
				return fmt.Errorf("%w: %w: no consistency proof from %d to %d: %v", ErrKTFork, kt.ErrRollback, a.Size, b.Size, err)
			}
			return fmt.Errorf("e2eechat: key transparency: %w", err)
		}
		proof = p.Proof
	}
	if err := kt.VerifyConsistency(a, b, proof); err != nil {
		return fmt.Errorf("%w: %w", ErrKTFork, err)
	}
	return nil
}

// ktGossipHead is the checkpoint sealed into every content this device
// sends (nil before it accepted one).
func (m *Messenger) ktGossipHead() *KTHead {
	h := m.kt.head.Load()
	if h == nil {
		return nil
	}
	return &KTHead{Size: h.Size, Root: bytes.Clone(h.Root[:])}
}

// ktCheckGossip checks the checkpoint a sender sealed into its content
// against this device's view of the log: the sender and this device must
// have been shown one log.
func (m *Messenger) ktCheckGossip(sender e2ee.Address, h *KTHead) error {
	if h == nil {
		return nil
	}
	err := m.ktCheckGossipHead(h)
	if errors.Is(err, ErrKTProof) || errors.Is(err, ErrKTFork) {
		m.ktReport(sender.User, fmt.Errorf("message from %s: %w", sender, err))
	}
	return err
}

func (m *Messenger) ktCheckGossipHead(h *KTHead) error {
	if len(h.Root) != 32 {
		return ktProofErr("a gossiped checkpoint root of %d bytes", len(h.Root))
	}
	ctx, cancel := context.WithTimeout(context.Background(), ktGossipTimeout)
	defer cancel()
	m.kt.mu.Lock()
	defer m.kt.mu.Unlock()
	keys, err := m.ktLoad(ctx)
	if err != nil || keys == nil {
		return err
	}
	c := kt.Checkpoint{Origin: keys.origin, Size: h.Size}
	copy(c.Root[:], h.Root)
	m.kt.seenMu.Lock()
	ok := m.kt.seen[c]
	m.kt.seenMu.Unlock()
	if ok {
		return nil
	}
	head := m.kt.head.Load()
	if head == nil || c.Size > head.Size {
		// The sender saw a newer log: catch up first.
		from := uint64(0)
		if head != nil {
			from = head.Size
		}
		p, err := m.c.KTLeaves(ctx, from, 1)
		if err != nil {
			if client.CodeOf(err) == protocol.CodeInvalidArgument {
				return fmt.Errorf("%w: %w: the server's log is smaller than the %d leaves this device saw: %v", ErrKTFork, kt.ErrRollback, from, err)
			}
			return fmt.Errorf("e2eechat: key transparency: %w", err)
		}
		cur, err := m.ktOpen(keys, p.Checkpoint)
		if err != nil {
			return ktProofErr("%v", err)
		}
		if err := m.ktAdvance(ctx, cur, p.Checkpoint); err != nil {
			return err
		}
		head = m.kt.head.Load()
	}
	if c.Size > head.Size {
		return ktForkErr("the sender was shown a log of %d leaves, this device's is %d", c.Size, head.Size)
	}
	if err := m.ktConsistent(ctx, c, *head); err != nil {
		return fmt.Errorf("the sender's checkpoint (size %d): %w", c.Size, err)
	}
	m.kt.seenMu.Lock()
	if len(m.kt.seen) >= ktSeenMax || m.kt.seen == nil {
		m.kt.seen = map[kt.Checkpoint]bool{}
	}
	m.kt.seen[c] = true
	m.kt.seenMu.Unlock()
	return nil
}

func (m *Messenger) ktFail(user string, err error) error {
	if errors.Is(err, ErrKTProof) || errors.Is(err, ErrKTFork) {
		m.ktReport(user, err)
	}
	return err
}
