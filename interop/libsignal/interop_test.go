package libsignal

import (
	"context"
	"fmt"
	"testing"

	"go.mau.fi/libsignal/ecc"
	"go.mau.fi/libsignal/groups"
	"go.mau.fi/libsignal/keys/identity"
	"go.mau.fi/libsignal/keys/prekey"
	"go.mau.fi/libsignal/protocol"
	"go.mau.fi/libsignal/serialize"
	"go.mau.fi/libsignal/session"
	"go.mau.fi/libsignal/state/record"
	"go.mau.fi/libsignal/tests"
	"go.mau.fi/libsignal/util/keyhelper"
	"go.mau.fi/libsignal/util/optional"

	"github.com/parley-im/parley/client/e2ee"
)

// mau is a device running go.mau.fi/libsignal, address "mau"/1.
type mau struct {
	ser      *serialize.Serializer
	addr     *protocol.SignalAddress
	id       *identity.KeyPair
	reg      uint32
	preKeys  []*record.PreKey
	signed   *record.SignedPreKey
	sessions *tests.InMemorySession
	pre      *tests.InMemoryPreKey
	spks     *tests.InMemorySignedPreKey
	ids      *tests.InMemoryIdentityKey
	sks      *tests.InMemorySenderKey
	group    *groups.SessionBuilder
}

var ctx = context.Background()

func newMau(t *testing.T) *mau {
	ser := serialize.NewProtoBufSerializer()
	m := &mau{ser: ser, addr: protocol.NewSignalAddress("mau", 1)}
	var err error
	if m.id, err = keyhelper.GenerateIdentityKeyPair(); err != nil {
		t.Fatal(err)
	}
	m.reg = keyhelper.GenerateRegistrationID()
	if m.preKeys, err = keyhelper.GeneratePreKeys(1, 10, ser.PreKeyRecord); err != nil {
		t.Fatal(err)
	}
	if m.signed, err = keyhelper.GenerateSignedPreKey(m.id, 7, ser.SignedPreKeyRecord); err != nil {
		t.Fatal(err)
	}
	m.sessions = tests.NewInMemorySession(ser)
	m.pre = tests.NewInMemoryPreKey()
	m.spks = tests.NewInMemorySignedPreKey()
	m.ids = tests.NewInMemoryIdentityKey(m.id, m.reg)
	m.sks = tests.NewInMemorySenderKey()
	for _, p := range m.preKeys {
		m.pre.StorePreKey(ctx, p.ID().Value, record.NewPreKey(p.ID().Value, p.KeyPair(), ser.PreKeyRecord))
	}
	m.spks.StoreSignedPreKey(ctx, m.signed.ID(), record.NewSignedPreKey(m.signed.ID(), m.signed.Timestamp(),
		m.signed.KeyPair(), m.signed.Signature(), ser.SignedPreKeyRecord))
	m.group = groups.NewGroupSessionBuilder(m.sks, ser)
	return m
}

func (m *mau) cipher(peer *protocol.SignalAddress) *session.Cipher {
	b := session.NewBuilder(m.sessions, m.pre, m.spks, m.ids, peer, m.ser)
	return session.NewCipher(b, peer)
}

func mustKey(t *testing.T, b []byte) e2ee.PublicKey {
	t.Helper()
	k, err := e2ee.DecodePublicKey(b)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// bundle is mau's prekey bundle as Parley's key directory would hand it out
// (no KEM prekey: classic X3DH).
func (m *mau) bundle(t *testing.T, i int) e2ee.Bundle {
	sig := m.signed.Signature()
	p := m.preKeys[i]
	return e2ee.Bundle{
		Address:        e2ee.Address{User: "mau", Device: "1"},
		RegistrationID: m.reg,
		IdentityKey:    mustKey(t, m.id.PublicKey().Serialize()),
		SignedPreKey:   e2ee.SignedPreKey{ID: m.signed.ID(), Key: mustKey(t, m.signed.KeyPair().PublicKey().Serialize()), Sig: sig[:]},
		PreKey:         &e2ee.PublicPreKey{ID: p.ID().Value, Key: mustKey(t, p.KeyPair().PublicKey().Serialize())},
	}
}

func point(t *testing.T, b []byte) ecc.ECPublicKeyable {
	t.Helper()
	k, err := ecc.DecodePoint(b, 0)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// ours is a Parley device, address "parley"/"1" (mau's device id 1).
type ours struct {
	d    *e2ee.Device
	keys e2ee.KeyUpload
	addr *protocol.SignalAddress
}

func newOurs(t *testing.T) *ours {
	d, err := e2ee.OpenDevice(e2ee.NewMemoryStore(), e2ee.Address{User: "parley", Device: "1"})
	if err != nil {
		t.Fatal(err)
	}
	d.SetAllowX3DH(true) // go.mau.fi/libsignal has no PQXDH
	up, err := d.GenerateKeys(3)
	if err != nil {
		t.Fatal(err)
	}
	return &ours{d: d, keys: up, addr: protocol.NewSignalAddress("parley", 1)}
}

func (o *ours) bundle(t *testing.T) *prekey.Bundle {
	var sig [64]byte
	copy(sig[:], o.keys.SignedPreKey.Sig)
	p := o.keys.PreKeys[0]
	return prekey.NewBundle(o.d.RegistrationID(), 1, optional.NewOptionalUint32(p.ID), o.keys.SignedPreKey.ID,
		point(t, p.Key.Bytes()), point(t, o.keys.SignedPreKey.Key.Bytes()), sig,
		identity.NewKey(point(t, o.d.IdentityKey().Bytes())))
}

var mauAddr = e2ee.Address{User: "mau", Device: "1"}

func (m *mau) encrypt(t *testing.T, to *protocol.SignalAddress, text string) (e2ee.MessageType, []byte) {
	t.Helper()
	ct, err := m.cipher(to).Encrypt(ctx, []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return e2ee.MessageType(ct.Type()), ct.Serialize()
}

func (m *mau) decrypt(t *testing.T, from *protocol.SignalAddress, typ e2ee.MessageType, b []byte) string {
	t.Helper()
	c := m.cipher(from)
	var plain []byte
	var err error
	switch typ {
	case e2ee.TypePreKey:
		msg, perr := protocol.NewPreKeySignalMessageFromBytes(b, m.ser.PreKeySignalMessage, m.ser.SignalMessage)
		if perr != nil {
			t.Fatalf("mau cannot parse our PreKeySignalMessage: %v", perr)
		}
		plain, err = c.DecryptMessage(ctx, msg)
	case e2ee.TypeSignal:
		msg, perr := protocol.NewSignalMessageFromBytes(b, m.ser.SignalMessage)
		if perr != nil {
			t.Fatalf("mau cannot parse our SignalMessage: %v", perr)
		}
		plain, err = c.Decrypt(ctx, msg)
	default:
		t.Fatalf("type %d", typ)
	}
	if err != nil {
		t.Fatalf("mau cannot decrypt our message: %v", err)
	}
	return string(plain)
}

func oursDecrypt(t *testing.T, o *ours, typ e2ee.MessageType, b []byte, want string) {
	t.Helper()
	got, err := o.d.Decrypt(mauAddr, typ, b)
	if err != nil {
		t.Fatalf("we cannot decrypt mau's message %q: %v", want, err)
	}
	if string(got) != want {
		t.Fatalf("got %q want %q", got, want)
	}
}

type msg struct {
	typ  e2ee.MessageType
	b    []byte
	text string
}

// converse runs both directions after a session exists: in order, out of
// order, across several DH ratchet steps.
func converse(t *testing.T, o *ours, m *mau) {
	for round := 0; round < 4; round++ {
		// Parley → mau: five messages, delivered in reverse.
		var out []msg
		for i := 0; i < 5; i++ {
			text := fmt.Sprintf("parley r%d m%d", round, i)
			typ, b, err := o.d.Encrypt(mauAddr, []byte(text))
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, msg{typ, b, text})
		}
		for i := len(out) - 1; i >= 0; i-- {
			if got := m.decrypt(t, o.addr, out[i].typ, out[i].b); got != out[i].text {
				t.Fatalf("mau got %q want %q", got, out[i].text)
			}
		}
		// mau → Parley: five messages, 2 4 0 1 3.
		out = out[:0]
		for i := 0; i < 5; i++ {
			text := fmt.Sprintf("mau r%d m%d", round, i)
			typ, b := m.encrypt(t, o.addr, text)
			out = append(out, msg{typ, b, text})
		}
		for _, i := range []int{2, 4, 0, 1, 3} {
			oursDecrypt(t, o, out[i].typ, out[i].b, out[i].text)
		}
	}
}

func TestParleyInitiatesToLibsignal(t *testing.T) {
	o, m := newOurs(t), newMau(t)
	if err := o.d.ProcessBundle(m.bundle(t, 0)); err != nil {
		t.Fatal(err)
	}
	typ, b, err := o.d.Encrypt(mauAddr, []byte("hello from parley"))
	if err != nil {
		t.Fatal(err)
	}
	if typ != e2ee.TypePreKey {
		t.Fatalf("first message type %d", typ)
	}
	if got := m.decrypt(t, o.addr, typ, b); got != "hello from parley" {
		t.Fatalf("mau got %q", got)
	}
	converse(t, o, m)
}

func TestLibsignalInitiatesToParley(t *testing.T) {
	o, m := newOurs(t), newMau(t)
	b := session.NewBuilder(m.sessions, m.pre, m.spks, m.ids, o.addr, m.ser)
	if err := b.ProcessBundle(ctx, o.bundle(t)); err != nil {
		t.Fatalf("mau refuses our bundle: %v", err)
	}
	typ, ct := m.encrypt(t, o.addr, "hello from libsignal")
	if typ != e2ee.TypePreKey {
		t.Fatalf("first message type %d", typ)
	}
	oursDecrypt(t, o, typ, ct, "hello from libsignal")
	converse(t, o, m)
}

func TestGroupsBothWays(t *testing.T) {
	o, m := newOurs(t), newMau(t)
	const group = "interop-group"
	// mau's sender key to us.
	mauName := protocol.NewSenderKeyName(group, m.addr)
	skdm, err := m.group.Create(ctx, mauName)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.d.ProcessGroupDistribution(group, mauAddr, skdm.Serialize(), e2ee.FormatLegacy); err != nil {
		t.Fatalf("we cannot read mau's distribution message: %v", err)
	}
	mauCipher := groups.NewGroupCipher(m.group, mauName, m.sks)
	var sent [][]byte
	for i := 0; i < 6; i++ {
		ct, err := mauCipher.Encrypt(ctx, []byte(fmt.Sprint("mau group ", i)))
		if err != nil {
			t.Fatal(err)
		}
		sent = append(sent, ct.SignedSerialize())
	}
	for _, i := range []int{0, 3, 1, 5, 2, 4} {
		got, err := o.d.GroupDecrypt(group, mauAddr, sent[i], e2ee.FormatLegacy)
		if err != nil || string(got) != fmt.Sprint("mau group ", i) {
			t.Fatalf("mau's group message %d: %q %v", i, got, err)
		}
	}
	// Our sender key to mau.
	ourSKDM, err := o.d.GroupDistribution(group, e2ee.FormatLegacy)
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := protocol.NewSenderKeyDistributionMessageFromBytes(ourSKDM, m.ser.SenderKeyDistributionMessage)
	if err != nil {
		t.Fatalf("mau cannot parse our distribution message: %v", err)
	}
	ourName := protocol.NewSenderKeyName(group, o.addr)
	if err := m.group.Process(ctx, ourName, parsed); err != nil {
		t.Fatal(err)
	}
	ourCipher := groups.NewGroupCipher(m.group, ourName, m.sks)
	var ours [][]byte
	for i := 0; i < 6; i++ {
		ct, err := o.d.GroupEncrypt(group, []byte(fmt.Sprint("parley group ", i)), e2ee.FormatLegacy)
		if err != nil {
			t.Fatal(err)
		}
		ours = append(ours, ct)
	}
	for _, i := range []int{1, 0, 4, 2, 5, 3} {
		skm, err := protocol.NewSenderKeyMessageFromBytes(ours[i], m.ser.SenderKeyMessage)
		if err != nil {
			t.Fatalf("mau cannot parse our group message: %v", err)
		}
		got, err := ourCipher.Decrypt(ctx, skm)
		if err != nil || string(got) != fmt.Sprint("parley group ", i) {
			t.Fatalf("our group message %d at mau: %q %v", i, got, err)
		}
	}
}
