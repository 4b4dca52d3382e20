package e2eechat

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gorilla/websocket"
	"golang.org/x/mod/sumdb/note"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
	"github.com/parley-im/parley/protocol/e2ekeys"
	"github.com/parley-im/parley/protocol/kt"
)

// The key transparency tests play a malicious server as a real node behind
// a WebSocket relay (evilServer): the node does everything it does, the
// relay answers the key transparency frames itself from logs the test
// keeps (evilLog, one per victim when the server shows a split view) and
// rewrites the answers it chooses (a ghost device in a devices answer).
// The SDK clients pin the relay's log keys, as they would a server's.

// evilLog is one history of the key directory a malicious server shows:
// a real log in form (VRF labels, version chains, signed checkpoints), with
// whatever entries the test puts in it.
type evilLog struct {
	keys *evilKeys

	mu     sync.Mutex
	tree   *kt.Tree
	leaves [][]byte
	latest map[string]int // user → index of the user's latest entry
	time   int64
}

// evilKeys are the malicious server's log keys.
type evilKeys struct {
	signer note.Signer
	pub    protocol.KTKeys
	vrf    *kt.VRFPrivateKey
}

func newEvilKeys(t testing.TB) *evilKeys {
	t.Helper()
	skey, vkey, err := note.GenerateKey(rand.Reader, "evil.example/kt")
	if err != nil {
		t.Fatal(err)
	}
	s, err := note.NewSigner(skey)
	if err != nil {
		t.Fatal(err)
	}
	v, err := kt.GenerateVRFKey()
	if err != nil {
		t.Fatal(err)
	}
	pub := v.Public()
	return &evilKeys{signer: s, vrf: v, pub: protocol.KTKeys{Origin: s.Name(), NoteKey: vkey, VRFKey: pub[:]}}
}

func newEvilLog(k *evilKeys) *evilLog {
	return &evilLog{keys: k, tree: kt.NewTree(), latest: map[string]int{}}
}

// clone is a copy of the log as it stands (the start of a fork).
func (l *evilLog) clone() *evilLog {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.prefix(len(l.leaves))
}

// prefix is a copy of the log's first n leaves (a server restarted on an
// old copy of its store); l.mu is held.
func (l *evilLog) prefix(n int) *evilLog {
	c := newEvilLog(l.keys)
	c.time = l.time
	for i, b := range l.leaves[:n] {
		c.leaves = append(c.leaves, b)
		c.tree.Append(b)
		for u, j := range l.latest {
			if j == i {
				c.latest[u] = i
			}
		}
	}
	// A user whose latest entry is past n has an earlier one in the prefix.
	for u := range l.latest {
		if _, ok := c.latest[u]; ok {
			continue
		}
		label, _ := kt.LabelFor(l.keys.vrf, u)
		for i := n - 1; i >= 0; i-- {
			if e, _ := kt.UnmarshalEntry(l.leaves[i]); e.Label == label {
				c.latest[u] = i
				break
			}
		}
	}
	return c
}

// set appends an entry for user with this state unless it is the user's
// latest already.
func (l *evilLog) set(user string, account []byte, devices []kt.EntryDevice) {
	l.mu.Lock()
	defer l.mu.Unlock()
	devices = slices.Clone(devices)
	slices.SortFunc(devices, func(a, b kt.EntryDevice) int { return strings.Compare(a.ID, b.ID) })
	label, _ := kt.LabelFor(l.keys.vrf, user)
	e := kt.Entry{Label: label, Version: 1, Account: account, Devices: devices}
	if i, ok := l.latest[user]; ok {
		prev, _ := kt.UnmarshalEntry(l.leaves[i])
		cand := e
		cand.Label, cand.Version, cand.Prev, cand.Time = prev.Label, prev.Version, prev.Prev, prev.Time
		if cand.Equal(prev) {
			return
		}
		e.Version, e.Prev = prev.Version+1, kt.EntryHash(l.leaves[i])
	}
	l.time++
	e.Time = l.time
	if err := e.Validate(); err != nil {
		panic(err)
	}
	b := e.Marshal()
	l.latest[user] = len(l.leaves)
	l.leaves = append(l.leaves, b)
	l.tree.Append(b)
}

func (l *evilLog) size() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return uint64(len(l.leaves))
}

// checkpointLocked signs the current checkpoint; l.mu is held.
func (l *evilLog) checkpointLocked() string {
	c := kt.Checkpoint{Origin: l.keys.pub.Origin, Size: uint64(len(l.leaves)), Root: l.tree.Root()}
	text, err := kt.SignCheckpoint(l.keys.signer, c)
	if err != nil {
		panic(err)
	}
	return string(text)
}

// proofFor is the kt object of a bundles or devices answer for user.
func (l *evilLog) proofFor(user string) *protocol.KTProof {
	l.mu.Lock()
	defer l.mu.Unlock()
	label, proof := kt.LabelFor(l.keys.vrf, user)
	p := &protocol.KTProof{Checkpoint: l.checkpointLocked(), Label: label[:], VRFProof: proof}
	if i, ok := l.latest[user]; ok {
		p.Index, p.Entry = uint64(i), slices.Clone(l.leaves[i])
		p.Proof, _ = l.tree.InclusionProof(uint64(i), uint64(len(l.leaves)))
	}
	return p
}

// answer answers a key transparency request from this log.
func (l *evilLog) answer(req protocol.Frame) protocol.Frame {
	l.mu.Lock()
	defer l.mu.Unlock()
	size := uint64(len(l.leaves))
	bad := func(msg string) protocol.Frame {
		return protocol.Frame{Type: protocol.TypeError, RID: req.RID, Code: protocol.CodeInvalidArgument, Error: msg}
	}
	switch req.Type {
	case protocol.TypeKTKeys:
		k := l.keys.pub
		return protocol.Frame{Type: protocol.TypeKTKeys, RID: req.RID, KTKeys: &k}
	case protocol.TypeKTConsistency:
		if req.To > size {
			return bad("to is past the log")
		}
		p, err := l.tree.ConsistencyProof(req.From, req.To)
		if err != nil {
			return bad(err.Error())
		}
		return protocol.Frame{Type: protocol.TypeKTProof, RID: req.RID, KT: &protocol.KTProof{Checkpoint: l.checkpointLocked(), Proof: p}}
	case protocol.TypeKTLeaves:
		if req.From > size {
			return bad("from is past the log")
		}
		n := uint64(req.Limit)
		if n == 0 {
			n = protocol.MaxKTLeaves
		}
		end := min(size, req.From+n)
		return protocol.Frame{Type: protocol.TypeKTLeaves, RID: req.RID, KT: &protocol.KTProof{
			Checkpoint: l.checkpointLocked(), From: req.From, Entries: l.leaves[req.From:end]}}
	}
	panic("not a key transparency request: " + req.Type)
}

// syncFrom makes the log's entry for user match a devices answer of the
// real node (the state an honest log would hold).
func (l *evilLog) syncFrom(user string, devs []protocol.DeviceKeyInfo) {
	var account []byte
	var out []kt.EntryDevice
	for _, d := range devs {
		account = d.AccountKey
		out = append(out, kt.EntryDevice{ID: d.DeviceID, IdentityKey: d.IdentityKey, Sig: d.DeviceSig})
	}
	l.set(user, account, out)
}

// evilServer relays the WebSockets of one victim's clients to a real
// node, answering the key transparency frames from the log it shows that
// victim and attaching that log's proofs to every bundles and devices
// answer. A devices answer (after the optional rewrite) becomes the user's
// state in the log: the server logs what it shows, since clients refuse
// devices that are not in the log.
type evilServer struct {
	target string // the node's ws:// URL
	srv    *httptest.Server
	URL    string

	mu      sync.Mutex
	log     *evilLog
	rewrite func(req protocol.Frame, ans *protocol.Frame) // may change an answer of the node
	// tamper, when set, changes an answer after its proof is attached
	// (what the log does not say).
	tamper func(req protocol.Frame, ans *protocol.Frame)
	// answer, when set, may answer a keys request instead of the node (a
	// bundle of a device the node does not have).
	answer func(req protocol.Frame) (protocol.Frame, bool)
	// pages, when set, changes a kt_leaves answer of the log.
	pages func(ans *protocol.Frame)
}

func startEvilServer(t testing.TB, target string, log *evilLog) *evilServer {
	e := &evilServer{target: target, log: log}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	e.URL = "ws://" + strings.TrimPrefix(e.srv.URL, "http://")
	t.Cleanup(e.srv.Close)
	return e
}

// show makes log (and rewrite, if not nil) what the victim sees from now on.
func (e *evilServer) show(log *evilLog, rewrite func(req protocol.Frame, ans *protocol.Frame)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.log, e.rewrite = log, rewrite
}

func (e *evilServer) current() (*evilLog, func(protocol.Frame, *protocol.Frame)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.log, e.rewrite
}

func (e *evilServer) setAnswer(f func(req protocol.Frame) (protocol.Frame, bool)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.answer = f
}

func (e *evilServer) setPages(f func(ans *protocol.Frame)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pages = f
}

func (e *evilServer) setTamper(f func(req protocol.Frame, ans *protocol.Frame)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.tamper = f
}

var relayUpgrader = websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}

func (e *evilServer) serve(w http.ResponseWriter, r *http.Request) {
	up, resp, err := websocket.DefaultDialer.Dial(e.target+r.URL.Path+"?"+r.URL.RawQuery, http.Header{"Authorization": r.Header.Values("Authorization")})
	if err != nil {
		if resp != nil {
			w.WriteHeader(resp.StatusCode)
		} else {
			http.Error(w, err.Error(), http.StatusBadGateway)
		}
		return
	}
	down, err := relayUpgrader.Upgrade(w, r, nil)
	if err != nil {
		up.Close()
		return
	}
	defer up.Close()
	defer down.Close()

	var wmu sync.Mutex // both directions write to the client
	write := func(data []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		return down.WriteMessage(websocket.TextMessage, data)
	}
	var rmu sync.Mutex
	reqs := map[string]protocol.Frame{} // rid → key request, to know what an answer answers

	done := make(chan struct{})
	go func() { // node → client
		defer close(done)
		defer down.Close()
		for {
			_, data, err := up.ReadMessage()
			if err != nil {
				return
			}
			var f protocol.Frame
			if json.Unmarshal(data, &f) == nil && f.RID != "" {
				rmu.Lock()
				req, ok := reqs[f.RID]
				delete(reqs, f.RID)
				rmu.Unlock()
				if ok && (f.Type == protocol.TypeDevices || f.Type == protocol.TypeBundles) {
					data = e.keysAnswer(req, f)
				}
			}
			if write(data) != nil {
				return
			}
		}
	}()
relay:
	for { // client → node
		_, data, err := down.ReadMessage()
		if err != nil {
			break
		}
		var f protocol.Frame
		if json.Unmarshal(data, &f) == nil && f.RID != "" {
			switch f.Type {
			case protocol.TypeKTKeys, protocol.TypeKTConsistency, protocol.TypeKTLeaves:
				log, _ := e.current()
				ans := log.answer(f)
				e.mu.Lock()
				pages := e.pages
				e.mu.Unlock()
				if pages != nil && ans.Type == protocol.TypeKTLeaves {
					pages(&ans)
				}
				b, _ := json.Marshal(ans)
				if write(b) != nil {
					break relay
				}
				continue
			case protocol.TypeKeysDevices, protocol.TypeKeysBundle:
				e.mu.Lock()
				answer := e.answer
				e.mu.Unlock()
				if answer != nil {
					if ans, ok := answer(f); ok {
						if write(e.keysAnswer(f, ans)) != nil {
							break relay
						}
						continue
					}
				}
				rmu.Lock()
				reqs[f.RID] = f
				rmu.Unlock()
			}
		}
		if up.WriteMessage(websocket.TextMessage, data) != nil {
			break
		}
	}
	up.Close()
	<-done
}

// keysAnswer is what the client gets for a keys request answered by f:
// rewritten, logged (a devices answer), proven, tampered with.
func (e *evilServer) keysAnswer(req, f protocol.Frame) []byte {
	log, rewrite := e.current()
	if rewrite != nil {
		rewrite(req, &f)
	}
	if f.Type == protocol.TypeDevices {
		log.syncFrom(req.UserID, f.Devices)
	}
	f.KT = log.proofFor(req.UserID)
	e.mu.Lock()
	tamper := e.tamper
	e.mu.Unlock()
	if tamper != nil {
		tamper(req, &f)
	}
	b, _ := json.Marshal(f)
	return b
}

// devOn is startDev on a client connected through e: the same device
// store, a new connection (e's victim).
func devOn(t *testing.T, url string, srv *servertest.Server, user, device string, st *e2ee.MemoryStore) *dev {
	t.Helper()
	c, err := client.New(client.Config{URL: url, Token: srv.Token(user), Device: device})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	go func() {
		for range c.Events() {
		}
	}()
	t.Cleanup(func() { cancel(); c.Close(); <-done })
	edev, err := e2ee.OpenDevice(st, e2ee.Address{User: user, Device: device})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := edev.AccountKey(); !ok { // a reopened store keeps its own
		shareAccount(t, srv, edev)
	}
	return &dev{c: c, m: New(c, edev, st), st: st, pushed: map[uint64][]protocol.Message{}}
}

// ktEvents collects what a Messenger reports to OnKT.
type ktEvents struct {
	mu  sync.Mutex
	evs []KTEvent
}

func watchKT(m *Messenger) *ktEvents {
	w := &ktEvents{}
	m.OnKT(func(ev KTEvent) {
		w.mu.Lock()
		w.evs = append(w.evs, ev)
		w.mu.Unlock()
	})
	return w
}

func (w *ktEvents) list() []KTEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.evs)
}

// ghostBundle makes a device the server holds the keys of, and its bundle
// as a keys_bundle answer would give it.
func ghostBundle(t *testing.T, user, device string) (*e2ee.Device, protocol.KeyBundle) {
	t.Helper()
	g, err := e2ee.OpenDevice(e2ee.NewMemoryStore(), e2ee.Address{User: user, Device: device})
	if err != nil {
		t.Fatal(err)
	}
	up, err := g.GenerateKeys(1)
	if err != nil {
		t.Fatal(err)
	}
	b := protocol.KeyBundle{UserID: user, DeviceID: device, RegistrationID: up.RegistrationID, IdentityKey: up.IdentityKey.Bytes(),
		SignedPreKey: protocol.PreKey{ID: up.SignedPreKey.ID, Key: up.SignedPreKey.Key.Bytes(), Sig: up.SignedPreKey.Sig},
		PreKey:       &protocol.PreKey{ID: up.PreKeys[0].ID, Key: up.PreKeys[0].Key.Bytes()},
		KEMPreKey:    &protocol.PreKey{ID: up.KEMPreKeys[0].ID, Key: up.KEMPreKeys[0].Key, Sig: up.KEMPreKeys[0].Sig}}
	return g, b
}

// evilAccount is an account key the server made, to certify devices of a
// user the server impersonates (a client that never saw the user's real
// account key takes it on first use).
type evilAccount struct {
	kp e2ee.KeyPair

	mu    sync.Mutex
	certs map[string][]byte // one signature per certificate (XEdDSA signatures are randomized)
}

func newEvilAccount() *evilAccount {
	return &evilAccount{kp: e2ee.GenerateKeyPair(), certs: map[string][]byte{}}
}

func (a *evilAccount) key() []byte { return a.kp.Public.Bytes() }

func (a *evilAccount) cert(user, device string, identityKey []byte) []byte {
	msg := e2ekeys.DeviceCertMessage(user, device, identityKey)
	a.mu.Lock()
	defer a.mu.Unlock()
	if sig, ok := a.certs[string(msg)]; ok {
		return sig
	}
	sig := a.kp.Private.Sign(msg)
	a.certs[string(msg)] = sig[:]
	return sig[:]
}

// impersonate rewrites the devices and bundles answers for user: every
// device certified by a, and ghost (a bundle of a device the server holds)
// added to the list.
func (a *evilAccount) impersonate(user string, ghost protocol.KeyBundle) func(req protocol.Frame, ans *protocol.Frame) {
	ghost.AccountKey, ghost.DeviceSig = a.key(), a.cert(user, ghost.DeviceID, ghost.IdentityKey)
	return func(req protocol.Frame, ans *protocol.Frame) {
		if req.UserID != user {
			return
		}
		switch ans.Type {
		case protocol.TypeDevices:
			for i := range ans.Devices {
				d := &ans.Devices[i]
				d.AccountKey, d.DeviceSig = a.key(), a.cert(user, d.DeviceID, d.IdentityKey)
			}
			ans.Devices = append(ans.Devices, protocol.DeviceKeyInfo{DeviceID: ghost.DeviceID, RegistrationID: ghost.RegistrationID,
				IdentityKey: ghost.IdentityKey, AccountKey: ghost.AccountKey, DeviceSig: ghost.DeviceSig})
		case protocol.TypeBundles:
			for i := range ans.Bundles {
				b := &ans.Bundles[i]
				b.AccountKey, b.DeviceSig = a.key(), a.cert(user, b.DeviceID, b.IdentityKey)
			}
		}
	}
}

// serveGhost answers keys_bundle for user's ghost device with its bundle.
func serveGhost(user string, ghost protocol.KeyBundle) func(req protocol.Frame) (protocol.Frame, bool) {
	return func(req protocol.Frame) (protocol.Frame, bool) {
		if req.Type != protocol.TypeKeysBundle || req.UserID != user || req.DeviceID != ghost.DeviceID {
			return protocol.Frame{}, false
		}
		return protocol.Frame{Type: protocol.TypeBundles, RID: req.RID, Bundles: []protocol.KeyBundle{ghost}}, true
	}
}

// ghostReads opens, with the ghost device, the ciphertext msg carries
// for it.
func ghostReads(t *testing.T, ghost *e2ee.Device, msg protocol.Message) string {
	t.Helper()
	env, err := protocol.ParseEnvelope(msg.Body)
	if err != nil {
		t.Fatal(err)
	}
	self := ghost.Address()
	for _, to := range env.To {
		if to.User == self.User && to.Device == self.Device {
			plain, err := ghost.Decrypt(e2ee.Address{User: msg.Sender, Device: msg.SenderDevice}, e2ee.MessageType(to.Type), to.Body)
			if err != nil {
				t.Fatalf("the ghost cannot open its ciphertext: %v", err)
			}
			var c content
			if err := json.Unmarshal(plain, &c); err != nil {
				t.Fatal(err)
			}
			return c.Text
		}
	}
	return ""
}
