package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"golang.org/x/mod/sumdb/note"

	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
	pkt "github.com/parley-im/parley/protocol/kt"
)

// ktClient checks kt objects the way a client does, with the keys the
// server published (kt_keys).
type ktClient struct {
	t    *testing.T
	keys protocol.KTKeys
	v    note.Verifier
}

func newKTClient(t *testing.T, c *rawConn) *ktClient {
	t.Helper()
	f := mustOK(t, c.call(protocol.Frame{Type: protocol.TypeKTKeys}), protocol.TypeKTKeys)
	v, err := note.NewVerifier(f.KTKeys.NoteKey)
	if err != nil || v.Name() != f.KTKeys.Origin {
		t.Fatalf("kt_keys %+v: %v", f.KTKeys, err)
	}
	return &ktClient{t: t, keys: *f.KTKeys, v: v}
}

// check verifies p as the answer about user and returns its checkpoint
// and entry (ok false: the user has none).
func (k *ktClient) check(user string, p *protocol.KTProof) (pkt.Checkpoint, pkt.Entry, bool) {
	k.t.Helper()
	if p == nil {
		k.t.Fatal("answer without kt")
	}
	cp, err := pkt.OpenCheckpoint(k.v, []byte(p.Checkpoint))
	if err != nil {
		k.t.Fatalf("checkpoint: %v", err)
	}
	var pub pkt.VRFPublicKey
	copy(pub[:], k.keys.VRFKey)
	label, err := pub.VerifyLabel(user, p.VRFProof)
	if err != nil || !bytes.Equal(label[:], p.Label) {
		k.t.Fatalf("label of %s: %v", user, err)
	}
	if len(p.Entry) == 0 {
		return cp, pkt.Entry{}, false
	}
	if err := pkt.VerifyInclusion(cp, p.Index, p.Entry, p.Proof); err != nil {
		k.t.Fatalf("inclusion: %v", err)
	}
	e, err := pkt.UnmarshalEntry(p.Entry)
	if err != nil || e.Label != label {
		k.t.Fatalf("entry: %+v, %v", e, err)
	}
	return cp, e, true
}

// TestKTOverWire: the bundles and devices answers about a user carry that
// user's entry, proven in a signed checkpoint, naming every device with
// its identity key; a device added, a new identity and a device removed
// each append an entry; kt_consistency and kt_leaves let a client follow
// the log from one checkpoint to the next.
func TestKTOverWire(t *testing.T) {
	srv := servertest.Start(t)
	alice := dialRaw(t, srv, "alice", "a1")
	kc := newKTClient(t, alice)
	alice.openDirect("bob")

	f := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeKeysDevices, UserID: "bob"}), protocol.TypeDevices)
	if _, _, ok := kc.check("bob", f.KT); ok {
		t.Fatal("bob has an entry before any device")
	}
	bobPhone := dialRaw(t, srv, "bob", "phone")
	publishKeys(t, bobPhone, "bob", "phone", 3)
	f = mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeKeysBundle, UserID: "bob"}), protocol.TypeBundles)
	cp1, e, ok := kc.check("bob", f.KT)
	if !ok || e.Version != 1 || len(e.Devices) != 1 || !bytes.Equal(e.Devices[0].IdentityKey, f.Bundles[0].IdentityKey) {
		t.Fatalf("entry after the first device: %+v (bundle %+v)", e, f.Bundles)
	}

	publishKeys(t, dialRaw(t, srv, "bob", "laptop"), "bob", "laptop", 3)
	publishKeys(t, bobPhone, "bob", "phone", 3) // a new identity on the same device
	f = mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeKeysDevices, UserID: "bob"}), protocol.TypeDevices)
	cp2, e, _ := kc.check("bob", f.KT)
	if e.Version != 3 || len(e.Devices) != 2 {
		t.Fatalf("entry after a second device and a new identity: version %d, %d devices", e.Version, len(e.Devices))
	}
	for _, d := range f.Devices {
		ed, ok := e.Device(d.DeviceID)
		if !ok || !bytes.Equal(ed.IdentityKey, d.IdentityKey) {
			t.Fatalf("device %s of the answer is not in the entry as given", d.DeviceID)
		}
	}
	mustOK(t, bobPhone.call(protocol.Frame{Type: protocol.TypeKeysRemove}), protocol.TypeKeys)
	f = mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeKeysDevices, UserID: "bob"}), protocol.TypeDevices)
	cp3, e, _ := kc.check("bob", f.KT)
	if e.Version != 4 || len(e.Devices) != 1 || e.Devices[0].ID != "laptop" {
		t.Fatalf("entry after removing phone: %+v", e)
	}

	for _, pair := range [][2]pkt.Checkpoint{{cp1, cp2}, {cp2, cp3}, {cp1, cp3}} {
		p := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeKTConsistency, From: pair[0].Size, To: pair[1].Size}), protocol.TypeKTProof)
		if err := pkt.VerifyConsistency(pair[0], pair[1], p.KT.Proof); err != nil {
			t.Fatalf("consistency %d→%d: %v", pair[0].Size, pair[1].Size, err)
		}
	}
	bad := alice.call(protocol.Frame{Type: protocol.TypeKTConsistency, From: 1, To: cp3.Size + 1})
	if bad.Type != protocol.TypeError || bad.Code != protocol.CodeInvalidArgument {
		t.Fatalf("consistency past the size: %+v", bad)
	}

	a := pkt.NewAuditor()
	for {
		p := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeKTLeaves, From: a.Size(), Limit: 2}), protocol.TypeKTLeaves)
		if p.KT.From != a.Size() {
			t.Fatalf("page from %d, asked %d", p.KT.From, a.Size())
		}
		if len(p.KT.Entries) == 0 {
			break
		}
		if err := a.Feed(p.KT.Entries); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Check(cp3); err != nil || a.Size() != cp3.Size {
		t.Fatalf("audit of %d leaves: %v", a.Size(), err)
	}
}

func getJSON(t *testing.T, url string, into any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK && into != nil {
		if err := json.Unmarshal(body, into); err != nil {
			t.Fatalf("%s: %v", url, err)
		}
	}
	return resp.StatusCode
}

// TestKTPublicHTTP: an outside auditor reads the log without a token —
// keys, checkpoint, leaves, consistency proofs — and a source address past
// kt.http_burst is refused 429 with Retry-After.
func TestKTPublicHTTP(t *testing.T) {
	srv := servertest.Start(t, servertest.WithConfig(func(c *config.Config) { c.KT.HTTPBurst = 12; c.KT.HTTPRate = 0.01 }))
	for i := range 3 {
		publishKeys(t, dialRaw(t, srv, fmt.Sprintf("u%d", i), "d"), fmt.Sprintf("u%d", i), "d", 1)
	}
	var keys protocol.KTKeys
	if code := getJSON(t, srv.HTTPURL+"/v1/kt/keys", &keys); code != 200 {
		t.Fatalf("keys: %d", code)
	}
	v, err := note.NewVerifier(keys.NoteKey)
	if err != nil {
		t.Fatal(err)
	}
	var head protocol.KTProof
	if code := getJSON(t, srv.HTTPURL+"/v1/kt/checkpoint", &head); code != 200 {
		t.Fatalf("checkpoint: %d", code)
	}
	cp, err := pkt.OpenCheckpoint(v, []byte(head.Checkpoint))
	if err != nil || cp.Size != 3 {
		t.Fatalf("checkpoint %+v: %v", cp, err)
	}
	resp, err := http.Get(srv.HTTPURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), "\nparley_kt_leaves 3\n") {
		t.Fatal("/metrics has no parley_kt_leaves 3")
	}
	var page protocol.KTProof
	if code := getJSON(t, srv.HTTPURL+"/v1/kt/leaves?from=1&limit=5", &page); code != 200 || page.From != 1 || len(page.Entries) != 2 {
		t.Fatalf("leaves: %d %+v", code, page)
	}
	var first protocol.KTProof
	getJSON(t, srv.HTTPURL+"/v1/kt/leaves?limit=1", &first)
	a := pkt.NewAuditor()
	if err := a.Feed(append(first.Entries, page.Entries...)); err != nil {
		t.Fatal(err)
	}
	if err := a.Check(cp); err != nil {
		t.Fatal(err)
	}
	var cons protocol.KTProof
	if code := getJSON(t, srv.HTTPURL+"/v1/kt/consistency?from=1&to=3", &cons); code != 200 {
		t.Fatalf("consistency: %d", code)
	}
	old, _ := a.Tree().RootAt(1)
	if err := pkt.VerifyConsistency(pkt.Checkpoint{Origin: cp.Origin, Size: 1, Root: old}, cp, cons.Proof); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"/v1/kt/consistency?from=0&to=3", "/v1/kt/consistency?from=2", "/v1/kt/leaves?from=x",
		"/v1/kt/leaves?limit=1001", "/v1/kt/leaves?from=4", "/v1/kt/consistency?from=1&to=4"} {
		if code := getJSON(t, srv.HTTPURL+bad, nil); code != 400 {
			t.Errorf("%s: %d, want 400", bad, code)
		}
	}
	// 5 + 6 requests so far: the 12th is the burst's last.
	if code := getJSON(t, srv.HTTPURL+"/v1/kt/keys", nil); code != 200 {
		t.Fatalf("the burst's last request: %d", code)
	}
	resp, err = http.Get(srv.HTTPURL + "/v1/kt/keys")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("past the burst: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// TestKTOff: with kt.enabled off the answers carry no kt and the kt_*
// frames answer not_found.
func TestKTOff(t *testing.T) {
	srv := servertest.Start(t, servertest.WithConfig(func(c *config.Config) { c.KT.Enabled = false }))
	alice := dialRaw(t, srv, "alice", "a1")
	publishKeys(t, alice, "alice", "a1", 1)
	f := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeKeysDevices, UserID: "alice"}), protocol.TypeDevices)
	if f.KT != nil {
		t.Fatal("kt with key transparency off")
	}
	if f := alice.call(protocol.Frame{Type: protocol.TypeKTKeys}); f.Type != protocol.TypeError || f.Code != protocol.CodeNotFound {
		t.Fatalf("kt_keys with key transparency off: %+v", f)
	}
}
