package clustertest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/protocol"
)

// pushNote is one notification request the local APNs answered.
type pushNote struct {
	conv, seq    uint64
	count, badge int
}

// apnsRecorder is a local APNs (HTTP/2, TLS) that accepts every request on
// the APNs contract and records it per device token, in arrival order. A
// request for a conversation in hold is recorded and then left unanswered
// until release (or until its sender goes away): a notification in
// flight.
type apnsRecorder struct {
	srv *httptest.Server
	ca  string // its certificate, PEM (the processes' SSL_CERT_FILE)

	mu      sync.Mutex
	notes   map[string][]pushNote // token → requests, in order
	bad     []string              // requests off the contract
	hold    map[uint64]bool       // conversations whose requests wait for release
	held    map[uint64]pushNote   // conversation → its first request held
	heldTok map[uint64]string     // … and that request's token
	release chan struct{}
}

func startAPNs(t *testing.T) *apnsRecorder {
	t.Helper()
	a := &apnsRecorder{notes: map[string][]pushNote{}, hold: map[uint64]bool{}, held: map[uint64]pushNote{},
		heldTok: map[uint64]string{}, release: make(chan struct{})}
	a.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return // cut short by a kill: a request the provider never had whole
		}
		var p struct {
			APS struct {
				Badge int `json:"badge"`
			} `json:"aps"`
			Conv  string `json:"conv_id"`
			Seq   uint64 `json:"seq"`
			Count int    `json:"count"`
		}
		token, ok := strings.CutPrefix(r.URL.Path, "/3/device/")
		err = json.Unmarshal(body, &p)
		var conv uint64
		if err == nil {
			conv, err = strconv.ParseUint(p.Conv, 10, 64)
		}
		a.mu.Lock()
		if r.ProtoMajor != 2 || !ok || err != nil || r.Header.Get("apns-collapse-id") != "c"+strconv.FormatUint(conv, 36) ||
			!strings.HasPrefix(r.Header.Get("authorization"), "bearer ") {
			a.bad = append(a.bad, fmt.Sprintf("%s %s %v %s", r.Proto, r.URL.Path, r.Header, body))
			a.mu.Unlock()
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		n := pushNote{conv: conv, seq: p.Seq, count: p.Count, badge: p.APS.Badge}
		a.notes[token] = append(a.notes[token], n)
		hold, release := a.hold[conv], a.release
		if _, ok := a.held[conv]; hold && !ok {
			a.held[conv], a.heldTok[conv] = n, token
		}
		a.mu.Unlock()
		if hold {
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("apns-id", "00000000-0000-4000-8000-000000000001")
	}))
	a.srv.EnableHTTP2 = true
	a.srv.StartTLS()
	t.Cleanup(func() {
		a.releaseAll()
		a.srv.Close()
	})
	a.ca = filepath.Join(t.TempDir(), "apns-ca.pem")
	if err := os.WriteFile(a.ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return a
}

// holdConvs leaves the requests of convs unanswered until releaseAll.
func (a *apnsRecorder) holdConvs(convs []uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range convs {
		a.hold[c] = true
	}
}

// releaseAll answers the requests held and stops holding.
func (a *apnsRecorder) releaseAll() {
	a.mu.Lock()
	defer a.mu.Unlock()
	clear(a.hold)
	select {
	case <-a.release:
	default:
		close(a.release)
	}
}

// heldFor returns the first request held for conv, if one arrived.
func (a *apnsRecorder) heldFor(conv uint64) (string, pushNote, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	n, ok := a.held[conv]
	return a.heldTok[conv], n, ok
}

// of returns the notifications of conv sent to token, in arrival order.
func (a *apnsRecorder) of(token string, conv uint64) []pushNote {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []pushNote
	for _, n := range a.notes[token] {
		if n.conv == conv {
			out = append(out, n)
		}
	}
	return out
}

// waitNotified waits until each of tokens has had a notification of each
// of convs for its seq want(conv).
func waitNotified(t *testing.T, a *apnsRecorder, tokens []string, convs []uint64, want func(uint64) uint64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var missing []string
		for _, tok := range tokens {
			for _, conv := range convs {
				if ns := a.of(tok, conv); want(conv) > 0 && (len(ns) == 0 || ns[len(ns)-1].seq < want(conv)) {
					missing = append(missing, fmt.Sprintf("%s/%d (seq %d)", tok, conv, want(conv)))
				}
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("never notified: %v", missing)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pushConfig writes a configuration with APNs pointed at a and push's
// timings shortened, and returns its path. The per-device rate limit is
// lifted (a device of the kill -9 test gets notifications of many groups
// within a minute, past the default 20, which it would hold for the next
// minute; the limit has tests of its own).
func pushConfig(t *testing.T, a *apnsRecorder, burst, collapseMax time.Duration) string {
	t.Helper()
	dir := t.TempDir()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	kb, _ := x509.MarshalPKCS8PrivateKey(k)
	keyFile := filepath.Join(dir, "apns.p8")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`push:
  burst: %s
  collapse_max: %s
  min_backoff: 20ms
  max_backoff: 200ms
  device_rate: 10000
  apns:
    key_file: %s
    key_id: KEYID12345
    team_id: TEAMID1234
    url: %s
    sandbox_url: %s
`, burst, collapseMax, keyFile, a.srv.URL, a.srv.URL)
	path := filepath.Join(dir, "parley.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// registerAPNs registers user's APNs tokens (one device each) and
// disconnects, leaving the user offline.
func registerAPNs(t *testing.T, c *Cluster, user string, tokens ...string) {
	t.Helper()
	for _, tok := range tokens {
		rc, err := dialRaw(c, c.Gateways[0], user, "phone-"+tok)
		if err != nil {
			t.Fatal(err)
		}
		r, err := rc.call(protocol.Frame{Type: protocol.TypePushRegister, Push: &protocol.PushRegistration{Provider: protocol.PushAPNs, Token: tok, Topic: "im.parley.cluster"}}, 20*time.Second)
		rc.close()
		if err != nil || r.Type != protocol.TypePush {
			t.Fatalf("push_register %s/%s: %v %s", user, tok, err, frameString(r))
		}
	}
}

// TestClusterKill9PushNotifications is the cluster twin of the crash
// test's TestKill9PushNotifications: the pusher's queue is JetStream, each
// partition's notifications sent by the chat process owning it. Users
// whose devices are all offline have APNs registrations: carol two
// devices, in every group; dave one, in the flooded group only. Four
// senders flood one group without pause while bob sends to the other
// groups in turn; then bob sends one last message to each group of the
// chat process owning the flood, and once their notifications are in
// flight (the local APNs holds them unanswered) that process is killed
// with SIGKILL, mid-flood, and not started again. Against the local APNs
// (HTTP/2, TLS, on the APNs contract):
//
//   - nothing is lost: each device's last notification of each group is
//     for the group's last stored message, counting every message of the
//     group as unread (the users read nothing); every notification's count
//     is at least its seq and its badge at least its count (dave's, in one
//     group, equals it);
//   - nothing is duplicated beyond at-least-once with collapse: per device
//     and group the seqs notified only rise, and a seq is requested twice
//     only as the very next request to that device for that group, only in
//     a group the killed process owned, at most once per device and group
//     (one attempt in flight per group at the kill); every request carries
//     its group's collapse id, so the device shows such a repeat once. The
//     notifications held in flight at the kill are each requested again
//     exactly so by the new owner;
//   - the flood is collapsed: dave's device gets far fewer notifications
//     than the group has messages.
func TestClusterKill9PushNotifications(t *testing.T) {
	const (
		burst       = 100 * time.Millisecond
		collapseMax = time.Second
	)
	apns := startAPNs(t)
	cfg := pushConfig(t, apns, burst, collapseMax)
	c := Start(t, Options{Gateways: 1, Chats: 2, Extra: []string{"--config", cfg}, Env: []string{"SSL_CERT_FILE=" + apns.ca}})
	time.Sleep(3 * time.Second) // the partitions spread over both chat processes

	carol, dave := []string{"c1c1", "c2c2"}, "d1d1"
	registerAPNs(t, c, "carol", carol...)
	registerAPNs(t, c, "dave", dave)
	alice := dial(t, c, c.Gateways[0], "alice", "d")
	var groups []uint64
	owners := map[string][]uint64{}
	for i := 0; i < 40 && (len(owners) < 2 || len(groups) < 6); i++ {
		conv := must(t, alice.call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: fmt.Sprint("g", i), Members: []string{"bob", "carol"}}), protocol.TypeConv).Conv.ConvID
		node, _ := c.waitOwner(conv, "", 10*time.Second)
		groups = append(groups, conv)
		owners[node] = append(owners[node], conv)
	}
	if len(owners) < 2 {
		t.Fatalf("owners %v: the partitions did not spread over both chat processes", owners)
	}
	victimName, _ := c.owner(groups[0])
	victim := c.chat(victimName)
	// Four senders flood one group: a message every few milliseconds,
	// whatever one send's round trip is on a loaded machine.
	flooders := []string{"alice", "erin", "frank", "gina"}
	var flood uint64
	for i := 0; i < 40 && flood == 0; i++ {
		conv := must(t, alice.call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: fmt.Sprint("flood", i), Members: append([]string{"carol", "dave"}, flooders[1:]...)}), protocol.TypeConv).Conv.ConvID
		if node, _ := c.waitOwner(conv, "", 10*time.Second); node == victimName {
			flood = conv
		}
	}
	if flood == 0 {
		t.Fatalf("no flood group in %s's partitions", victimName)
	}
	pending := owners[victimName] // the killed process's groups besides the flood
	owners[victimName] = append(slices.Clone(pending), flood)
	victimOwned := map[uint64]bool{}
	for _, conv := range owners[victimName] {
		victimOwned[conv] = true
	}

	// The flooders send to their group without pause until the end; bob
	// sends to the other groups in turn for a while. Each retries an
	// unacknowledged send with its client_msg_id.
	got := newAcked()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	stopFlood, stopBob := make(chan struct{}), make(chan struct{})
	var flooding, bobbing sync.WaitGroup
	for _, u := range flooders {
		flooding.Go(func() { rawSender(ctx, c, u, []uint64{flood}, got, stopFlood, 0) })
	}
	bobbing.Go(func() { rawSender(ctx, c, "bob", groups, got, stopBob, 0) })
	time.Sleep(1500 * time.Millisecond)
	close(stopBob)
	bobbing.Wait()

	// Once bob's groups are notified up to date, his last message to each
	// of the killed process's groups: its notification is held in flight
	// at the APNs (the first of carol's devices answered never) when the
	// process dies, so its new owner must send it again.
	waitNotified(t, apns, carol, pending, got.maxSeq, 30*time.Second)
	apns.holdConvs(pending)
	final := map[uint64]uint64{}
	bob, err := dialRaw(c, c.Gateways[0], "bob", "last")
	if err != nil {
		t.Fatal(err)
	}
	for _, conv := range pending {
		cmid := fmt.Sprint("bob-last-", conv)
		r, err := bob.call(protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: cmid, Body: "last"}, 20*time.Second)
		if err != nil || r.Type != protocol.TypeAck {
			t.Fatalf("bob's last message to %d: %v %s", conv, err, frameString(r))
		}
		got.record(conv, r.Seq, cmid)
		final[conv] = r.Seq
	}
	bob.close()
	for deadline := time.Now().Add(30 * time.Second); ; {
		n := 0
		for _, conv := range pending {
			if _, h, ok := apns.heldFor(conv); ok {
				if h.seq != final[conv] {
					t.Fatalf("group %d: the request held is for seq %d, want bob's last message's %d", conv, h.seq, final[conv])
				}
				n++
			}
		}
		if n == len(pending) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d last notifications of %s's groups never requested", len(pending)-n, len(pending), victimName)
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.Kill9(victim) // mid-flood, with those notifications in flight
	killed := time.Now()
	apns.releaseAll()
	c.waitOwner(flood, victimName, 30*time.Second)
	t.Logf("%s killed; its partitions taken over after %v", victimName, time.Since(killed).Round(time.Millisecond))
	time.Sleep(1500 * time.Millisecond)
	close(stopFlood)
	flooding.Wait()
	cancel()

	hist := map[uint64][]protocol.Message{}
	last := map[uint64]uint64{}
	for _, conv := range append([]uint64{flood}, groups...) {
		msgs, err := readHistory(c, "alice", conv)
		if err != nil {
			t.Fatal(err)
		}
		hist[conv] = msgs
		if len(msgs) > 0 {
			last[conv] = msgs[len(msgs)-1].Seq
		}
	}
	verifyStored(t, hist, got)

	// Every device's last notification of each of its groups is for the
	// group's last stored message.
	devices := map[string][]uint64{dave: {flood}}
	for _, tok := range carol {
		devices[tok] = append([]uint64{flood}, groups...)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var missing []string
		for tok, convs := range devices {
			for _, conv := range convs {
				if last[conv] == 0 {
					continue
				}
				if ns := apns.of(tok, conv); len(ns) == 0 || ns[len(ns)-1].seq < last[conv] {
					missing = append(missing, fmt.Sprintf("%s/%d (last seq %d)", tok, conv, last[conv]))
				}
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			survivor := c.Chats[0]
			if survivor == victim {
				survivor = c.Chats[1]
			}
			t.Fatalf("last messages never notified: %v\n%s\nsurvivor's log:\n%s", missing,
				c.Metrics(survivor, "parley_push_"), tail(c.Log(survivor), 3000))
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second) // anything sent again after the last arrives now

	apns.mu.Lock()
	bad := apns.bad
	apns.mu.Unlock()
	if len(bad) > 0 {
		t.Fatalf("requests off the APNs contract: %v", bad)
	}
	var carolUnread int
	for _, g := range devices[carol[0]] {
		carolUnread += int(last[g])
	}
	for tok, convs := range devices {
		for _, conv := range convs {
			ns := apns.of(tok, conv)
			if len(ns) == 0 {
				if last[conv] != 0 {
					t.Fatalf("device %s, group %d: no notification", tok, conv)
				}
				continue
			}
			repeats := 0
			for i, n := range ns {
				if n.count < int(n.seq) || n.count > int(last[conv]) || n.badge < n.count || n.badge > carolUnread || (tok == dave && n.badge != n.count) {
					t.Fatalf("device %s, group %d: notification %+v: want seq <= count <= %d (every message unread), count <= badge <= %d%s",
						tok, conv, n, last[conv], carolUnread, map[bool]string{true: ", badge = count (one group)"}[tok == dave])
				}
				if i == 0 {
					continue
				}
				switch prev := ns[i-1].seq; {
				case n.seq < prev:
					t.Fatalf("device %s, group %d: seq %d notified after %d: %v", tok, conv, n.seq, prev, ns)
				case n.seq == prev:
					repeats++ // sent again by the new owner: same collapse id
				}
			}
			if end := ns[len(ns)-1]; end.seq != last[conv] || end.count != int(last[conv]) {
				t.Fatalf("device %s, group %d: last notification %+v, want seq = count = %d (the last stored message, all unread)", tok, conv, end, last[conv])
			}
			if allowed := map[bool]int{true: 1}[victimOwned[conv]]; repeats > allowed {
				t.Fatalf("device %s, group %d (owned by the killed process: %v): %d repeated notifications, at most %d allowed: %v",
					tok, conv, victimOwned[conv], repeats, allowed, ns)
			}
			if tok2, h, ok := apns.heldFor(conv); ok && tok2 == tok && (repeats != 1 || ns[len(ns)-2].seq != h.seq) {
				t.Fatalf("device %s, group %d: seq %d was in flight at the kill, want it requested again once, right after: %v", tok, conv, h.seq, ns)
			}
			if conv == flood || repeats > 0 {
				t.Logf("device %s, group %d: %d notifications for %d messages, %d repeated after the kill", tok, conv, len(ns), last[conv], repeats)
			}
		}
	}
	// The flood collapses: under a message every few milliseconds with
	// burst 100ms, a notification goes out about once per collapse_max and
	// at each pause (the takeover); a quarter of the messages is a bound
	// no collapsing pusher comes near.
	if last[flood] < 40 {
		t.Fatalf("only %d messages in the flood: too few to judge collapsing", last[flood])
	}
	if ns := apns.of(dave, flood); len(ns)*4 > int(last[flood]) {
		t.Fatalf("the flood was not collapsed: %d notifications for %d messages", len(ns), last[flood])
	}
}
