package clustertest

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/internal/bench"
)

// TestReconnectStorm: thousands of clients, held by several client
// processes, lose their gateways at once (kill -9) while messages wait for
// them, and come back through admission control. Every client must end
// connected with every message, the restarted gateways must have refused
// handshakes (admission control engaged), and no process may exit or grow
// past the memory bound.
func TestReconnectStorm(t *testing.T) {
	const (
		clients     = 3000
		clientProcs = 3
		groupSize   = 100 // + the owner: a small group, rows for everyone
		textsBefore = 2   // per group, pushed while the clients are online
		textsDown   = 3   // per group, sent while their gateways are dead
		// rssBound is per gateway. An idle connection costs ~2.2 KiB
		// (docs/benchmarks.md), a node at rest ~25 MiB; the bound leaves
		// room for handshake garbage and sync answers in flight, and
		// fails a node that buffers the storm instead of refusing it.
		rssBound     = 128 << 20
		stormTimeout = 60 * time.Second
	)
	// Low limits, so that 3,000 clients over 3 gateways overrun them: the
	// SDK's full-jitter backoff (5s ceiling here) spreads the clients over
	// a few seconds, more than 300 handshakes a second. The sync burst is
	// below the handshake burst, so the first wave of syncs after a
	// restart overruns the sync bucket too.
	c := Start(t, Options{Gateways: 4, Chats: 2, Extra: []string{
		"--gateway.handshake-rate", "100", "--gateway.handshake-burst", "100",
		"--gateway.sync-rate", "100", "--gateway.sync-burst", "20",
	}})
	gws, admin := c.Gateways[:3], c.Gateways[3]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// A connection's requests run one at a time, so the owner sends
	// from several devices at once.
	var owners []*client.Client
	for d := range 6 {
		owners = append(owners, sdkClient(ctx, t, c, admin, "storm-owner", "admin"+strconv.Itoa(d)))
	}
	user := func(i int) string { return "storm-" + strconv.Itoa(i) }
	groups := make([]uint64, clients/groupSize)
	start := time.Now()
	parallel(t, len(groups), len(owners), func(g int) error {
		members := make([]string, groupSize)
		for i := range members {
			members[i] = user(g*groupSize + i)
		}
		info, err := owners[g%len(owners)].CreateGroup(ctx, "storm"+strconv.Itoa(g), members)
		groups[g] = info.ConvID
		return err
	})
	t.Logf("%d groups of %d created in %v", len(groups), groupSize+1, time.Since(start).Round(time.Millisecond))

	var urls []string
	for _, g := range gws {
		urls = append(urls, g.URL())
	}
	per := clients / clientProcs
	var procs []*stormProc
	for k := range clientProcs {
		procs = append(procs, startStormProc(t, c, k, urls, "storm-", k*per, (k+1)*per))
	}
	start = time.Now()
	for _, p := range procs {
		p.waitReady(t, 90*time.Second)
	}
	t.Logf("%d clients connected and synced over %d processes and %d gateways in %v",
		clients, clientProcs, len(gws), time.Since(start).Round(time.Millisecond))

	sendTexts(ctx, t, owners, groups, "before", textsBefore)
	waitTexts(t, procs, clients, textsBefore, 30*time.Second)

	// The drop: every client's gateway dies at once.
	for _, g := range gws {
		_ = g.cmd.Process.Signal(syscall.SIGKILL)
	}
	for _, g := range gws {
		c.Kill9(g)
	}
	sendTexts(ctx, t, owners, groups, "down", textsDown)

	restarted := time.Now()
	sampler := startRSSSampler()
	for _, g := range gws {
		c.Restart(g)
		sampler.watch(g.Name, g.cmd.Process.Pid)
	}
	final := waitTexts(t, procs, clients, textsBefore+textsDown, stormTimeout)
	storm := time.Since(restarted)
	peaks := sampler.stop()

	if final.MinConnects < 2 {
		t.Errorf("a client connected %d times, want at least 2 (it never reconnected)", final.MinConnects)
	}
	if final.Dups != 0 || final.Stopped != 0 {
		t.Errorf("clients: %d duplicate messages, %d stopped (%v)", final.Dups, final.Stopped, final.Errors)
	}
	// A sync refused with overloaded is not counted by any metric, but
	// the SDK sends one sync per connection and another only after an
	// error: sync frames beyond the connections are the retries.
	var limited, okHS, syncs float64
	for _, g := range gws {
		m := scrape(t, g)
		limited += m[`parley_handshakes_total{result="rate_limited"}`]
		okHS += m[`parley_handshakes_total{result="ok"}`]
		syncs += m[`parley_frames_in_total{type="sync"}`]
		t.Logf("%s: handshakes ok %.0f, rate_limited %.0f; sync frames %.0f; peak RSS %.1f MiB",
			g.Name, m[`parley_handshakes_total{result="ok"}`], m[`parley_handshakes_total{result="rate_limited"}`],
			m[`parley_frames_in_total{type="sync"}`], float64(peaks[g.Name])/(1<<20))
		if peaks[g.Name] == 0 || peaks[g.Name] > rssBound {
			t.Errorf("%s: peak RSS %d bytes, want (0, %d]", g.Name, peaks[g.Name], rssBound)
		}
	}
	if limited == 0 {
		t.Errorf("no handshake was refused with rate_limited: admission control never engaged")
	}
	syncRetries := syncs - okHS
	if syncRetries <= 0 {
		t.Errorf("%.0f sync frames for %.0f connections: no sync was retried, sync admission never engaged", syncs, okHS)
	}
	if okHS < clients {
		t.Errorf("%.0f handshakes accepted after the restart, want at least %d", okHS, clients)
	}
	for _, p := range append(append([]*Proc{}, c.Gateways...), c.Chats...) {
		if !alive(p.cmd.Process.Pid) {
			t.Errorf("%s exited", p.Name)
		}
	}
	for _, p := range procs {
		if p.exited() {
			t.Errorf("%s exited", p.name)
		}
	}
	rs := final.Resync.Summarize()
	t.Logf("storm: %d clients back with all %d messages each %.1fs after the restart began; "+
		"%.0f handshakes refused, %.0f syncs retried; disconnect→synced (outage included) p50 %v p99 %v max %v",
		clients, textsBefore+textsDown, storm.Seconds(), limited, syncRetries, rs.P50, rs.P99, rs.Max)
}

// sdkClient runs a Go SDK client of user on gateway g until the test ends
// and waits for its first connection; its events are drained.
func sdkClient(ctx context.Context, t *testing.T, c *Cluster, g *Proc, user, device string) *client.Client {
	t.Helper()
	cl, err := client.New(client.Config{URL: g.URL(), Token: c.Token(user), Device: device})
	if err != nil {
		t.Fatal(err)
	}
	connected := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = cl.Run(ctx) }()
	go func() {
		defer wg.Done()
		var once sync.Once
		for ev := range cl.Events() {
			if ev.Kind == client.EventConnected {
				once.Do(func() { close(connected) })
			}
		}
	}()
	t.Cleanup(func() { cl.Close(); wg.Wait() })
	select {
	case <-connected:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not connect to %s", user, g.Name)
	}
	return cl
}

// parallel runs f(0..n-1) on width goroutines and fails on the first error.
func parallel(t *testing.T, n, width int, f func(i int) error) {
	t.Helper()
	errs := make(chan error, n)
	next := make(chan int)
	var wg sync.WaitGroup
	for range width {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					errs <- fmt.Errorf("%d: %w", i, err)
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// sendTexts sends n texts to every group, each group from one of owners.
func sendTexts(ctx context.Context, t *testing.T, owners []*client.Client, groups []uint64, tag string, n int) {
	t.Helper()
	start := time.Now()
	parallel(t, len(groups), len(owners), func(g int) error {
		for j := range n {
			if _, err := owners[g%len(owners)].SendWithID(ctx, groups[g], fmt.Sprintf("%s-%d-%d", tag, g, j), "hello"); err != nil {
				return err
			}
		}
		return nil
	})
	t.Logf("sent %d messages (%s) in %v", n*len(groups), tag, time.Since(start).Round(time.Millisecond))
}

// waitTexts polls the client processes until every client is connected
// with exactly want text messages, and fails at the deadline.
func waitTexts(t *testing.T, procs []*stormProc, clients, want int, limit time.Duration) bench.StormReport {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		var rs []bench.StormReport
		for _, p := range procs {
			rs = append(rs, p.report(t))
		}
		r := bench.MergeStormReports(rs)
		if r.Clients == clients && r.Connected == clients && r.Texts[want] == clients {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %d of %d clients connected; clients by text messages held: %v (want %d each); errors %v",
				limit, r.Connected, clients, r.Texts, want, r.Errors)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// stormProc is a `parley-bench storm-client` child process.
type stormProc struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	done  chan struct{}
}

func startStormProc(t *testing.T, c *Cluster, k int, urls []string, prefix string, from, to int) *stormProc {
	t.Helper()
	name := fmt.Sprintf("storm-client-%d", k)
	logf, err := os.Create(filepath.Join(c.dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(benchBinary, "storm-client", "-urls", strings.Join(urls, ","),
		"-key", hex.EncodeToString(c.key), "-prefix", prefix,
		"-from", strconv.Itoa(from), "-to", strconv.Itoa(to), "-max-backoff", "5s")
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &stormProc{name: name, cmd: cmd, stdin: stdin, lines: make(chan string, 4), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	go func() { _ = cmd.Wait(); logf.Close(); close(p.done) }()
	t.Cleanup(func() {
		stdin.Close() // asks it to close its clients and exit
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(c.dir, name+".log"))
			t.Logf("--- log of %s ---\n%s", name, tail(string(b), 3000))
		}
	})
	return p
}

func (p *stormProc) line(t *testing.T, limit time.Duration) string {
	t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			t.Fatalf("%s exited", p.name)
		}
		return l
	case <-time.After(limit):
		t.Fatalf("%s: no answer within %v", p.name, limit)
	}
	return ""
}

func (p *stormProc) waitReady(t *testing.T, limit time.Duration) {
	t.Helper()
	if l := p.line(t, limit); !strings.HasPrefix(l, bench.StormReady+" ") {
		t.Fatalf("%s: %s", p.name, l)
	}
}

func (p *stormProc) report(t *testing.T) bench.StormReport {
	t.Helper()
	if _, err := fmt.Fprintln(p.stdin, bench.StormReportCmd); err != nil {
		t.Fatalf("%s: %v", p.name, err)
	}
	r, err := bench.ParseStormReport(p.line(t, 10*time.Second))
	if err != nil {
		t.Fatalf("%s: %v", p.name, err)
	}
	return r
}

func (p *stormProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// alive reports whether pid is a running process: not gone, not a zombie
// waiting to be reaped.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

// rssSampler records the peak VmRSS of processes every 50ms.
type rssSampler struct {
	stopc chan struct{}
	done  chan struct{}
	mu    struct {
		sync.Mutex
		pids  map[string]int
		peaks map[string]int64
	}
}

func startRSSSampler() *rssSampler {
	s := &rssSampler{stopc: make(chan struct{}), done: make(chan struct{})}
	s.mu.pids, s.mu.peaks = map[string]int{}, map[string]int64{}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			s.sample()
			select {
			case <-s.stopc:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

func (s *rssSampler) watch(name string, pid int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.pids[name] = pid
}

func (s *rssSampler) sample() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, pid := range s.mu.pids {
		if rss, err := bench.ReadVmRSS(pid); err == nil {
			s.mu.peaks[name] = max(s.mu.peaks[name], rss)
		}
	}
}

// stop takes a last sample and returns the peaks by process name.
func (s *rssSampler) stop() map[string]int64 {
	close(s.stopc)
	<-s.done
	s.sample()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.peaks
}

// scrape reads a process's /metrics, keyed by series (name and labels as
// exposed).
func scrape(t *testing.T, p *Proc) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.Addr + "/metrics")
	if err != nil {
		t.Fatalf("%s: metrics: %v", p.Name, err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		i := strings.LastIndexByte(line, ' ')
		if line == "" || line[0] == '#' || i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}
