package crashtest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/protocol"
)

// TestKill9PushNotifications kills the server with SIGKILL twice while
// clients send to a group whose third member is offline with two APNs
// registrations, the second time with notifications in flight, and checks
// against a local APNs (HTTP/2, TLS) that nothing is lost — each device's
// last notification is for the group's last acknowledged message, with
// seqs only rising — and nothing is duplicated beyond the attempts in
// flight at a kill, which carry the same apns-collapse-id (the device
// shows them once).
func TestKill9PushNotifications(t *testing.T) {
	if testing.Short() {
		t.Skip("crash cycles take ~15s")
	}
	var (
		mu   sync.Mutex
		seqs = map[string][]uint64{} // token → seqs notified, in order
		bad  []string
	)
	apns := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return // cut short by a kill: a request the provider never had whole
		}
		var p struct {
			Seq  uint64 `json:"seq"`
			Conv string `json:"conv_id"`
		}
		mu.Lock()
		defer mu.Unlock()
		token, ok := strings.CutPrefix(r.URL.Path, "/3/device/")
		if r.ProtoMajor != 2 || !ok || json.Unmarshal(body, &p) != nil || r.Header.Get("apns-collapse-id") != "c"+func() string {
			c, _ := strconv.ParseUint(p.Conv, 10, 64)
			return strconv.FormatUint(c, 36)
		}() || !strings.HasPrefix(r.Header.Get("authorization"), "bearer ") {
			bad = append(bad, fmt.Sprintf("%s %s %v %s", r.Proto, r.URL.Path, r.Header, body))
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		seqs[token] = append(seqs[token], p.Seq)
		w.Header().Set("apns-id", "00000000-0000-4000-8000-000000000001")
	}))
	apns.EnableHTTP2 = true
	apns.StartTLS()
	defer apns.Close()

	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: apns.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	kb, _ := x509.MarshalPKCS8PrivateKey(k)
	keyFile := filepath.Join(dir, "apns.p8")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(dir, "parley.yaml")
	cfg := fmt.Sprintf(`push:
  burst: 20ms
  collapse_max: 200ms
  min_backoff: 20ms
  max_backoff: 200ms
  device_rate: 10000
  apns:
    key_file: %s
    key_id: KEYID12345
    team_id: TEAMID1234
    url: %s
    sandbox_url: %s
`, keyFile, apns.URL, apns.URL)
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	n := &node{t: t, addr: freeAddr(t), dataDir: t.TempDir(), keyHex: hex.EncodeToString(key), args: []string{"--config", cfgFile},
		env: []string{"SSL_CERT_FILE=" + ca}}
	n.start()

	off, err := n.dial("p2")
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range []string{"a1a1", "b2b2"} {
		r, err := off.call(protocol.Frame{Type: protocol.TypePushRegister, Push: &protocol.PushRegistration{Provider: protocol.PushAPNs, Token: tok, Topic: "im.parley.crash"}})
		if err != nil || r.Type != protocol.TypePush {
			t.Fatalf("push_register: %v %+v", err, r)
		}
	}
	off.ws.Close()
	admin, err := n.dial("p0")
	if err != nil {
		t.Fatal(err)
	}
	group, err := admin.call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: "push", Members: []string{"p1", "p2"}})
	if err != nil || group.Type != protocol.TypeConv {
		t.Fatalf("create group: %v %+v", err, group)
	}
	admin.ws.Close()
	conv := group.Conv.ConvID

	got := &acked{seqs: map[uint64]map[uint64]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, u := range []string{"p0", "p1"} {
		wg.Go(func() { sender(ctx, n, u, []uint64{conv}, got, stop) })
	}
	time.Sleep(1500 * time.Millisecond)
	n.kill9()
	n.start()
	time.Sleep(1500 * time.Millisecond)
	n.kill9() // notifications in flight
	n.start()
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	defer n.stop()
	got.mu.Lock()
	if got.err != nil {
		t.Fatal(got.err)
	}
	var last uint64
	for seq := range got.seqs[conv] {
		last = max(last, seq)
	}
	acks := len(got.seqs[conv])
	got.mu.Unlock()
	if acks < 20 {
		t.Fatalf("only %d messages acknowledged", acks)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		done := true
		for _, tok := range []string{"a1a1", "b2b2"} {
			s := seqs[tok]
			done = done && len(s) > 0 && s[len(s)-1] >= last
		}
		mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			mu.Lock()
			t.Fatalf("the last acknowledged message (seq %d) was not notified: %v", last, seqs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Fatalf("requests off the APNs contract: %v", bad)
	}
	for tok, s := range seqs {
		dups := 0
		for i := 1; i < len(s); i++ {
			switch {
			case s[i] == s[i-1]:
				dups++ // an attempt in flight at a kill, sent again
			case s[i] < s[i-1]:
				t.Fatalf("device %s: seq %d notified after %d: %v", tok, s[i], s[i-1], s)
			}
		}
		if dups > 2 {
			t.Fatalf("device %s: %d repeated notifications (two kills): %v", tok, dups, s)
		}
		t.Logf("device %s: %d notifications for %d messages (last seq %d), %d repeated after a kill", tok, len(s), acks, last, dups)
	}
}
