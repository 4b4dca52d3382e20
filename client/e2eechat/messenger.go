// Package e2eechat connects an e2ee.Device to a Parley client: it publishes
// the device's keys, fetches bundles, encrypts to every device of the
// recipients and of the sender's own other devices, distributes Sender Keys
// in groups and opens what arrives. Decrypted messages are kept in the
// device's Store, which is also where local search looks: the server of an
// E2E conversation cannot search.
package e2eechat

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

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
)

// envelopeBudget is the part of max_body_bytes one envelope of sender-key
// distributions may use.
const envelopeBudget = 12 << 10

// content is what travels inside the encryption.
type content struct {
	T    string `json:"t"` // "text" or "skdm"
	Text string `json:"text,omitempty"`
	SKDM []byte `json:"skdm,omitempty"`
}

// Opened is a decrypted message.
type Opened struct {
	ConvID       uint64
	Seq          uint64
	Sender       string
	SenderDevice string
	Kind         string // text, edit, recall, system, state
	TargetSeq    uint64
	Text         string
	// System is set for kind system.
	System *protocol.SystemEvent
	// Control is true for protocol messages (sender-key distributions) the
	// user does not see.
	Control bool
}

// Messenger is the E2E side of one device. Safe for concurrent use.
type Messenger struct {
	c    *client.Client
	d    *e2ee.Device
	st   e2ee.Store
	self e2ee.Address

	mu   sync.Mutex
	devs map[string][]string // user → device ids with keys (cache)

	// openMu makes Open atomic: a message delivered twice at once (push and
	// sync) is decrypted once, the second call gets the kept copy.
	openMu sync.Mutex
}

// New returns a Messenger for device d (whose state is in st) on client c.
func New(c *client.Client, d *e2ee.Device, st e2ee.Store) *Messenger {
	return &Messenger{c: c, d: d, st: st, self: d.Address(), devs: map[string][]string{}}
}

// Device is the messenger's device.
func (m *Messenger) Device() *e2ee.Device { return m.d }

// PublishKeys generates n one-time prekeys of each kind (and the signed
// and last-resort keys on first use) and uploads them, in batches that fit
// a frame.
func (m *Messenger) PublishKeys(ctx context.Context, n int) (protocol.KeyCounts, error) {
	up, err := m.d.GenerateKeys(n)
	if err != nil {
		return protocol.KeyCounts{}, err
	}
	first := protocol.KeyUpload{RegistrationID: up.RegistrationID, IdentityKey: up.IdentityKey.Bytes()}
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

// RotateSignedPreKey makes and uploads a new signed prekey.
func (m *Messenger) RotateSignedPreKey(ctx context.Context) error {
	spk, err := m.d.RotateSignedPreKey()
	if err != nil {
		return err
	}
	_, err = m.c.UploadKeys(ctx, protocol.KeyUpload{SignedPreKey: &protocol.PreKey{ID: spk.ID, Key: spk.Key.Bytes(), Sig: spk.Sig}})
	return err
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
// when refresh is set or nothing is cached).
func (m *Messenger) Devices(ctx context.Context, user string, refresh bool) ([]string, error) {
	m.mu.Lock()
	ids, ok := m.devs[user]
	m.mu.Unlock()
	if ok && !refresh {
		return ids, nil
	}
	list, err := m.c.KeyDevices(ctx, user)
	if err != nil {
		return nil, err
	}
	ids = make([]string, 0, len(list))
	for _, d := range list {
		ids = append(ids, d.DeviceID)
	}
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

func (m *Messenger) ensureSession(ctx context.Context, a e2ee.Address) error {
	ok, err := m.d.HasSession(a)
	if err != nil || ok {
		return err
	}
	bs, err := m.c.FetchBundles(ctx, a.User, a.Device)
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

func (m *Messenger) keep(conv, seq uint64, text string) error {
	return m.st.Save(plainKey(conv, seq), []byte(text))
}

func plainKey(conv, seq uint64) string {
	return "plain/" + strconv.FormatUint(conv, 10) + "/" + strconv.FormatUint(seq, 10)
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

func (m *Messenger) direct(ctx context.Context, f protocol.Frame, peer, text string) (client.Ack, error) {
	to, err := m.targets(ctx, []string{peer, m.self.User}, true)
	if err != nil {
		return client.Ack{}, err
	}
	if len(to) == 0 {
		return client.Ack{}, fmt.Errorf("e2eechat: %s has no device with keys", peer)
	}
	env, err := m.seal(ctx, to, content{T: "text", Text: text})
	if err != nil {
		return client.Ack{}, err
	}
	f.Body = protocol.EncodeEnvelope(protocol.Envelope{To: env})
	return m.sendOwn(ctx, f, text)
}

func groupName(conv uint64) string { return strconv.FormatUint(conv, 10) }

func ownKey(conv uint64, clientMsgID string) string {
	return "own/" + strconv.FormatUint(conv, 10) + "/" + clientMsgID
}

// sendOwn sends f, keeping text under its client_msg_id first: the echo
// push of this device's own message may arrive before the ack, and a
// sender cannot decrypt its own ciphertext. Once acknowledged, text is
// kept under the message's seq too (and its target's, for an edit).
func (m *Messenger) sendOwn(ctx context.Context, f protocol.Frame, text string) (client.Ack, error) {
	if f.ClientMsgID == "" {
		f.ClientMsgID = client.NewClientMsgID()
	}
	if err := m.st.Save(ownKey(f.ConvID, f.ClientMsgID), []byte(text)); err != nil {
		return client.Ack{}, err
	}
	ack, err := m.c.SendFrame(ctx, f)
	if err != nil {
		return ack, err
	}
	if err := m.keep(f.ConvID, ack.Seq, text); err != nil {
		return ack, err
	}
	if f.TargetSeq != 0 {
		err = m.keep(f.ConvID, f.TargetSeq, text)
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
			env, err := m.seal(ctx, missing[:1], content{T: "skdm", SKDM: skdm})
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

func (m *Messenger) group(ctx context.Context, f protocol.Frame, members []string, text string) (client.Ack, error) {
	if err := m.distribute(ctx, f.ConvID, append(members, m.self.User), false); err != nil {
		return client.Ack{}, err
	}
	plain, _ := json.Marshal(content{T: "text", Text: text})
	ct, err := m.d.GroupEncrypt(groupName(f.ConvID), plain, e2ee.FormatModern)
	if err != nil {
		return client.Ack{}, err
	}
	f.Body = protocol.EncodeEnvelope(protocol.Envelope{Group: ct})
	return m.sendOwn(ctx, f, text)
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
// The errors of e2ee pass through for errors.Is: a replayed first message
// is e2ee.ErrReusedBaseKey, a classic X3DH one for a new session
// e2ee.ErrDowngrade (sending to a device whose bundle lacks a KEM prekey
// fails with it too).
func (m *Messenger) Open(msg protocol.Message) (Opened, error) {
	m.openMu.Lock()
	defer m.openMu.Unlock()
	o := Opened{ConvID: msg.ConvID, Seq: msg.Seq, Sender: msg.Sender, SenderDevice: msg.SenderDevice, Kind: msg.Kind, TargetSeq: msg.TargetSeq}
	switch {
	case msg.Kind == protocol.KindSystem:
		var ev protocol.SystemEvent
		if err := json.Unmarshal([]byte(msg.Body), &ev); err != nil {
			return o, err
		}
		o.System = &ev
		switch ev.Event {
		case "device_added":
			m.forget(ev.Users...)
		case "device_removed", "identity_changed":
			// The old session cannot reach the device any more: the next
			// message starts a new one from a fresh bundle.
			m.forget(ev.Users...)
			if ev.Device != "" && ev.Actor != "" && (ev.Actor != m.self.User || ev.Device != m.self.Device) {
				if err := m.d.Reset(e2ee.Address{User: ev.Actor, Device: ev.Device}); err != nil {
					return o, err
				}
			}
		case "member_removed", "member_left":
			if err := m.RotateGroup(msg.ConvID); err != nil {
				return o, err
			}
		}
		return o, nil
	case msg.Kind == protocol.KindRecall || msg.Recalled:
		return o, nil
	}
	key := plainKey(msg.ConvID, msg.Seq) // an edited target's copy follows its edits
	if b, err := m.st.Load(key); err != nil {
		return o, err
	} else if b != nil {
		o.Text = string(b)
		return o, nil
	}
	if b, err := m.st.Load("ctl/" + key); err != nil {
		return o, err
	} else if b != nil {
		o.Control = true
		return o, nil
	}
	if msg.Sender == m.self.User && msg.SenderDevice == m.self.Device {
		if b, err := m.st.Load("ownctl/" + ownKey(msg.ConvID, msg.ClientMsgID)); err != nil {
			return o, err
		} else if b != nil {
			o.Control = true
			return o, nil
		}
		b, err := m.st.Load(ownKey(msg.ConvID, msg.ClientMsgID))
		if err != nil {
			return o, err
		}
		if b == nil {
			return o, ErrOwnUnknown
		}
		o.Text = string(b)
		return o, m.keep(msg.ConvID, msg.Seq, o.Text)
	}
	env, err := protocol.ParseEnvelope(msg.Body)
	if err != nil {
		return o, err
	}
	sender := e2ee.Address{User: msg.Sender, Device: msg.SenderDevice}
	var plain []byte
	if len(env.Group) > 0 {
		plain, err = m.d.GroupDecrypt(groupName(msg.ConvID), sender, env.Group, e2ee.FormatModern)
	} else {
		found := false
		for _, t := range env.To {
			if t.User == m.self.User && t.Device == m.self.Device {
				found = true
				plain, err = m.d.Decrypt(sender, e2ee.MessageType(t.Type), t.Body)
				break
			}
		}
		if !found {
			return o, ErrNotForDevice
		}
	}
	if err != nil {
		return o, err
	}
	var c content
	if err := json.Unmarshal(plain, &c); err != nil {
		return o, fmt.Errorf("e2eechat: content: %w", err)
	}
	switch c.T {
	case "skdm":
		if err := m.d.ProcessGroupDistribution(groupName(msg.ConvID), sender, c.SKDM, e2ee.FormatModern); err != nil {
			return o, err
		}
		o.Control = true
		return o, m.st.Save("ctl/"+key, []byte{1})
	case "text":
		o.Text = c.Text
		if err := m.keep(msg.ConvID, msg.Seq, c.Text); err != nil {
			return o, err
		}
		if msg.Kind == protocol.KindEdit && msg.TargetSeq != 0 {
			return o, m.keep(msg.ConvID, msg.TargetSeq, c.Text)
		}
		return o, nil
	}
	return o, fmt.Errorf("e2eechat: unknown content %q", c.T)
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
	keys, err := m.st.List("plain/")
	if err != nil {
		return nil, err
	}
	q := strings.ToLower(query)
	var out []Hit
	for _, k := range keys {
		b, err := m.st.Load(k)
		if err != nil {
			return nil, err
		}
		if !strings.Contains(strings.ToLower(string(b)), q) {
			continue
		}
		parts := strings.Split(k, "/")
		conv, _ := strconv.ParseUint(parts[1], 10, 64)
		seq, _ := strconv.ParseUint(parts[2], 10, 64)
		out = append(out, Hit{ConvID: conv, Seq: seq, Text: string(b)})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].ConvID != out[j].ConvID {
			return out[i].ConvID < out[j].ConvID
		}
		return out[i].Seq < out[j].Seq
	})
	return out, nil
}

// SafetyNumber is the safety number between this device and peer's device
// (as last seen: from the session or the key directory).
func (m *Messenger) SafetyNumber(ctx context.Context, peer e2ee.Address) (string, error) {
	key, ok, err := m.d.PeerIdentity(peer)
	if err != nil {
		return "", err
	}
	if !ok {
		list, err := m.c.KeyDevices(ctx, peer.User)
		if err != nil {
			return "", err
		}
		for _, d := range list {
			if d.DeviceID == peer.Device {
				if key, err = e2ee.DecodePublicKey(d.IdentityKey); err != nil {
					return "", err
				}
				ok = true
			}
		}
		if !ok {
			return "", fmt.Errorf("e2eechat: %s has no keys", peer)
		}
	}
	return e2ee.SafetyNumber(m.self.User, m.d.IdentityKey(), peer.User, key), nil
}

// Send sends text to E2E conversation convID, reading its kind and members
// from the server (conv_info): SendDirect for a direct conversation,
// SendGroup for a group (at most 1,000 members are listed; larger groups
// need SendGroup with the member list).
func (m *Messenger) Send(ctx context.Context, convID uint64, text string) (client.Ack, error) {
	info, err := m.c.ConvInfo(ctx, convID)
	if err != nil {
		return client.Ack{}, err
	}
	if !info.E2E {
		return client.Ack{}, fmt.Errorf("e2eechat: conversation %d is not end-to-end encrypted", convID)
	}
	if info.Kind == protocol.ConvDirect {
		for _, u := range info.Members {
			if u != m.self.User {
				return m.SendDirect(ctx, convID, u, text)
			}
		}
		return client.Ack{}, fmt.Errorf("e2eechat: direct conversation %d has no peer", convID)
	}
	if info.MemberCount > len(info.Members) {
		return client.Ack{}, fmt.Errorf("e2eechat: group %d has %d members, more than conv_info lists: use SendGroup", convID, info.MemberCount)
	}
	return m.SendGroup(ctx, convID, info.Members, text)
}
