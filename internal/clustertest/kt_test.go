package clustertest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/note"

	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/protocol"
	pkt "github.com/parley-im/parley/protocol/kt"
)

// ktAccounts holds each user's account key: a user's devices share it.
var ktAccounts sync.Map // user → exported account key

// firstUpload is a device's first keys_upload (no one-time keys),
// certified by its user's account key.
func firstUpload(user, device string) (protocol.KeyUpload, error) {
	d, err := e2ee.OpenDevice(e2ee.NewMemoryStore(), e2ee.Address{User: user, Device: device})
	if err != nil {
		return protocol.KeyUpload{}, err
	}
	up, err := d.GenerateKeys(0)
	if err != nil {
		return protocol.KeyUpload{}, err
	}
	b, _ := ktAccounts.LoadOrStore(user, e2ee.MarshalAccountKey(e2ee.GenerateKeyPair()))
	if _, err := d.ImportAccountKey(b.([]byte)); err != nil {
		return protocol.KeyUpload{}, err
	}
	ak, sig, err := d.DeviceCertificate()
	if err != nil {
		return protocol.KeyUpload{}, err
	}
	return protocol.KeyUpload{RegistrationID: up.RegistrationID, IdentityKey: up.IdentityKey.Bytes(), AccountKey: ak.Bytes(), DeviceSig: sig,
		SignedPreKey:  &protocol.PreKey{ID: up.SignedPreKey.ID, Key: up.SignedPreKey.Key.Bytes(), Sig: up.SignedPreKey.Sig},
		LastResortKEM: &protocol.PreKey{ID: up.LastResortKEM.ID, Key: up.LastResortKEM.Key, Sig: up.LastResortKEM.Sig}}, nil
}

func getKT(g *Proc, path string, into any) error {
	resp, err := http.Get("http://" + g.Addr + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s %s", path, resp.Status, body)
	}
	return json.Unmarshal(body, into)
}

// TestKTOneLogAcrossChatProcesses: users publishing their devices at once
// through two gateways, the uploads spread over two chat processes, get
// one key transparency log: both processes started on one key set, every
// change is one leaf (no fork, no duplicate, no gap), the auditor accepts
// the whole log, and every checkpoint either process gave out is a prefix
// of it.
func TestKTOneLogAcrossChatProcesses(t *testing.T) {
	c := Start(t, Options{Gateways: 2, Chats: 2})
	const users = 24
	var (
		mu    sync.Mutex
		heads []string
		wg    sync.WaitGroup
	)
	for u := range users {
		wg.Add(1)
		go func() {
			defer wg.Done()
			user := fmt.Sprintf("kt%02d", u)
			for i, device := range []string{"phone", "laptop"} {
				conn, err := dialRaw(c, c.Gateways[(u+i)%2], user, device)
				if err != nil {
					t.Error(err)
					return
				}
				defer conn.close()
				k, err := firstUpload(user, device)
				if err != nil {
					t.Error(err)
					return
				}
				f, err := conn.call(protocol.Frame{Type: protocol.TypeKeysUpload, Keys: &k}, 20*time.Second)
				if err != nil || f.Type != protocol.TypeKeys {
					t.Errorf("%s/%s upload: %+v, %v", user, device, f, err)
					return
				}
				f, err = conn.call(protocol.Frame{Type: protocol.TypeKeysDevices, UserID: user}, 20*time.Second)
				if err != nil || f.Type != protocol.TypeDevices || f.KT == nil || len(f.KT.Entry) == 0 {
					t.Errorf("%s devices: %+v, %v", user, f, err)
					return
				}
				mu.Lock()
				heads = append(heads, f.KT.Checkpoint)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	var keys [2]protocol.KTKeys
	for i, g := range c.Gateways {
		if err := getKT(g, "/v1/kt/keys", &keys[i]); err != nil {
			t.Fatal(err)
		}
	}
	if keys[0].NoteKey != keys[1].NoteKey || string(keys[0].VRFKey) != string(keys[1].VRFKey) {
		t.Fatalf("two chat processes serve two key sets: %+v, %+v", keys[0], keys[1])
	}
	v, err := note.NewVerifier(keys[0].NoteKey)
	if err != nil {
		t.Fatal(err)
	}
	a := pkt.NewAuditor()
	var head protocol.KTProof
	if err := getKT(c.Gateways[1], "/v1/kt/checkpoint", &head); err != nil {
		t.Fatal(err)
	}
	cp, err := pkt.OpenCheckpoint(v, []byte(head.Checkpoint))
	if err != nil {
		t.Fatal(err)
	}
	for a.Size() < cp.Size {
		var page protocol.KTProof
		if err := getKT(c.Gateways[a.Size()%2], fmt.Sprintf("/v1/kt/leaves?from=%d&limit=7", a.Size()), &page); err != nil {
			t.Fatal(err)
		}
		if err := a.Feed(page.Entries); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Check(cp); err != nil {
		t.Fatalf("audit: %v", err)
	}
	if cp.Size != 2*users || a.Labels() != users {
		t.Fatalf("log of %d leaves under %d labels; want %d changes of %d users, each once", cp.Size, a.Labels(), 2*users, users)
	}
	for _, h := range heads {
		hc, err := pkt.OpenCheckpoint(v, []byte(h))
		if err != nil {
			t.Fatal(err)
		}
		if root, _ := a.Tree().RootAt(hc.Size); root != hc.Root {
			t.Fatalf("a checkpoint of %d leaves given out is not a prefix of the log", hc.Size)
		}
	}
}
