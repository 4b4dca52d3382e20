package e2ee

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/protocol"
)

// TestTypeScriptInterop runs this package against the TypeScript SDK's
// E2E code (sdk/ts/src/e2ee), both directions, over the wire formats
// alone: a Node process (sdk/ts/test/e2ee-peer.mjs) holds the TypeScript
// devices and is driven through stdin/stdout. It needs node and the built
// SDK (scripts/web.sh builds it before scripts/test.sh in CI); without
// them it skips, and under CI=true it fails.

type tsPeer struct {
	t   *testing.T
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
	id  int
}

type tsError struct{ Code, Msg string }

func (e *tsError) Error() string { return e.Code + ": " + e.Msg }

func startTSPeer(t *testing.T) *tsPeer {
	t.Helper()
	root, err := filepath.Abs("../../sdk/ts")
	if err != nil {
		t.Fatal(err)
	}
	missing := ""
	node, err := exec.LookPath("node")
	if err != nil {
		missing = "node is not installed"
	} else if _, err := os.Stat(filepath.Join(root, "dist/e2ee/index.js")); err != nil {
		missing = "the TypeScript SDK is not built (cd sdk/ts && npm ci && npm run build)"
	} else if _, err := os.Stat(filepath.Join(root, "node_modules/@noble/curves")); err != nil {
		missing = "the TypeScript SDK's packages are not installed (cd sdk/ts && npm ci)"
	}
	if missing != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("TypeScript interop: %s", missing)
		}
		t.Skipf("TypeScript interop: %s", missing)
	}
	cmd := exec.Command(node, "test/e2ee-peer.mjs")
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &tsPeer{t: t, cmd: cmd, in: in, out: bufio.NewScanner(out)}
	p.out.Buffer(make([]byte, 1<<20), 16<<20)
	t.Cleanup(func() {
		in.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
		}
	})
	return p
}

// call sends one request and decodes the answer's result into r (nil:
// ignored); an error answer is a *tsError.
func (p *tsPeer) call(r any, op, dev string, args map[string]any) error {
	p.id++
	q := map[string]any{"id": p.id, "op": op, "dev": dev}
	for k, v := range args {
		q[k] = v
	}
	b, err := json.Marshal(q)
	if err != nil {
		return err
	}
	if _, err := p.in.Write(append(b, '\n')); err != nil {
		return err
	}
	if !p.out.Scan() {
		return fmt.Errorf("node peer exited: %v", p.out.Err())
	}
	var a struct {
		ID    int             `json:"id"`
		OK    bool            `json:"ok"`
		R     json.RawMessage `json:"r"`
		Code  string          `json:"code"`
		Error string          `json:"error"`
	}
	if err := json.Unmarshal(p.out.Bytes(), &a); err != nil {
		return fmt.Errorf("node peer answered %q: %v", p.out.Bytes(), err)
	}
	if a.ID != p.id {
		return fmt.Errorf("node peer answered request %d, want %d", a.ID, p.id)
	}
	if !a.OK {
		return &tsError{a.Code, a.Error}
	}
	if r != nil {
		return json.Unmarshal(a.R, r)
	}
	return nil
}

func (p *tsPeer) must(r any, op, dev string, args map[string]any) {
	p.t.Helper()
	if err := p.call(r, op, dev, args); err != nil {
		p.t.Fatalf("ts %s %s: %v", op, dev, err)
	}
}

// wantCode checks that err is the TypeScript error code.
func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	var te *tsError
	if !errors.As(err, &te) || te.Code != code {
		t.Fatalf("got %v, want TypeScript error %s", err, code)
	}
}

type tsPreKey struct {
	ID  uint32 `json:"id"`
	Key []byte `json:"key"`
	Sig []byte `json:"sig,omitempty"`
}

type tsUpload struct {
	RegistrationID uint32     `json:"registrationId"`
	IdentityKey    []byte     `json:"identityKey"`
	SignedPreKey   *tsPreKey  `json:"signedPreKey"`
	PreKeys        []tsPreKey `json:"preKeys"`
	KEMPreKeys     []tsPreKey `json:"kemPreKeys"`
	LastResortKEM  *tsPreKey  `json:"lastResortKEM"`
}

type tsBundle struct {
	Address        string    `json:"address"`
	RegistrationID uint32    `json:"registrationId"`
	IdentityKey    []byte    `json:"identityKey"`
	SignedPreKey   tsPreKey  `json:"signedPreKey"`
	PreKey         *tsPreKey `json:"preKey,omitempty"`
	KEMPreKey      *tsPreKey `json:"kemPreKey,omitempty"`
}

// tsDev is a TypeScript device of the peer, with its upload (the key
// directory's view: each one-time key handed out once).
type tsDev struct {
	addr Address
	name string
	up   tsUpload
	next int
}

func (p *tsPeer) open(user, device string, keys int) *tsDev {
	p.t.Helper()
	d := &tsDev{addr: Address{user, device}, name: user + "/" + device}
	p.must(nil, "open", d.name, nil)
	p.must(&d.up, "generateKeys", d.name, map[string]any{"n": keys})
	return d
}

// goBundle is the TypeScript device's bundle for a Go device.
func (d *tsDev) goBundle(t *testing.T, otp, pq bool) Bundle {
	t.Helper()
	id, err := DecodePublicKey(d.up.IdentityKey)
	if err != nil {
		t.Fatal(err)
	}
	spk, err := DecodePublicKey(d.up.SignedPreKey.Key)
	if err != nil {
		t.Fatal(err)
	}
	b := Bundle{Address: d.addr, RegistrationID: d.up.RegistrationID, IdentityKey: id,
		SignedPreKey: SignedPreKey{ID: d.up.SignedPreKey.ID, Key: spk, Sig: d.up.SignedPreKey.Sig}}
	if otp {
		k, err := DecodePublicKey(d.up.PreKeys[d.next].Key)
		if err != nil {
			t.Fatal(err)
		}
		b.PreKey = &PublicPreKey{ID: d.up.PreKeys[d.next].ID, Key: k}
	}
	if pq {
		k := d.up.KEMPreKeys[d.next]
		b.KEMPreKey = &KEMPreKey{ID: k.ID, Key: k.Key, Sig: k.Sig}
	}
	d.next++
	return b
}

// tsBundleOf is a Go device's bundle in the peer's JSON (the last-resort
// KEM key when lastResort, else the next one-time keys).
func tsBundleOf(d *testDev, otp, lastResort bool) tsBundle {
	b := tsBundle{Address: d.Address().String(), RegistrationID: d.RegistrationID(), IdentityKey: d.IdentityKey().Bytes(),
		SignedPreKey: tsPreKey{ID: d.keys.SignedPreKey.ID, Key: d.keys.SignedPreKey.Key.Bytes(), Sig: d.keys.SignedPreKey.Sig}}
	if otp {
		k := d.keys.PreKeys[d.next]
		b.PreKey = &tsPreKey{ID: k.ID, Key: k.Key.Bytes()}
	}
	k := d.keys.KEMPreKeys[d.next]
	if lastResort {
		k = *d.keys.LastResortKEM
	}
	b.KEMPreKey = &tsPreKey{ID: k.ID, Key: k.Key, Sig: k.Sig}
	d.next++
	return b
}

type tsCipher struct {
	Type MessageType `json:"type"`
	Body []byte      `json:"body"`
}

func (p *tsPeer) encrypt(from *tsDev, to Address, msg string) tsCipher {
	p.t.Helper()
	var c tsCipher
	p.must(&c, "encrypt", from.name, map[string]any{"peer": to.String(), "plain": []byte(msg)})
	return c
}

func (p *tsPeer) decrypt(to *tsDev, from Address, typ MessageType, body []byte) (string, error) {
	var r struct {
		Plain []byte `json:"plain"`
	}
	err := p.call(&r, "decrypt", to.name, map[string]any{"peer": from.String(), "type": typ, "body": body})
	return string(r.Plain), err
}

func (p *tsPeer) mustDecrypt(to *tsDev, from Address, typ MessageType, body []byte, want string) {
	p.t.Helper()
	got, err := p.decrypt(to, from, typ, body)
	if err != nil || got != want {
		p.t.Fatalf("ts %s decrypts %q, %v; want %q", to.name, got, err, want)
	}
}

func goDecrypt(t *testing.T, d *testDev, from Address, typ MessageType, body []byte, want string) {
	t.Helper()
	got, err := d.Decrypt(from, typ, body)
	if err != nil || string(got) != want {
		t.Fatalf("go %s decrypts %q, %v; want %q", d.Address(), got, err, want)
	}
}

func TestTypeScriptInterop(t *testing.T) {
	p := startTSPeer(t)

	t.Run("GoToTSFirstMessagesAndRatchet", func(t *testing.T) {
		p.t = t
		alice := newTestDev(t, "alice", "go1")
		bob := p.open("bob", "ts1", 3)
		if err := alice.ProcessBundle(bob.goBundle(t, true, true)); err != nil {
			t.Fatal(err)
		}
		// First messages (PQXDH, version 4), the second read first.
		t1, c1 := mustEncrypt(t, alice, nil2(bob), "hello")
		t2, c2 := mustEncrypt(t, alice, nil2(bob), "again")
		if t1 != TypePreKey || c1[0] != 0x44 {
			t.Fatalf("first message type %d version byte %#x", t1, c1[0])
		}
		p.mustDecrypt(bob, alice.Address(), t2, c2, "again")
		p.mustDecrypt(bob, alice.Address(), t1, c1, "hello")
		_, err := p.decrypt(bob, alice.Address(), t1, c1)
		wantCode(t, err, "duplicate")
		// Ratchet steps both ways, several rounds.
		for round := 0; round < 3; round++ {
			c := p.encrypt(bob, alice.Address(), fmt.Sprint("ts round ", round))
			goDecrypt(t, alice, bob.addr, c.Type, c.Body, fmt.Sprint("ts round ", round))
			typ, ct := mustEncrypt(t, alice, nil2(bob), fmt.Sprint("go round ", round))
			if typ != TypeSignal {
				t.Fatalf("round %d: type %d after the answer", round, typ)
			}
			p.mustDecrypt(bob, alice.Address(), typ, ct, fmt.Sprint("go round ", round))
		}
		// Skipped and out-of-order messages, Go → TS then TS → Go.
		var gs []tsCipher
		for i := 0; i < 6; i++ {
			typ, ct := mustEncrypt(t, alice, nil2(bob), fmt.Sprint("g", i))
			gs = append(gs, tsCipher{typ, ct})
		}
		for _, i := range []int{5, 1, 3, 0, 4, 2} {
			p.mustDecrypt(bob, alice.Address(), gs[i].Type, gs[i].Body, fmt.Sprint("g", i))
		}
		var ts []tsCipher
		for i := 0; i < 6; i++ {
			ts = append(ts, p.encrypt(bob, alice.Address(), fmt.Sprint("t", i)))
		}
		for _, i := range []int{4, 0, 5, 2, 1, 3} {
			goDecrypt(t, alice, bob.addr, ts[i].Type, ts[i].Body, fmt.Sprint("t", i))
		}
		if _, err := alice.Decrypt(bob.addr, ts[0].Type, ts[0].Body); !errors.Is(err, ErrDuplicate) {
			t.Fatalf("go: replayed TS message: %v", err)
		}
		// Messages of an older chain arrive after a ratchet step.
		old := p.encrypt(bob, alice.Address(), "old chain")
		typ, ct := mustEncrypt(t, alice, nil2(bob), "step")
		p.mustDecrypt(bob, alice.Address(), typ, ct, "step")
		newer := p.encrypt(bob, alice.Address(), "new chain")
		goDecrypt(t, alice, bob.addr, newer.Type, newer.Body, "new chain")
		goDecrypt(t, alice, bob.addr, old.Type, old.Body, "old chain")
		// A tampered message fails on the TS side and changes nothing.
		typ, ct = mustEncrypt(t, alice, nil2(bob), "intact")
		bad := append([]byte(nil), ct...)
		bad[len(bad)-1] ^= 1
		_, err = p.decrypt(bob, alice.Address(), typ, bad)
		wantCode(t, err, "bad_mac")
		p.mustDecrypt(bob, alice.Address(), typ, ct, "intact")
	})

	t.Run("TSToGoFirstMessages", func(t *testing.T) {
		p.t = t
		bob := newTestDev(t, "bob", "go1")
		alice := p.open("alice", "ts2", 1)
		// With a one-time prekey and a one-time KEM key.
		p.must(nil, "processBundle", alice.name, map[string]any{"bundle": tsBundleOf(bob, true, false)})
		c1 := p.encrypt(alice, bob.Address(), "from ts")
		c2 := p.encrypt(alice, bob.Address(), "second")
		if c1.Type != TypePreKey || c1.Body[0] != 0x44 {
			t.Fatalf("first message type %d version byte %#x", c1.Type, c1.Body[0])
		}
		goDecrypt(t, bob, alice.addr, c2.Type, c2.Body, "second")
		goDecrypt(t, bob, alice.addr, c1.Type, c1.Body, "from ts")
		typ, ct := mustEncrypt(t, bob, &testDev{Device: &Device{self: alice.addr}}, "answer")
		p.mustDecrypt(alice, bob.Address(), typ, ct, "answer")
		c3 := p.encrypt(alice, bob.Address(), "after answer")
		if c3.Type != TypeSignal {
			t.Fatalf("type %d after the answer", c3.Type)
		}
		goDecrypt(t, bob, alice.addr, c3.Type, c3.Body, "after answer")

		// Last-resort KEM key and no one-time prekey: Go refuses a replay
		// by its base key, TS the same of Go's.
		carol := p.open("carol", "ts3", 1)
		p.must(nil, "processBundle", carol.name, map[string]any{"bundle": tsBundleOf(bob, false, true)})
		c := p.encrypt(carol, bob.Address(), "last resort")
		goDecrypt(t, bob, carol.addr, c.Type, c.Body, "last resort")
		if err := bob.Reset(carol.addr); err != nil {
			t.Fatal(err)
		}
		if _, err := bob.Decrypt(carol.addr, c.Type, c.Body); !errors.Is(err, ErrReusedBaseKey) {
			t.Fatalf("go: replayed TS first message: %v", err)
		}
		dave := newTestDev(t, "dave", "go2")
		b := carol.goBundle(t, false, false)
		b.KEMPreKey = nil
		if err := dave.ProcessBundle(b); !errors.Is(err, ErrDowngrade) {
			t.Fatalf("go: TS bundle without KEM key: %v", err)
		}
		// A bundle whose signature the TS side must refuse.
		forged := tsBundleOf(bob, true, false)
		forged.SignedPreKey.Sig[10] ^= 1
		err := p.call(nil, "processBundle", carol.name, map[string]any{"bundle": forged})
		wantCode(t, err, "bad_signature")
	})

	t.Run("ClassicX3DHWhenAllowed", func(t *testing.T) {
		p.t = t
		bob := newTestDev(t, "bob", "go3")
		bob.SetAllowX3DH(true)
		alice := p.open("alice", "ts4", 1)
		b := tsBundleOf(bob, true, false)
		b.KEMPreKey = nil
		err := p.call(nil, "processBundle", alice.name, map[string]any{"bundle": b})
		wantCode(t, err, "downgrade")
		p.must(nil, "setAllowX3DH", alice.name, map[string]any{"allow": true})
		p.must(nil, "processBundle", alice.name, map[string]any{"bundle": b})
		c := p.encrypt(alice, bob.Address(), "v3")
		if c.Body[0] != 0x33 {
			t.Fatalf("version byte %#x, want 0x33", c.Body[0])
		}
		goDecrypt(t, bob, alice.addr, c.Type, c.Body, "v3")
	})

	t.Run("SenderKeysAndRotation", func(t *testing.T) {
		p.t = t
		for _, f := range []struct {
			name string
			f    SenderKeyFormat
		}{{"modern", FormatModern}, {"legacy", FormatLegacy}} {
			group := "g-" + f.name
			gosender := newTestDev(t, "gs", "go-"+f.name)
			gomember := newTestDev(t, "gm", "go-"+f.name)
			ts1 := p.open("m1", "ts-"+f.name, 1)
			ts2 := p.open("m2", "ts-"+f.name, 1)
			args := func(m map[string]any) map[string]any { m["group"], m["format"] = group, f.name; return m }

			// Go sender → TS members, the distribution over the pairwise
			// session as e2eechat sends it.
			skdm, err := gosender.GroupDistribution(group, f.f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range []*tsDev{ts1, ts2} {
				if err := gosender.ProcessBundle(m.goBundle(t, true, true)); err != nil {
					t.Fatal(err)
				}
				typ, ct, err := gosender.Encrypt(m.addr, skdm)
				if err != nil {
					t.Fatal(err)
				}
				var r struct {
					Plain []byte `json:"plain"`
				}
				p.must(&r, "decrypt", m.name, map[string]any{"peer": gosender.Address().String(), "type": typ, "body": ct})
				p.must(nil, "processGroupDistribution", m.name, args(map[string]any{"sender": gosender.Address().String(), "skdm": r.Plain}))
			}
			var msgs [][]byte
			for i := 0; i < 5; i++ {
				ct, err := gosender.GroupEncrypt(group, []byte(fmt.Sprint("group ", i)), f.f)
				if err != nil {
					t.Fatal(err)
				}
				msgs = append(msgs, ct)
			}
			groupDec := func(m *tsDev, sender Address, body []byte) (string, error) {
				var r struct {
					Plain []byte `json:"plain"`
				}
				err := p.call(&r, "groupDecrypt", m.name, args(map[string]any{"sender": sender.String(), "body": body}))
				return string(r.Plain), err
			}
			for _, i := range []int{3, 0, 4, 1, 2} {
				if got, err := groupDec(ts1, gosender.Address(), msgs[i]); err != nil || got != fmt.Sprint("group ", i) {
					t.Fatalf("ts1 group %d: %q %v", i, got, err)
				}
			}
			if got, err := groupDec(ts2, gosender.Address(), msgs[4]); err != nil || got != "group 4" {
				t.Fatalf("ts2: %q %v", got, err)
			}
			_, err = groupDec(ts1, gosender.Address(), msgs[0])
			wantCode(t, err, "duplicate")
			// m2 leaves: the Go sender rotates and gives the new key to m1 only.
			if err := gosender.RotateGroup(group); err != nil {
				t.Fatal(err)
			}
			skdm2, _ := gosender.GroupDistribution(group, f.f)
			p.must(nil, "processGroupDistribution", ts1.name, args(map[string]any{"sender": gosender.Address().String(), "skdm": skdm2}))
			after, _ := gosender.GroupEncrypt(group, []byte("after rotation"), f.f)
			if got, err := groupDec(ts1, gosender.Address(), after); err != nil || got != "after rotation" {
				t.Fatalf("ts1 after rotation: %q %v", got, err)
			}
			_, err = groupDec(ts2, gosender.Address(), after)
			wantCode(t, err, "no_sender_key")

			// TS sender → Go members, rotation after the Go member leaves.
			var d struct {
				SKDM []byte `json:"skdm"`
			}
			p.must(&d, "groupDistribution", ts1.name, args(map[string]any{}))
			if err := gomember.ProcessGroupDistribution(group, ts1.addr, d.SKDM, f.f); err != nil {
				t.Fatal(err)
			}
			p.must(nil, "processGroupDistribution", ts2.name, args(map[string]any{"sender": ts1.name, "skdm": d.SKDM}))
			var tsmsgs [][]byte
			for i := 0; i < 4; i++ {
				var r struct {
					Body []byte `json:"body"`
				}
				p.must(&r, "groupEncrypt", ts1.name, args(map[string]any{"plain": []byte(fmt.Sprint("ts group ", i))}))
				tsmsgs = append(tsmsgs, r.Body)
			}
			for _, i := range []int{2, 3, 0, 1} {
				got, err := gomember.GroupDecrypt(group, ts1.addr, tsmsgs[i], f.f)
				if err != nil || string(got) != fmt.Sprint("ts group ", i) {
					t.Fatalf("go member, ts group %d: %q %v", i, got, err)
				}
			}
			if _, err := gomember.GroupDecrypt(group, ts1.addr, tsmsgs[1], f.f); !errors.Is(err, ErrDuplicate) {
				t.Fatalf("go: replayed TS group message: %v", err)
			}
			p.must(nil, "rotateGroup", ts1.name, args(map[string]any{}))
			p.must(&d, "groupDistribution", ts1.name, args(map[string]any{}))
			p.must(nil, "processGroupDistribution", ts2.name, args(map[string]any{"sender": ts1.name, "skdm": d.SKDM}))
			var r struct {
				Body []byte `json:"body"`
			}
			p.must(&r, "groupEncrypt", ts1.name, args(map[string]any{"plain": []byte("without go")}))
			if got, err := groupDec(ts2, ts1.addr, r.Body); err != nil || got != "without go" {
				t.Fatalf("ts2 after rotation: %q %v", got, err)
			}
			if _, err := gomember.GroupDecrypt(group, ts1.addr, r.Body, f.f); !errors.Is(err, ErrNoSenderKey) {
				t.Fatalf("removed go member reads the rotated TS key: %v", err)
			}
		}
	})

	t.Run("MultiDeviceFanOutAndCertificates", func(t *testing.T) {
		p.t = t
		// alice: a Go device and a TS device sharing one account key; bob:
		// a TS device and a Go device.
		a1 := newTestDev(t, "alice", "cli")
		a2 := p.open("alice", "web", 2)
		b1 := p.open("bob", "web", 2)
		b2 := newTestDev(t, "bob", "cli")
		if _, err := a1.CreateAccountKey(); err != nil {
			t.Fatal(err)
		}
		exp, _ := a1.ExportAccountKey()
		p.must(nil, "importAccountKey", a2.name, map[string]any{"key": string(exp)})
		var bak struct {
			AccountKey []byte `json:"accountKey"`
		}
		p.must(&bak, "createAccountKey", b1.name, nil)
		var bexp struct {
			Key string `json:"key"`
		}
		p.must(&bexp, "exportAccountKey", b1.name, nil)
		if _, err := b2.ImportAccountKey([]byte(bexp.Key)); err != nil {
			t.Fatal(err)
		}
		type tsCert struct {
			Address     string `json:"address"`
			IdentityKey []byte `json:"identityKey"`
			AccountKey  []byte `json:"accountKey"`
			Sig         []byte `json:"sig"`
		}
		certOfTS := func(d *tsDev) DeviceCert {
			var c tsCert
			p.must(&c, "deviceCertificate", d.name, nil)
			id, _ := DecodePublicKey(c.IdentityKey)
			return DeviceCert{Address: d.addr, IdentityKey: id, AccountKey: c.AccountKey, Sig: c.Sig}
		}
		certOfGo := func(d *testDev) tsCert {
			ak, sig, err := d.DeviceCertificate()
			if err != nil {
				t.Fatal(err)
			}
			return tsCert{Address: d.Address().String(), IdentityKey: d.IdentityKey().Bytes(), AccountKey: ak.Bytes(), Sig: sig}
		}
		// Go accepts TS certificates, TS accepts Go certificates, and a
		// device under another account key is refused on both sides.
		chk, err := a1.AcceptDevices("bob", []DeviceCert{certOfTS(b1), {Address: b2.Address(), IdentityKey: b2.IdentityKey(), AccountKey: certOfGo(b2).AccountKey, Sig: certOfGo(b2).Sig}})
		if err != nil || len(chk.Accepted) != 2 {
			t.Fatalf("go accepts bob's devices: %+v %v", chk, err)
		}
		if _, err := a1.AcceptDevices("alice", []DeviceCert{certOfTS(a2)}); err != nil {
			t.Fatal(err)
		}
		if ok, _ := a1.Certified(a2.addr, certOfTS(a2).IdentityKey); !ok {
			t.Fatal("go: the TS device of the same account is not certified")
		}
		rogue := newTestDev(t, "bob", "rogue")
		rogue.CreateAccountKey()
		var acc struct {
			Accepted []string `json:"accepted"`
			Refused  []string `json:"refused"`
		}
		// First sight of bob: trust on first use of the account key of his
		// certified devices; a list mixing two untrusted account keys
		// would be refused whole, as in Go.
		p.must(&acc, "acceptDevices", a2.name, map[string]any{"user": "bob", "certs": []tsCert{certOfGo(b2), certOfGo(rogue)}})
		if len(acc.Accepted) != 0 || len(acc.Refused) != 2 {
			t.Fatalf("ts accepts %v of a list under two unknown account keys", acc.Accepted)
		}
		p.must(&acc, "acceptDevices", a2.name, map[string]any{"user": "bob", "certs": []tsCert{certOfGo(b2)}})
		p.must(&acc, "acceptDevices", a2.name, map[string]any{"user": "bob", "certs": []tsCert{certOfGo(b2), certOfGo(rogue)}})
		if len(acc.Accepted) != 1 || acc.Accepted[0] != "bob/cli" || len(acc.Refused) != 1 {
			t.Fatalf("ts accepts %v, refuses %v", acc.Accepted, acc.Refused)
		}
		p.must(&acc, "acceptDevices", a2.name, map[string]any{"user": "alice", "certs": []tsCert{certOfGo(a1)}})
		if len(acc.Accepted) != 1 {
			t.Fatalf("ts refuses its own account's Go device: %v", acc.Refused)
		}

		// Go a1 sends one envelope to bob's two devices and to alice's
		// other device (the TS one).
		for _, b := range []Bundle{b1.goBundle(t, true, true), a2.goBundle(t, true, true)} {
			if err := a1.ProcessBundle(b); err != nil {
				t.Fatal(err)
			}
		}
		if err := a1.ProcessBundle(b2.bundle(true, true)); err != nil {
			t.Fatal(err)
		}
		var to []protocol.EnvelopeTo
		for _, a := range []Address{b1.addr, b2.Address(), a2.addr} {
			typ, ct, err := a1.Encrypt(a, []byte("to all of you"))
			if err != nil {
				t.Fatal(err)
			}
			to = append(to, protocol.EnvelopeTo{User: a.User, Device: a.Device, Type: int(typ), Body: ct})
		}
		env := string(protocol.EncodeEnvelope(protocol.Envelope{To: to}))
		for _, d := range []*tsDev{b1, a2} {
			var r struct {
				Plain []byte `json:"plain"`
			}
			p.must(&r, "open_envelope", d.name, map[string]any{"envelope": env, "sender": "alice/cli"})
			if string(r.Plain) != "to all of you" {
				t.Fatalf("ts %s: %q", d.name, r.Plain)
			}
		}
		e, err := protocol.ParseEnvelope(env)
		if err != nil {
			t.Fatal(err)
		}
		goDecrypt(t, b2, a1.Address(), MessageType(e.To[1].Type), e.To[1].Body, "to all of you")

		// TS a2 answers with one envelope to bob's devices and alice's Go
		// device; the TS session with bob/web is new (a first message), the
		// one with alice/cli answers the session a1 started.
		p.must(nil, "processBundle", a2.name, map[string]any{"bundle": tsBundleOf(b2, true, false)})
		var bb tsBundle
		bb = tsBundle{Address: b1.name, RegistrationID: b1.up.RegistrationID, IdentityKey: b1.up.IdentityKey,
			SignedPreKey: *b1.up.SignedPreKey, PreKey: &b1.up.PreKeys[b1.next], KEMPreKey: &b1.up.KEMPreKeys[b1.next]}
		b1.next++
		p.must(nil, "processBundle", a2.name, map[string]any{"bundle": bb})
		var sealed struct {
			Envelope string `json:"envelope"`
		}
		p.must(&sealed, "seal", a2.name, map[string]any{"peers": []string{"bob/web", "bob/cli", "alice/cli"}, "plain": []byte("reply from the web")})
		e, err = protocol.ParseEnvelope(sealed.Envelope)
		if err != nil {
			t.Fatalf("go refuses the TS envelope %s: %v", sealed.Envelope, err)
		}
		for _, x := range e.To {
			switch x.User + "/" + x.Device {
			case "bob/cli":
				goDecrypt(t, b2, a2.addr, MessageType(x.Type), x.Body, "reply from the web")
			case "alice/cli":
				if x.Type != int(TypeSignal) {
					t.Fatalf("answer to alice/cli has type %d", x.Type)
				}
				goDecrypt(t, a1, a2.addr, MessageType(x.Type), x.Body, "reply from the web")
			}
		}
		var r struct {
			Plain []byte `json:"plain"`
		}
		p.must(&r, "open_envelope", b1.name, map[string]any{"envelope": sealed.Envelope, "sender": "alice/web"})
		if string(r.Plain) != "reply from the web" {
			t.Fatalf("ts bob/web: %q", r.Plain)
		}
		err = p.call(nil, "open_envelope", b1.name, map[string]any{"envelope": string(protocol.EncodeEnvelope(protocol.Envelope{To: to[1:2]})), "sender": "alice/cli"})
		wantCode(t, err, "not_for_device")

		// Safety numbers agree.
		ak1, _, _ := a1.AccountKey()
		bk, _ := DecodePublicKey(bak.AccountKey)
		var sn struct {
			Number string `json:"number"`
		}
		p.must(&sn, "safetyNumber", "", map[string]any{"localId": "bob", "localKey": bk.Bytes(), "remoteId": "alice", "remoteKey": ak1.Bytes()})
		if want := SafetyNumber("alice", ak1, "bob", bk); sn.Number != want || len(want) != 60 {
			t.Fatalf("safety number: ts %s, go %s", sn.Number, want)
		}
	})

	t.Run("AttachmentsBothWays", func(t *testing.T) {
		p.t = t
		for _, n := range []int{0, 1, 541, 542, 70000} {
			plain := bytes.Repeat([]byte{byte(n)}, n)
			key := NewAttachmentKey()
			// Go encrypts, TS decrypts.
			var ct bytes.Buffer
			digest, err := EncryptAttachment(&ct, bytes.NewReader(plain), int64(n), key)
			if err != nil {
				t.Fatal(err)
			}
			var r struct {
				Plain []byte `json:"plain"`
			}
			p.must(&r, "attachDecrypt", "", map[string]any{"data": ct.Bytes(), "key": key, "digest": digest, "size": n})
			if !bytes.Equal(r.Plain, plain) {
				t.Fatalf("size %d: ts decrypts %d bytes", n, len(r.Plain))
			}
			bad := bytes.Clone(ct.Bytes())
			bad[len(bad)/2] ^= 1
			err = p.call(nil, "attachDecrypt", "", map[string]any{"data": bad, "key": key, "digest": digest, "size": n})
			wantCode(t, err, "attachment_digest")
			// TS encrypts, Go decrypts; the size bucket is the same.
			var enc struct {
				Data   []byte `json:"data"`
				Digest []byte `json:"digest"`
			}
			p.must(&enc, "attachEncrypt", "", map[string]any{"plain": plain, "key": key})
			if int64(len(enc.Data)) != EncryptedSize(int64(n)) {
				t.Fatalf("size %d: ts wrote %d bytes, go's bucket is %d", n, len(enc.Data), EncryptedSize(int64(n)))
			}
			var out bytes.Buffer
			if err := DecryptAttachment(&out, bytes.NewReader(enc.Data), int64(len(enc.Data)), key, enc.Digest, int64(n)); err != nil {
				t.Fatalf("size %d: go decrypts the TS attachment: %v", n, err)
			}
			if !bytes.Equal(out.Bytes(), plain) {
				t.Fatalf("size %d: go decrypts other bytes", n)
			}
		}
	})

	t.Run("XEdDSABothWays", func(t *testing.T) {
		p.t = t
		for i := 0; i < 10; i++ {
			kp := GenerateKeyPair()
			msg := []byte(strings.Repeat("m", i*7))
			var s struct {
				Sig []byte `json:"sig"`
			}
			p.must(&s, "sign", "", map[string]any{"priv": kp.Private[:], "msg": msg})
			if !kp.Public.Verify(msg, s.Sig) {
				t.Fatalf("go does not verify a TS signature (round %d)", i)
			}
			sig := kp.Private.Sign(msg)
			var v struct {
				OK bool `json:"ok"`
			}
			p.must(&v, "verify", "", map[string]any{"pub": kp.Public.Bytes(), "msg": msg, "sig": sig[:]})
			if !v.OK {
				t.Fatalf("ts does not verify a Go signature (round %d)", i)
			}
			sig[3] ^= 1
			p.must(&v, "verify", "", map[string]any{"pub": kp.Public.Bytes(), "msg": msg, "sig": sig[:]})
			if v.OK {
				t.Fatal("ts verifies a corrupted signature")
			}
		}
	})
}

// nil2 gives mustEncrypt the address of a TS device.
func nil2(d *tsDev) *testDev { return &testDev{Device: &Device{self: d.addr}} }
