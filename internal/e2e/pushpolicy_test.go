package e2e

import (
	"bytes"
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
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/server"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
	"github.com/parley-im/parley/protocol/schema"
)

// localAPNs is an HTTP/2 TLS server answering APNs's POST /3/device/<token>
// with 200, recording each request's token and JSON payload.
type localAPNs struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []apnsReq
}

type apnsReq struct {
	Token   string
	Payload map[string]any
	At      time.Time
}

func newLocalAPNs(t *testing.T) *localAPNs {
	a := &localAPNs{}
	a.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		token, ok := strings.CutPrefix(r.URL.Path, "/3/device/")
		var p map[string]any
		if r.ProtoMajor != 2 || !ok || json.Unmarshal(body, &p) != nil || !strings.HasPrefix(r.Header.Get("authorization"), "bearer ") {
			t.Errorf("apns: a bad request %s %s %s", r.Proto, r.URL.Path, body)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		a.mu.Lock()
		a.got = append(a.got, apnsReq{Token: token, Payload: p, At: time.Now()})
		a.mu.Unlock()
		w.Header().Set("apns-id", "00000000-0000-4000-8000-000000000001")
	}))
	a.srv.EnableHTTP2 = true
	a.srv.StartTLS()
	t.Cleanup(a.srv.Close)
	return a
}

// to returns the requests to token so far.
func (a *localAPNs) to(token string) []apnsReq {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []apnsReq
	for _, q := range a.got {
		if q.Token == token {
			out = append(out, q)
		}
	}
	return out
}

// startWithAPNs starts a node whose pusher sends to a.
func startWithAPNs(t *testing.T, a *localAPNs, tune func(*config.Config)) *servertest.Server {
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	kb, _ := x509.MarshalPKCS8PrivateKey(k)
	keyFile := filepath.Join(t.TempDir(), "apns.p8")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return servertest.Start(t, servertest.WithConfig(func(c *config.Config) {
		c.Push.APNs.KeyFile, c.Push.APNs.KeyID, c.Push.APNs.TeamID = keyFile, "KEYID12345", "TEAMID1234"
		c.Push.APNs.URL, c.Push.APNs.SandboxURL = a.srv.URL, a.srv.URL
		c.Push.Burst, c.Push.CollapseMax, c.Push.MinBackoff, c.Push.MaxBackoff = 20*time.Millisecond, 200*time.Millisecond, 20*time.Millisecond, 200*time.Millisecond
		if tune != nil {
			tune(c)
		}
	}), servertest.WithDeps(func(d *server.Deps) { d.PushClient = a.srv.Client() }))
}

// rpcUser sends frames as user's device over /v1/rpc (no session: the
// device is not connected, so its user is offline for pushes).
func rpcUser(t *testing.T, srv *servertest.Server, user, device string) func(protocol.Frame) *protocol.Frame {
	p := &pollClient{t: t, base: srv.HTTPURL, token: srv.Token(user)}
	return func(f protocol.Frame) *protocol.Frame {
		t.Helper()
		body, _ := json.Marshal(f)
		st, out := p.do("POST", "/v1/rpc?device="+device, body)
		if st != http.StatusOK {
			t.Fatalf("/v1/rpc %s: %d %s", f.Type, st, out)
		}
		if err := schema.ServerFrame(out); err != nil {
			t.Fatalf("/v1/rpc answer %s does not match protocol/schema/frames.json: %v", out, err)
		}
		var r protocol.Frame
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatal(err)
		}
		return &r
	}
}

// metric reads one sample of the node's /metrics ("name{labels}" as
// Prometheus prints it), 0 if absent.
func metric(t *testing.T, srv *servertest.Server, sample string) float64 {
	t.Helper()
	resp, err := http.Get(srv.HTTPURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte(sample+" ")); ok {
			var f float64
			fmt.Sscan(string(v), &f)
			return f
		}
	}
	return 0
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPushMuteAndDND, through a real node and a local APNs (each message
// waits for the one before to be decided: within push.burst they would
// collapse into one): bob, offline,
// mutes a group over /v1/rpc and alice's messages to it send him
// nothing (each counted as suppressed), a message naming him still does;
// unmuted, the next notification counts every unread message (his
// conv_list's unread); in do-not-disturb nothing is sent, a mention
// neither; turned off, notifications resume.
func TestPushMuteAndDND(t *testing.T) {
	a := newLocalAPNs(t)
	srv := startWithAPNs(t, a, nil)
	bob := rpcUser(t, srv, "bob", "phone")
	mustOK(t, bob(protocol.Frame{Type: protocol.TypePushRegister, Push: &protocol.PushRegistration{Provider: protocol.PushAPNs, Token: "b0b0", Topic: "im.parley.app"}}), protocol.TypePush)
	alice := dialRaw(t, srv, "alice", "laptop")
	g := alice.createGroup("lunch", "bob")
	send := func(body string, mentions ...string) uint64 {
		t.Helper()
		f := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeSend, ConvID: g, ClientMsgID: fmt.Sprint("c", time.Now().UnixNano()), Body: body, Mentions: mentions}), protocol.TypeAck)
		return f.Seq
	}
	suppressed := func(reason string) float64 {
		return metric(t, srv, `parley_push_suppressed_total{reason="`+reason+`"}`)
	}
	unread := func() uint64 {
		for _, s := range mustOK(t, bob(protocol.Frame{Type: protocol.TypeConvList}), protocol.TypeConvList).List {
			if s.ConvID == g {
				return s.Unread
			}
		}
		t.Fatal("bob's conv_list has no group")
		return 0
	}

	f := mustOK(t, bob(protocol.Frame{Type: protocol.TypeConvMute, ConvID: g}), protocol.TypeConv)
	if f.Conv.MuteUntil != protocol.MuteForever {
		t.Fatalf("conv_mute answered mute_until %d, want %d", f.Conv.MuteUntil, protocol.MuteForever)
	}
	send("one")
	waitUntil(t, "one suppressed for the mute", func() bool { return suppressed("muted") == 1 })
	send("two")
	waitUntil(t, "two suppressed for the mute", func() bool { return suppressed("muted") == 2 })
	if n := len(a.to("b0b0")); n != 0 {
		t.Fatalf("bob muted the group and got %d notifications", n)
	}
	seq := send("@bob you?", "bob")
	waitUntil(t, "the mention notified", func() bool { return len(a.to("b0b0")) == 1 })
	if p := a.to("b0b0")[0].Payload; p["seq"] != float64(seq) {
		t.Fatalf("the mention's notification %v, want seq %d", p, seq)
	}

	mustOK(t, bob(protocol.Frame{Type: protocol.TypeConvUnmute, ConvID: g}), protocol.TypeConv)
	seq = send("four")
	waitUntil(t, "notified once unmuted", func() bool { return len(a.to("b0b0")) == 2 })
	p := a.to("b0b0")[1].Payload
	if want := float64(unread()); p["seq"] != float64(seq) || p["count"] != want || p["aps"].(map[string]any)["badge"] != want {
		t.Fatalf("after unmute: %v, want seq %d with count and badge %v (the muted ones included)", p, seq, want)
	}

	d := mustOK(t, bob(protocol.Frame{Type: protocol.TypeDNDSet, DND: &protocol.DND{Until: time.Now().Add(time.Hour).UnixMilli()}}), protocol.TypeDND)
	if d.DND == nil || d.DND.Until == 0 {
		t.Fatalf("dnd_set answered %+v", d.DND)
	}
	send("five")
	waitUntil(t, "one suppressed for do-not-disturb", func() bool { return suppressed("dnd") == 1 })
	send("@bob dnd?", "bob")
	waitUntil(t, "two suppressed for do-not-disturb", func() bool { return suppressed("dnd") == 2 })
	if n := len(a.to("b0b0")); n != 2 {
		t.Fatalf("bob in do-not-disturb: %d notifications, want still 2", n)
	}
	mustOK(t, bob(protocol.Frame{Type: protocol.TypeDNDSet}), protocol.TypeDND)
	seq = send("seven")
	waitUntil(t, "notified once do-not-disturb is off", func() bool { return len(a.to("b0b0")) == 3 })
	if p := a.to("b0b0")[2].Payload; p["seq"] != float64(seq) || p["count"] != float64(unread()) {
		t.Fatalf("after do-not-disturb: %v, want seq %d counting %d", p, seq, unread())
	}
	if suppressed("muted") != 2 || suppressed("dnd") != 2 {
		t.Errorf("suppressed muted %v, dnd %v; want 2 and 2", suppressed("muted"), suppressed("dnd"))
	}
}

// TestPushDeviceRateLimit, through a real node and a local APNs with
// push.device_rate 3 per 3 s: alice floods eight groups at once for
// carol, offline; carol's phone gets three notifications at once, and
// about a second later (a token a second) one more, standing for the five
// held: coalesced 4, badge 8. The held ones are counted in
// parley_push_rate_limited_total; nothing more follows.
func TestPushDeviceRateLimit(t *testing.T) {
	a := newLocalAPNs(t)
	srv := startWithAPNs(t, a, func(c *config.Config) { c.Push.DeviceRate, c.Push.DeviceInterval = 3, 3*time.Second })
	carol := rpcUser(t, srv, "carol", "phone")
	mustOK(t, carol(protocol.Frame{Type: protocol.TypePushRegister, Push: &protocol.PushRegistration{Provider: protocol.PushAPNs, Token: "ca01", Topic: "im.parley.app"}}), protocol.TypePush)
	alice := dialRaw(t, srv, "alice", "laptop")
	var groups []uint64
	for i := range 8 {
		groups = append(groups, alice.createGroup(fmt.Sprint("g", i), "carol"))
	}
	start := time.Now()
	for i, g := range groups {
		mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeSend, ConvID: g, ClientMsgID: fmt.Sprint("f", i), Body: "flood"}), protocol.TypeAck)
	}
	waitUntil(t, "three notifications", func() bool { return len(a.to("ca01")) >= 3 })
	waitUntil(t, "five held", func() bool { return metric(t, srv, "parley_push_rate_limited_total") == 5 })
	waitUntil(t, "the held one sent", func() bool { return len(a.to("ca01")) >= 4 })
	time.Sleep(1500 * time.Millisecond) // a token more: nothing else is due
	got := a.to("ca01")
	if len(got) != 4 {
		t.Fatalf("carol's phone got %d notifications, want 4 (3 within the rate, 1 for the 5 held)", len(got))
	}
	for _, q := range got[:3] {
		if q.Payload["coalesced"] != nil || q.At.Sub(start) > 2*time.Second {
			t.Errorf("a notification within the rate: %v at %v", q.Payload, q.At.Sub(start))
		}
	}
	held := got[3].Payload
	if held["coalesced"] != 4.0 || held["aps"].(map[string]any)["badge"] != 8.0 || held["count"] != 1.0 {
		t.Fatalf("the held notification %v, want coalesced 4 (it stands for 5), badge 8, count 1", held)
	}
	if wait := got[3].At.Sub(got[2].At); wait < 500*time.Millisecond {
		t.Errorf("the held notification went %v after the third, want about 1 s (the device's next token)", wait)
	}
}

// TestConvMuteAndDNDFrames: conv_mute, conv_unmute, dnd_set and dnd_get
// answer as documented, are pushed to the user's other device, show in
// conv_list and conv_info there, and refuse bad arguments and
// non-members.
func TestConvMuteAndDNDFrames(t *testing.T) {
	srv := servertest.Start(t)
	phone := dialRaw(t, srv, "bob", "phone")
	tablet := dialRaw(t, srv, "bob", "tablet")
	alice := dialRaw(t, srv, "alice", "laptop")
	g := alice.createGroup("g", "bob")
	until := time.Now().Add(time.Hour).UnixMilli()
	f := mustOK(t, phone.call(protocol.Frame{Type: protocol.TypeConvMute, ConvID: g, MuteUntil: until}), protocol.TypeConv)
	if f.Conv.MuteUntil != until || f.Conv.ConvID != g {
		t.Fatalf("conv_mute answered %+v", f.Conv)
	}
	if p := tablet.next(protocol.TypeConvMute); p.ConvID != g || p.MuteUntil != until {
		t.Fatalf("tablet's conv_mute push %+v", p)
	}
	summary := func(c *rawConn) protocol.ConvSummary {
		t.Helper()
		for _, s := range mustOK(t, c.call(protocol.Frame{Type: protocol.TypeConvList}), protocol.TypeConvList).List {
			if s.ConvID == g {
				return s
			}
		}
		t.Fatal("no summary of the group")
		return protocol.ConvSummary{}
	}
	if s := summary(tablet); s.MuteUntil != until {
		t.Fatalf("tablet's conv_list mute_until %d, want %d", s.MuteUntil, until)
	}
	if s := summary(alice); s.MuteUntil != 0 {
		t.Fatalf("alice's conv_list shows bob's mute: %d", s.MuteUntil)
	}
	if c := mustOK(t, tablet.call(protocol.Frame{Type: protocol.TypeConvInfo, ConvID: g}), protocol.TypeConv); c.Conv.MuteUntil != until {
		t.Fatalf("conv_info mute_until %d", c.Conv.MuteUntil)
	}
	mustOK(t, tablet.call(protocol.Frame{Type: protocol.TypeConvUnmute, ConvID: g}), protocol.TypeConv)
	if p := phone.next(protocol.TypeConvMute); p.MuteUntil != until { // its own conv_mute's
		t.Fatalf("phone's conv_mute push after its mute %+v", p)
	}
	if p := phone.next(protocol.TypeConvMute); p.ConvID != g || p.MuteUntil != 0 {
		t.Fatalf("phone's conv_mute push after unmute %+v", p)
	}
	if s := summary(phone); s.MuteUntil != 0 {
		t.Fatalf("conv_list after unmute: mute_until %d", s.MuteUntil)
	}

	dnd := protocol.DND{Until: until, Daily: &protocol.DNDWindow{Start: 22 * 60, End: 7 * 60, UTCOffset: 60}}
	d := mustOK(t, phone.call(protocol.Frame{Type: protocol.TypeDNDSet, DND: &dnd}), protocol.TypeDND)
	if d.DND == nil || d.DND.Until != until || d.DND.Daily == nil || *d.DND.Daily != *dnd.Daily {
		t.Fatalf("dnd_set answered %+v", d.DND)
	}
	if p := tablet.next(protocol.TypeDND); p.DND == nil || p.DND.Until != until || p.RID != "" {
		t.Fatalf("tablet's dnd push %+v", p)
	}
	if d := mustOK(t, tablet.call(protocol.Frame{Type: protocol.TypeDNDGet}), protocol.TypeDND); d.DND.Until != until || d.DND.Daily == nil {
		t.Fatalf("dnd_get %+v", d.DND)
	}
	if d := mustOK(t, tablet.call(protocol.Frame{Type: protocol.TypeDNDSet, DND: &protocol.DND{}}), protocol.TypeDND); d.DND.Until != 0 || d.DND.Daily != nil {
		t.Fatalf("dnd_set {} answered %+v", d.DND)
	}

	bad := []struct {
		name string
		f    protocol.Frame
		code protocol.Code
	}{
		{"mute in the past", protocol.Frame{Type: protocol.TypeConvMute, ConvID: g, MuteUntil: time.Now().Add(-time.Minute).UnixMilli()}, protocol.CodeInvalidArgument},
		{"mute past forever", protocol.Frame{Type: protocol.TypeConvMute, ConvID: g, MuteUntil: protocol.MuteForever + 1}, protocol.CodeInvalidArgument},
		{"unmute with a time", protocol.Frame{Type: protocol.TypeConvUnmute, ConvID: g, MuteUntil: until}, protocol.CodeInvalidArgument},
		{"mute without conv", protocol.Frame{Type: protocol.TypeConvMute}, protocol.CodeInvalidArgument},
		{"window start = end", protocol.Frame{Type: protocol.TypeDNDSet, DND: &protocol.DND{Daily: &protocol.DNDWindow{Start: 60, End: 60}}}, protocol.CodeInvalidArgument},
		{"window past midnight", protocol.Frame{Type: protocol.TypeDNDSet, DND: &protocol.DND{Daily: &protocol.DNDWindow{Start: 60, End: 1440}}}, protocol.CodeInvalidArgument},
		{"offset out of range", protocol.Frame{Type: protocol.TypeDNDSet, DND: &protocol.DND{Daily: &protocol.DNDWindow{Start: 1, End: 2, UTCOffset: 900}}}, protocol.CodeInvalidArgument},
	}
	for _, b := range bad {
		if r := phone.call(b.f); r.Type != protocol.TypeError || r.Code != b.code {
			t.Errorf("%s: %s %s (%s), want %s", b.name, r.Type, r.Code, r.Error, b.code)
		}
		mustOK(t, phone.call(protocol.Frame{Type: protocol.TypePing}), protocol.TypePong)
	}
	carol := dialRaw(t, srv, "carol", "phone")
	if r := carol.call(protocol.Frame{Type: protocol.TypeConvMute, ConvID: g}); r.Type != protocol.TypeError || r.Code != protocol.CodeNotMember {
		t.Errorf("a non-member's conv_mute: %s %s, want not_member", r.Type, r.Code)
	}
}
