package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-im/parley/internal/gateway"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// The flood: while one user floods sends from eight connections and
// another floods handshakes (valid and invalid tokens), a third user's ACK
// p99 stays within 2× of its unloaded value, the fairness the gateway
// promises (docs/decisions.md). This is the suite's one timed check;
// BenchmarkFlood records the figures (docs/benchmarks.md).
//
// The node runs in the test process; the victim and the attacker each run
// in a process of their own (this test binary started again with
// floodRoleEnv set), as they would on other machines: neither shares the
// node's Go scheduler, heap or GC. They still share the machine's cores
// with the node, and on a shared 2-core machine the victim's p99 moves by
// milliseconds between two unloaded measurements, so the bound has a
// margin proportional to the unloaded p99 (floodSlack) and the test takes
// the best of three rounds (each measuring the unloaded value again just
// before).

const (
	floodSamples = 150
	floodWindows = 3 // alternating unloaded and loaded windows per round
	// floodSlack: loaded p99 ≤ 2 × unloaded p99 × floodSlack. Two
	// unloaded measurements on this machine differ by up to ×2
	// (docs/benchmarks.md), so a bound tighter than that fails at random.
	floodSlack = 1.5
	// floodRoleEnv names the helper role of a child process.
	floodRoleEnv = "PARLEY_FLOOD_ROLE"
	// floodConfigEnv carries the child's configuration (JSON).
	floodConfigEnv = "PARLEY_FLOOD_CONFIG"
)

// floodResult is one round: the victim's ACK p99 unloaded and loaded, and
// how much the flooders got through.
type floodResult struct {
	base, loaded time.Duration
	attackerCounts
}

func (r floodResult) String() string {
	return fmt.Sprintf("victim ACK p99 unloaded %v, under flood %v (×%.1f); flooder: %d acked, %d rate_limited; %d handshakes (%d unanswered)",
		r.base.Round(10*time.Microsecond), r.loaded.Round(10*time.Microsecond), float64(r.loaded)/float64(max(r.base, 1)),
		r.Acked, r.Limited, r.Hands, r.Failed)
}

// floodServer starts a node with the shipped fair-sharing limits; paced
// false turns the per-source accept pacing off (to measure what it buys).
func floodServer(t testing.TB, paced bool) *servertest.Server {
	return servertest.Start(t, servertest.WithGateway(func(g *gateway.Config) {
		d := gateway.DefaultConfig() // the shipped limits, not the tests' lifted ones
		g.UserSendRate, g.UserSendBurst = d.UserSendRate, d.UserSendBurst
		g.ConnRequestRate, g.ConnRequestBurst = d.ConnRequestRate, d.ConnRequestBurst
		g.MaxSessionsPerUser, g.MaxPollSessionsPerUser = d.MaxSessionsPerUser, d.MaxPollSessionsPerUser
		g.UserHandshakeRate, g.UserHandshakeBurst = d.UserHandshakeRate, d.UserHandshakeBurst
		g.SourceAcceptRate, g.SourceAcceptBurst = d.SourceAcceptRate, d.SourceAcceptBurst
		if !paced {
			g.SourceAcceptRate = 0
		}
	}))
}

// floodKind says which flooders run.
type floodKind int

const (
	floodBoth floodKind = iota
	floodSends
	floodHandshakes
)

func (k floodKind) String() string { return [...]string{"both", "sends", "handshakes"}[k] }

// floodConfig is what a child process is told.
type floodConfig struct {
	URL string `json:"url"` // ws://host:port
	// Victim: its token and conversation.
	Token string `json:"token,omitempty"`
	Conv  uint64 `json:"conv,omitempty"`
	// Attacker: the user that floods sends, its conversation, the user
	// that floods handshakes (bad tokens too), and which floods run.
	FloodToken string `json:"flood_token,omitempty"`
	FloodConv  uint64 `json:"flood_conv,omitempty"`
	StormToken string `json:"storm_token,omitempty"`
	Sends      bool   `json:"sends,omitempty"`
	Handshakes bool   `json:"handshakes,omitempty"`
}

// attackerCounts is what the attacker process reports when it stops.
type attackerCounts struct {
	Acked, Limited, Hands, Failed, Wrong int64
}

// floodChildMain runs a child process's role and returns its exit code.
func floodChildMain(role string) int {
	var cfg floodConfig
	if err := json.Unmarshal([]byte(os.Getenv(floodConfigEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "flood child config:", err)
		return 2
	}
	var err error
	switch role {
	case "victim":
		err = victimMain(cfg)
	case "attacker":
		err = attackerMain(cfg)
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "flood %s: %v\n", role, err)
		return 1
	}
	return 0
}

// child is a running helper process, spoken to by lines on stdin/stdout.
type child struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startChild(t testing.TB, role string, cfg floodConfig) *child {
	t.Helper()
	raw, _ := json.Marshal(cfg)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: exec.Command(exe, "-test.run=^$")}
	c.cmd.Env = append(os.Environ(), floodRoleEnv+"="+role, floodConfigEnv+"="+string(raw))
	// It ends when its stdin does, so also when this process dies. (Not
	// Pdeathsig: that follows the OS thread that started the child, which
	// the Go runtime may end while this process runs.)
	c.cmd.Stderr = os.Stderr
	if c.in, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.out = bufio.NewReader(stdout)
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start the %s: %v", role, err)
	}
	t.Cleanup(func() { _ = c.cmd.Process.Kill(); _ = c.cmd.Wait() })
	return c
}

// line reads the child's next output line.
func (c *child) line(t testing.TB) string {
	t.Helper()
	l, err := c.out.ReadString('\n')
	if err != nil {
		t.Fatalf("flood child %v: %v (line %q)", c.cmd.Args, err, l)
	}
	return l
}

func (c *child) wait(t testing.TB) {
	t.Helper()
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("flood child: %v", err)
	}
}

// victimMain connects, prints "ready", and on each "go N" line sends N
// messages, one after the other at 40 a second (a busy person, within the
// default per-user budget), and prints the times to their ACKs in
// microseconds on one line; it ends when stdin does.
func victimMain(cfg floodConfig) error {
	var (
		ws  *websocket.Conn
		err error
	)
	for try := 0; ; try++ {
		if ws, _, err = dialRawErr(cfg.URL, cfg.Token, "victim"); err == nil {
			break
		}
		fmt.Fprintf(os.Stderr, "flood victim: dial: %v\n", err)
		if c, derr := net.Dial("tcp", cfg.URL[len("ws://"):]); derr == nil {
			fmt.Fprintf(c, "GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
			buf := make([]byte, 200)
			k, rerr := c.Read(buf)
			fmt.Fprintf(os.Stderr, "probe %s %s: %q %v\n", c.LocalAddr(), c.RemoteAddr(), buf[:k], rerr)
			c.Close()
		}
		if try == 20 {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer ws.Close()
	acks := make(chan string, 1)
	go func() {
		defer close(acks)
		for {
			_, data, err := ws.ReadMessage()
			if err != nil {
				fmt.Fprintf(os.Stderr, "flood victim: read: %v\n", err)
				return
			}
			var f protocol.Frame
			if json.Unmarshal(data, &f) == nil && f.RID != "" {
				if f.Type != protocol.TypeAck {
					fmt.Fprintf(os.Stderr, "victim: answer %s\n", data)
				}
				acks <- f.RID
			}
		}
	}()
	var wmu sync.Mutex // one writer at a time
	write := func(msg string) error {
		wmu.Lock()
		defer wmu.Unlock()
		return ws.WriteMessage(websocket.TextMessage, []byte(msg))
	}
	go func() { // the heartbeat, between rounds too
		for range time.Tick(10 * time.Second) {
			if write(`{"type":"ping"}`) != nil {
				return
			}
		}
	}()
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for k := 0; in.Scan(); k++ {
		var n int
		if _, err := fmt.Sscanf(in.Text(), "go %d", &n); err != nil || n <= 0 {
			return fmt.Errorf("bad command %q", in.Text())
		}
		lat := make([]time.Duration, 0, n)
		for i := 0; i < n; i++ {
			rid := fmt.Sprint(k, "-", i)
			msg := fmt.Sprintf(`{"type":"send","rid":%q,"conv_id":"%d","client_msg_id":"v%s","body":"hello"}`, rid, cfg.Conv, rid)
			start := time.Now()
			if err := write(msg); err != nil {
				return err
			}
			got, ok := <-acks
			if !ok {
				return errors.New("connection closed")
			}
			if got != rid {
				return fmt.Errorf("answer to %s, want %s", got, rid)
			}
			el := time.Since(start)
			lat = append(lat, el)
			time.Sleep(25*time.Millisecond - el)
		}
		line := make([]byte, 0, 8*n)
		for _, d := range lat {
			line = strconv.AppendInt(line, d.Microseconds(), 10)
			line = append(line, ' ')
		}
		fmt.Println(string(line))
	}
	return in.Err()
}

// attackerMain runs the flooders while switched on ("on" and "off" lines
// on stdin, each answered with the same word) until stdin closes, then
// prints their counts as JSON.
func attackerMain(cfg floodConfig) error {
	// Each "on" starts a period with a context of its own; "off" cancels
	// it, which also abandons the dials still waiting, so that nothing of
	// the flood is left running into the next unloaded window.
	var (
		mu     sync.Mutex
		period context.Context // nil while off
		stop   context.CancelFunc
		ended  bool // stdin closed
		cond   = sync.NewCond(&mu)
	)
	go func() {
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			mu.Lock()
			if stop != nil {
				stop()
				period, stop = nil, nil
			}
			if in.Text() == "on" {
				period, stop = context.WithCancel(context.Background())
			}
			cond.Broadcast()
			mu.Unlock()
			fmt.Println(in.Text())
		}
		mu.Lock()
		if stop != nil {
			stop()
		}
		period, ended = nil, true
		cond.Broadcast()
		mu.Unlock()
	}()
	// next waits for a period of flood; nil when the attacker is done.
	next := func() context.Context {
		mu.Lock()
		defer mu.Unlock()
		for period == nil && !ended {
			cond.Wait()
		}
		return period
	}
	var c struct{ acked, limited, hands, failed, wrong atomic.Int64 }
	var wg sync.WaitGroup
	for i := 0; i < 8 && cfg.Sends; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A flooder that ignores retry_after_ms and reconnects as soon
			// as the node closes it.
			for ctx := next(); ctx != nil; ctx = next() {
				ws, _, err := dialCtx(ctx, cfg.URL, cfg.FloodToken, fmt.Sprint("f", i))
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				floodConn(ctx, ws, cfg.FloodConv, i, &c.acked, &c.limited)
			}
		}()
	}
	for i := 0; i < 3 && cfg.Handshakes; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j := 0
			for ctx := next(); ctx != nil; ctx = next() {
				tok := "bad.token.here"
				if j%2 == 0 {
					tok = cfg.StormToken
				}
				ws, resp, err := dialCtx(ctx, cfg.URL, tok, fmt.Sprint("s", i, "-", j%40))
				j++
				if ctx.Err() != nil {
					continue // abandoned at the end of the period
				}
				c.hands.Add(1)
				switch {
				case err == nil:
					ws.Close()
				case resp == nil:
					c.failed.Add(1) // no answer (reset, timeout): go on
				case resp.StatusCode == http.StatusOK:
					c.wrong.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	out, _ := json.Marshal(attackerCounts{Acked: c.acked.Load(), Limited: c.limited.Load(), Hands: c.hands.Load(),
		Failed: c.failed.Load(), Wrong: c.wrong.Load()})
	fmt.Println(string(out))
	return nil
}

// dialCtx opens a WebSocket like dialRawErr, given up when ctx ends.
func dialCtx(ctx context.Context, base, token, device string) (*websocket.Conn, *http.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return websocket.DefaultDialer.DialContext(ctx, base+"/v1/ws?device="+device, http.Header{"Authorization": {"Bearer " + token}})
}

// victimSamples has the victim send n messages and returns their ACK times.
func victimSamples(t testing.TB, v *child, n int) []time.Duration {
	t.Helper()
	fmt.Fprintf(v.in, "go %d\n", n)
	var out []time.Duration
	for _, f := range strings.Fields(v.line(t)) {
		us, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			t.Fatalf("victim answered %q", f)
		}
		out = append(out, time.Duration(us)*time.Microsecond)
	}
	if len(out) != n {
		t.Fatalf("victim answered %d samples, want %d", len(out), n)
	}
	return out
}

// p99 is the 99th percentile of ds.
func p99(ds []time.Duration) time.Duration {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[(len(ds)*99)/100-1]
}

// command sends an attacker a command and waits for it to be taken.
func (c *child) command(t testing.TB, cmd string) {
	t.Helper()
	fmt.Fprintln(c.in, cmd)
	if l := c.line(t); l != cmd+"\n" {
		t.Fatalf("attacker answered %q to %q", l, cmd)
	}
}

// floodNode is the node under test and the conversations of the victim
// and of the flooding user.
type floodNode struct {
	srv             *servertest.Server
	conv, floodConv uint64
	victim          *child // connected once, measures every round
}

func startFloodNode(t testing.TB, paced bool) *floodNode {
	n := &floodNode{srv: floodServer(t, paced)}
	open := func(user, peer string) uint64 {
		c := dialRaw(t, n.srv, user, "setup")
		defer c.ws.Close()
		return c.openDirect(peer)
	}
	n.conv, n.floodConv = open("victim", "peer"), open("flood", "sink")
	n.victim = startChild(t, "victim", floodConfig{URL: n.srv.URL, Token: n.srv.Token("victim"), Conv: n.conv})
	if l := n.victim.line(t); l != "ready\n" {
		t.Fatalf("victim: %q", l)
	}
	return n
}

// floodRound measures the victim's ACK p99 unloaded and under the flood,
// in floodWindows alternating windows of each (the flood switched on half
// a second before a loaded window and off after it), so that the
// machine's own load, which drifts over seconds, weighs on both alike.
func floodRound(t testing.TB, n *floodNode, kind floodKind) floodResult {
	t.Helper()
	srv, v := n.srv, n.victim
	a := startChild(t, "attacker", floodConfig{URL: srv.URL, FloodToken: srv.Token("flood"), FloodConv: n.floodConv,
		StormToken: srv.Token("storm"), Sends: kind != floodHandshakes, Handshakes: kind != floodSends})
	var base, loaded []time.Duration
	for range floodWindows {
		base = append(base, victimSamples(t, v, floodSamples/floodWindows)...)
		a.command(t, "on")
		time.Sleep(500 * time.Millisecond) // let the flood reach full speed
		loaded = append(loaded, victimSamples(t, v, floodSamples/floodWindows)...)
		a.command(t, "off")
		time.Sleep(time.Second) // what was sent is answered, what waited is closed
	}
	r := floodResult{base: p99(base), loaded: p99(loaded)}
	_ = a.in.Close()
	if err := json.Unmarshal([]byte(a.line(t)), &r.attackerCounts); err != nil {
		t.Fatalf("attacker's counts: %v", err)
	}
	a.wait(t)
	if r.Wrong != 0 {
		t.Errorf("%d of the attacker's handshakes were answered 200, not refused", r.Wrong)
	}
	return r
}

// floodBound is the loaded p99 the test accepts for an unloaded one.
func floodBound(base time.Duration) time.Duration {
	return time.Duration(float64(2*base) * floodSlack)
}

func TestFloodKeepsOthersACKLatency(t *testing.T) {
	if raceBuild || testing.Short() {
		t.Skip("timed check: runs without -race and without -short (scripts/test.sh runs e2e again without -race)")
	}
	n := startFloodNode(t, true)
	var last floodResult
	for round := 0; round < 3; round++ {
		last = floodRound(t, n, floodBoth)
		t.Logf("round %d: %v (bound %v)", round, last, floodBound(last.base))
		if last.Limited == 0 || last.Hands == 0 {
			t.Fatalf("the flood did not run: %v", last)
		}
		if last.loaded <= floodBound(last.base) {
			return
		}
	}
	t.Fatalf("in three rounds the victim's ACK p99 under flood exceeded 2× its unloaded value × %v: %v", floodSlack, last)
}

// BenchmarkFlood records the figures (docs/benchmarks.md): both floods
// together and each alone against the shipped limits, and the two
// handshake cases again with the per-source accept pacing off, in the same
// run:
// go test -run XXX -bench BenchmarkFlood -benchtime 3x ./internal/e2e/
//
// One node (of each pacing) serves every sub-benchmark.
func BenchmarkFlood(b *testing.B) {
	paced, unpaced := startFloodNode(b, true), startFloodNode(b, false)
	cases := []struct {
		name string
		n    *floodNode
		kind floodKind
	}{
		{"both", paced, floodBoth},
		{"sends", paced, floodSends},
		{"handshakes", paced, floodHandshakes},
		{"both-unpaced", unpaced, floodBoth},
		{"handshakes-unpaced", unpaced, floodHandshakes},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				r := floodRound(b, c.n, c.kind)
				b.ReportMetric(float64(r.base.Microseconds())/1000, "base-p99-ms")
				b.ReportMetric(float64(r.loaded.Microseconds())/1000, "flood-p99-ms")
				b.ReportMetric(float64(r.loaded)/float64(max(r.base, 1)), "ratio")
				b.ReportMetric(float64(r.Acked), "flood-acked")
				b.ReportMetric(float64(r.Limited), "flood-limited")
				b.ReportMetric(float64(r.Hands), "handshakes")
				b.Log(r)
			}
		})
	}
}

// floodConn sends on ws as fast as answers come back (32 in flight) until
// the connection ends or ctx does.
func floodConn(ctx context.Context, ws *websocket.Conn, conv uint64, i int, acked, limited *atomic.Int64) {
	window := make(chan struct{}, 32)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			_, data, err := ws.ReadMessage()
			if err != nil {
				return
			}
			var f protocol.Frame
			if json.Unmarshal(data, &f) != nil || f.RID == "" {
				continue
			}
			if f.Type == protocol.TypeAck {
				acked.Add(1)
			} else if f.Code == protocol.CodeRateLimited {
				limited.Add(1)
			}
			select {
			case <-window:
			default:
			}
		}
	}()
	defer func() { ws.Close(); <-done }()
	for j := 0; ctx.Err() == nil; j++ {
		select {
		case window <- struct{}{}:
		case <-ctx.Done():
			return
		case <-done:
			return
		}
		msg := fmt.Sprintf(`{"type":"send","rid":"%d","conv_id":"%d","client_msg_id":"f%d-%d-%d","body":"flood"}`, j+1, conv, i, time.Now().UnixNano(), j)
		if ws.WriteMessage(websocket.TextMessage, []byte(msg)) != nil {
			return
		}
	}
}
