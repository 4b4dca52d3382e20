package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/protocol"
)

// FanoutScenario is one group of the fan-out benchmark.
type FanoutScenario struct {
	Name    string
	Members int
	// Online is how many members, from member 0 (the sender's user) up,
	// are connected on one device each in the client processes. The
	// sender's own connection is one more device of member 0, so at least
	// one member is always online.
	Online int
	// Procs is the client processes holding the online members.
	Procs int
}

// OnlineUsers is the members online while the scenario sends.
func (s FanoutScenario) OnlineUsers() int { return max(s.Online, 1) }

// DefaultFanoutScenarios are the three fan-out tiers and the delivery run
// with the default thresholds (small below 200, large above 2,000): 199
// and 200 members all offline but the sender, 2,000 members 20% online,
// 10,000 members a few online, and deliveryMembers all online over procs
// client processes.
func DefaultFanoutScenarios(deliveryMembers, procs int) []FanoutScenario {
	return FanoutScenarios(deliveryMembers, deliveryMembers, procs)
}

// FanoutScenarios are DefaultFanoutScenarios with deliveryOnline of the
// delivery run's deliveryMembers online (a large group of which only a
// part is connected); its name then says both, delivery-M-online-N.
func FanoutScenarios(deliveryMembers, deliveryOnline, procs int) []FanoutScenario {
	name := "delivery-" + strconv.Itoa(deliveryMembers)
	if deliveryOnline != deliveryMembers {
		name += "-online-" + strconv.Itoa(deliveryOnline)
	}
	return []FanoutScenario{
		{Name: "small-199", Members: 199},
		{Name: "medium-200", Members: 200},
		{Name: "medium-2000", Members: 2000, Online: 400, Procs: 1},
		{Name: "large-10000", Members: 10000, Online: 10, Procs: 1},
		{Name: name, Members: deliveryMembers, Online: deliveryOnline, Procs: procs},
	}
}

// FanoutConfig configures the group fan-out benchmark.
type FanoutConfig struct {
	// ServerBinary, the parley executable, is started as the server
	// unless Addr is set; it may be another build than the one the
	// clients come from, to compare two servers in the same run with the
	// same clients.
	ServerBinary string
	// ClientBinary is started as the client processes: the benchmark's
	// own executable.
	ClientBinary string
	// Addr and DataDir attach to a running node instead of starting one;
	// DataDir holds the development key the benchmark mints tokens with.
	// The node's fan-out counters must move only for this benchmark.
	Addr    string
	DataDir string
	// ServerPID, with Addr, is the running node's process id, for its CPU
	// time; 0 leaves the CPU column empty.
	ServerPID int
	// ProfileDir, if set, receives a CPU and an allocation profile of the
	// server over each delivery scenario's sending window
	// (<scenario>.cpu.pprof, <scenario>.allocs.pprof), fetched from the
	// net/http/pprof endpoint the server opens on PARLEY_PPROF.
	ProfileDir string
	// WindowFile, if set, gets a line "start SCENARIO" appended when a
	// scenario's sending window begins (its members online, nothing sent
	// yet) and "end SCENARIO" when it ends (every delivery in), so that a
	// script measuring processes the benchmark does not know (a cluster's
	// chat processes, its engines) can leave the setup out.
	WindowFile string

	Scenarios []FanoutScenario
	Messages  int // messages sent per scenario, by member 0
	// Rate paces the sends, messages per second, so that latency is
	// measured rather than a backlog; 0 sends each after the previous ACK.
	Rate      float64
	BodyBytes int
	// AckEvery is the client processes' delivered cadence; with AckByPush
	// (FanoutClientConfig) that of the pushes that ask for batched acks.
	AckEvery  time.Duration
	AckByPush bool
	// Chunk is the member ids per create_group / add_members frame; frames
	// are limited to 64 KiB.
	Chunk int
	// CreateMembers, if not negative, is the member ids of the
	// create_group frame (the rest follow in add_members frames of Chunk);
	// negative: Chunk.
	CreateMembers int
	// DeliveryWait bounds the wait for pushes after the last ACK; it
	// should exceed the node's re-send delay so that a lost push that is
	// re-sent is still counted.
	DeliveryWait time.Duration
	Timeout      time.Duration // bound on the whole run
	// ClientArgs returns the arguments after ClientBinary that start one
	// client process (`fanout-client` and its flags).
	ClientArgs func(FanoutClientConfig) []string

	Out    io.Writer // the report
	Stderr io.Writer // children's logs
	Logger *slog.Logger

	// startClient replaces the child process in tests.
	startClient func(name string, cc FanoutClientConfig) (*fanoutProc, error)
}

// DefaultFanoutConfig returns the defaults used by `parley-bench fanout`.
func DefaultFanoutConfig() FanoutConfig {
	return FanoutConfig{
		Scenarios: DefaultFanoutScenarios(10000, 3),
		Messages:  50, Rate: 5, BodyBytes: 100, AckEvery: time.Second, AckByPush: true, Chunk: 2000, CreateMembers: -1,
		DeliveryWait: 20 * time.Second, Timeout: 20 * time.Minute,
		Out: os.Stdout, Stderr: os.Stderr, Logger: slog.Default(),
	}
}

// Validate reports a configuration the benchmark cannot run with.
func (c FanoutConfig) Validate() error {
	var errs []error
	if c.Addr == "" && c.ServerBinary == "" {
		errs = append(errs, errors.New("server binary is required unless attaching with addr"))
	}
	if c.ClientBinary == "" && c.startClient == nil {
		errs = append(errs, errors.New("client binary is required"))
	}
	if (c.Addr == "") != (c.DataDir == "") {
		errs = append(errs, errors.New("addr and data dir go together (the data dir holds the key to mint tokens)"))
	}
	if len(c.Scenarios) == 0 {
		errs = append(errs, errors.New("no scenarios"))
	}
	for _, s := range c.Scenarios {
		switch {
		case s.Name == "":
			errs = append(errs, errors.New("a scenario has no name"))
		case s.Members < 2:
			errs = append(errs, fmt.Errorf("scenario %s: a group needs at least 2 members, got %d", s.Name, s.Members))
		case s.Online < 0 || s.Online > s.Members:
			errs = append(errs, fmt.Errorf("scenario %s: online must be in 0..%d, got %d", s.Name, s.Members, s.Online))
		case s.Online > 0 && s.Procs < 1:
			errs = append(errs, fmt.Errorf("scenario %s: %d online members need at least one client process", s.Name, s.Online))
		case s.Procs > 0 && (s.Online+s.Procs-1)/s.Procs > MaxConnsPerClient:
			errs = append(errs, fmt.Errorf("scenario %s: %d connections over %d processes exceeds %d per process", s.Name, s.Online, s.Procs, MaxConnsPerClient))
		}
	}
	if c.Messages < 1 || c.Chunk < 1 {
		errs = append(errs, fmt.Errorf("messages and chunk must be positive, got %d, %d", c.Messages, c.Chunk))
	}
	if c.BodyBytes < stampLen {
		errs = append(errs, fmt.Errorf("body bytes must be at least %d (the send-time stamp), got %d", stampLen, c.BodyBytes))
	}
	if c.Rate < 0 || c.AckEvery < 0 || c.DeliveryWait < 0 || c.Timeout <= 0 {
		errs = append(errs, errors.New("rate, ack every and delivery wait must not be negative, timeout must be positive"))
	}
	if c.ClientArgs == nil && c.startClient == nil {
		errs = append(errs, errors.New("client args are required"))
	}
	if c.Out == nil || c.Stderr == nil || c.Logger == nil {
		errs = append(errs, errors.New("out, stderr and logger are required"))
	}
	return errors.Join(errs...)
}

// FanoutResult is what one scenario measured.
type FanoutResult struct {
	Scenario FanoutScenario
	Tier     string // the group's tier as the node reports it
	Sent     int
	Acked    int
	Errors   int // sends answered with an error
	// Increases of the node's counters over the sending window. They are
	// read summed over the tier label: only this scenario's group sends
	// then, so the sum is its tier's figure.
	FanoutMessages float64 // parley_fanout_messages_total
	Rows           float64 // parley_fanout_row_writes_total
	Pushes         float64 // parley_fanout_pushes_total (users pushed to)
	Retransmits    float64 // parley_retransmits_total
	// Receipts in the client processes (zero when none ran).
	Check   DeliveryCheck
	Dups    int64 // re-sent pushes the clients dropped
	Gaps    int64
	Elapsed time.Duration // first send → last first receipt
	Latency Latencies     // receipt − server_time, 1 ms resolution
	// FromSend is receipt − the moment the sender wrote the send frame:
	// Latency plus the time the send waited at the node for its turn.
	FromSend Latencies
	// ServerCPU and ClientCPU are the CPU time (user + system, from
	// /proc) the server process and the client processes used from the
	// first send until every delivery had arrived (or the wait ended);
	// zero when unknown.
	ServerCPU time.Duration
	ClientCPU time.Duration
	// Create and Add are how long the group's setup took: its
	// create_group frame, and its add_members frames (AddFrames) together.
	Create, Add time.Duration
	AddFrames   int
}

// ServerCPUPerDelivery is the server's CPU time over the window divided by
// the first receipts: what one delivery costs the node, acks included.
func (r FanoutResult) ServerCPUPerDelivery() time.Duration {
	if r.Check.Delivered == 0 {
		return 0
	}
	return r.ServerCPU / time.Duration(r.Check.Delivered)
}

// ClientCPUPerDelivery is the same for the client processes.
func (r FanoutResult) ClientCPUPerDelivery() time.Duration {
	if r.Check.Delivered == 0 {
		return 0
	}
	return r.ClientCPU / time.Duration(r.Check.Delivered)
}

// RowsPerMessage is the measured write amplification in rows.
func (r FanoutResult) RowsPerMessage() float64 { return per(r.Rows, r.FanoutMessages) }

// PushesPerMessage is users pushed to per message.
func (r FanoutResult) PushesPerMessage() float64 { return per(r.Pushes, r.FanoutMessages) }

// WritesPerMessage counts the body, stored once, and the rows.
func (r FanoutResult) WritesPerMessage() float64 { return 1 + r.RowsPerMessage() }

// DeliveriesPerSecond is first receipts per second of the run.
func (r FanoutResult) DeliveriesPerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Check.Delivered) / r.Elapsed.Seconds()
}

func per(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// problems lists what makes the result disagree with the tier table (ExpectedRows) or
// with exactly-once delivery.
func (r FanoutResult) problems() []string {
	var out []string
	if r.Errors > 0 || r.Acked != r.Sent {
		out = append(out, fmt.Sprintf("%d of %d sends ACKed, %d errors", r.Acked, r.Sent, r.Errors))
	}
	if r.FanoutMessages != float64(r.Acked) {
		out = append(out, fmt.Sprintf("%.0f messages fanned out for %d ACKed", r.FanoutMessages, r.Acked))
	}
	if want := ExpectedRows(r.Tier, r.Scenario.Members, r.Scenario.OnlineUsers()); want < 0 || r.RowsPerMessage() != float64(want) {
		out = append(out, fmt.Sprintf("%.2f row writes per message in tier %q, want %d", r.RowsPerMessage(), r.Tier, want))
	}
	if r.Scenario.Online > 0 && !r.Check.OK() {
		out = append(out, fmt.Sprintf("deliveries %d of %d: %d missing, %d extra", r.Check.Delivered, r.Check.Want, r.Check.Missing, r.Check.Extra))
	}
	return out
}

// RunFanout runs the scenarios one after another, each on a fresh group of
// fresh users, and writes the tables to Out. It returns an error, after
// writing what it measured, when a scenario could not run or disagrees
// with the expected write amplification (ExpectedRows) or with exactly-once delivery.
func RunFanout(ctx context.Context, cfg FanoutConfig) (results []FanoutResult, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("bench fanout: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	addr, dir := cfg.Addr, cfg.DataDir
	serverPID, pprofAddr := cfg.ServerPID, ""
	if addr == "" {
		if dir, err = os.MkdirTemp("", "parley-bench-fanout-"); err != nil {
			return nil, fmt.Errorf("bench fanout: %w", err)
		}
		defer os.RemoveAll(dir)
		if _, err := auth.LoadOrCreateDevKey(dir); err != nil {
			return nil, fmt.Errorf("bench fanout: %w", err)
		}
		most := 0
		for _, s := range cfg.Scenarios {
			most = max(most, s.Online)
		}
		var env []string
		if cfg.ProfileDir != "" {
			if err := os.MkdirAll(cfg.ProfileDir, 0o755); err != nil {
				return nil, fmt.Errorf("bench fanout: %w", err)
			}
			port, err := freePort()
			if err != nil {
				return nil, fmt.Errorf("bench fanout: %w", err)
			}
			pprofAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			env = append(env, "PARLEY_PPROF="+pprofAddr)
		}
		srv, err := StartServer(ctx, ServerConfig{
			Binary: cfg.ServerBinary, DataDir: dir, Stderr: cfg.Stderr, Env: env,
			Args: []string{
				"--log.level", "warn",
				"--gateway.max-connections", strconv.Itoa(most + 1000),
				"--gateway.handshake-rate", "100000",
				"--gateway.handshake-burst", "100000",
				"--gateway.drain-timeout", "2s",
			},
		})
		if err != nil {
			return nil, fmt.Errorf("bench fanout: %w", err)
		}
		defer func() { err = errors.Join(err, srv.Stop()) }()
		addr = srv.Addr
		serverPID = srv.PID()
	}
	if cfg.startClient == nil {
		cfg.startClient = cfg.execClient
	}
	key, err := auth.LoadHS256KeyFile(filepath.Join(dir, auth.DevKeyFile))
	if err != nil {
		return nil, fmt.Errorf("bench fanout: %w", err)
	}
	r := &fanoutRun{
		cfg: cfg, addr: addr, dir: dir, d: newDialer(addr, key, nil, 4096),
		httpc: &http.Client{Timeout: 10 * time.Second}, metricsURL: "http://" + addr + "/metrics",
		run:       strconv.FormatInt(time.Now().UnixNano()%(1<<40), 36),
		serverPID: serverPID, pprofAddr: pprofAddr,
	}
	fmt.Fprintf(cfg.Out, "server %s; %d messages per scenario at %s, %d-byte bodies, clients ack %s\n",
		addr, cfg.Messages, rateString(cfg.Rate), cfg.BodyBytes, ackString(cfg.AckByPush, cfg.AckEvery))
	var errs []error
	for i, s := range cfg.Scenarios {
		res, err := r.scenario(ctx, i, s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.Name, err))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		results = append(results, res)
		fmt.Fprintf(cfg.Out, "  %-16s tier %-6s rows/msg %8.2f  pushes/msg %8.2f  deliveries %d/%d  %.0f/s  p50 %v p99 %v  from send p99 %v  server CPU/delivery %s\n",
			s.Name, res.Tier, res.RowsPerMessage(), res.PushesPerMessage(), res.Check.Delivered, res.Check.Want,
			res.DeliveriesPerSecond(), res.Latency.P50, res.Latency.P99, res.FromSend.P99,
			cpuString(res.ServerCPU, res.ServerCPUPerDelivery()))
		for _, p := range res.problems() {
			errs = append(errs, fmt.Errorf("%s: %s", s.Name, p))
		}
	}
	WriteFanoutTables(cfg.Out, results)
	if len(errs) > 0 {
		return results, fmt.Errorf("bench fanout: %w", errors.Join(errs...))
	}
	return results, nil
}

func rateString(r float64) string {
	if r == 0 {
		return "full speed (next send after each ACK)"
	}
	return fmt.Sprintf("%g/s", r)
}

// WriteFanoutTables writes the write-amplification and the delivery tables
// in Markdown.
func WriteFanoutTables(w io.Writer, rs []FanoutResult) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| scenario | members | online | tier | messages | row writes/msg (seed) | pushes/msg | writes/msg |")
	fmt.Fprintln(w, "|---|---:|---:|---|---:|---:|---:|---:|")
	for _, r := range rs {
		fmt.Fprintf(w, "| %s | %d | %d | %s | %.0f | %.2f (%d) | %.2f | %.2f |\n",
			r.Scenario.Name, r.Scenario.Members, r.Scenario.OnlineUsers(), r.Tier, r.FanoutMessages,
			r.RowsPerMessage(), ExpectedRows(r.Tier, r.Scenario.Members, r.Scenario.OnlineUsers()),
			r.PushesPerMessage(), r.WritesPerMessage())
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| scenario | online | messages | deliveries (want) | missing / extra / re-sent | server retransmits | elapsed | deliveries/s | from server_time p50 / p99 / max | from send p50 / p99 / max | server CPU/delivery | clients CPU/delivery |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rs {
		if r.Scenario.Online == 0 {
			continue
		}
		fmt.Fprintf(w, "| %s | %d | %d | %d (%d) | %d / %d / %d | %.0f | %v | %.0f | %v / %v / %v | %v / %v / %v | %s | %s |\n",
			r.Scenario.Name, r.Scenario.Online, r.Acked, r.Check.Delivered, r.Check.Want,
			r.Check.Missing, r.Check.Extra, r.Dups, r.Retransmits, r.Elapsed.Round(time.Millisecond),
			r.DeliveriesPerSecond(), r.Latency.P50, r.Latency.P99, r.Latency.Max,
			r.FromSend.P50, r.FromSend.P99, r.FromSend.Max,
			cpuString(r.ServerCPU, r.ServerCPUPerDelivery()), cpuString(r.ClientCPU, r.ClientCPUPerDelivery()))
	}
}

// cpuString shows a CPU time per delivery in µs, or "-" when unknown.
func cpuString(total, per time.Duration) string {
	if total == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f µs", float64(per)/float64(time.Microsecond))
}

// fanoutRun is the state shared by the scenarios of one run.
type fanoutRun struct {
	cfg        FanoutConfig
	addr, dir  string
	d          *dialer
	httpc      *http.Client
	metricsURL string
	run        string // unique per run, so users never collide with a rerun on the same node
	sources    int    // client processes started so far, for their source addresses
	serverPID  int    // 0: unknown, no CPU figure
	pprofAddr  string // the server's pprof endpoint, when profiling
}

func (r *fanoutRun) scenario(ctx context.Context, idx int, s FanoutScenario) (res FanoutResult, err error) {
	res.Scenario = s
	prefix := fmt.Sprintf("f%s-%d-", r.run, idx)
	user := func(i int) string { return prefix + strconv.Itoa(i) }

	owner, err := dialRPC(ctx, r.d, user(0), "bench")
	if err != nil {
		return res, err
	}
	defer owner.close()
	others := make([]string, s.Members-1)
	for i := range others {
		others[i] = user(i + 1)
	}
	conv, err := owner.createGroup(ctx, s.Name, others, r.cfg.Chunk, r.cfg.CreateMembers, &res)
	if err != nil {
		return res, err
	}
	res.Tier = conv.Tier
	fmt.Fprintf(r.cfg.Out, "  %-16s setup: create_group %v, %d add_members frames %v\n", s.Name,
		res.Create.Round(time.Millisecond), res.AddFrames, res.Add.Round(time.Millisecond))

	gauge0, err := r.gauge(ctx)
	if err != nil {
		return res, err
	}
	var procs []*fanoutProc
	defer func() {
		for _, p := range procs {
			err = errors.Join(err, p.stop())
		}
	}()
	for k, part := range splitRange(s.Online, max(s.Procs, 1)) {
		if s.Online == 0 || part[0] == part[1] {
			continue
		}
		cc := DefaultFanoutClientConfig()
		cc.Addr, cc.DataDir, cc.Prefix, cc.From, cc.To = r.addr, r.dir, prefix, part[0], part[1]
		cc.LocalIP = fmt.Sprintf("127.0.0.%d", 30+r.sources%200)
		cc.AckEvery, cc.AckByPush = r.cfg.AckEvery, r.cfg.AckByPush
		r.sources++
		p, err := r.cfg.startClient(fmt.Sprintf("%s client %d", s.Name, k), cc)
		if err != nil {
			return res, err
		}
		procs = append(procs, p)
	}
	started := time.Now()
	if err := readyAll(ctx, procs); err != nil {
		return res, err
	}
	if s.Online > 0 {
		r.cfg.Logger.Info("members online", "scenario", s.Name, "n", s.Online, "took", time.Since(started).Round(time.Millisecond))
	}
	// Every member must be online (pushed to, in the online index) before
	// the first send, or the run would measure the handshakes.
	if err := r.waitGauge(ctx, gauge0+float64(s.Online)); err != nil {
		return res, err
	}
	// The gauge moves before the session is registered for pushes and
	// marked online, a moment later in the same handshake.
	if err := sleepCtx(ctx, time.Second); err != nil {
		return res, err
	}

	before, err := ScrapeMetrics(ctx, r.httpc, r.metricsURL)
	if err != nil {
		return res, err
	}
	if err := r.window("start", s.Name); err != nil {
		return res, err
	}
	cpu0 := r.cpuTimes(procs)
	var profiled sync.WaitGroup
	if r.pprofAddr != "" && s.Online > 0 {
		profiled.Add(1)
		go func() {
			defer profiled.Done()
			r.profile(ctx, s.Name)
		}()
	}
	start := time.Now()
	seqs, errs, err := owner.sendAll(ctx, conv.ConvID, prefix, r.cfg.Messages, r.cfg.Rate, r.cfg.BodyBytes)
	if err != nil {
		return res, err
	}
	res.Sent, res.Acked, res.Errors = r.cfg.Messages, len(seqs), errs

	if len(procs) > 0 {
		if err := waitDeliveries(ctx, procs, conv.ConvID, seqs, s.Online, r.cfg.DeliveryWait); err != nil {
			return res, err
		}
	}
	cpu1 := r.cpuTimes(procs)
	if err := r.window("end", s.Name); err != nil {
		return res, err
	}
	if cpu0.ok && cpu1.ok {
		res.ServerCPU, res.ClientCPU = cpu1.server-cpu0.server, cpu1.clients-cpu0.clients
	}
	profiled.Wait()
	// The ACK goes out before the fan-out, so the counters may trail it.
	after, err := r.waitFanout(ctx, before, float64(len(seqs)))
	if err != nil {
		return res, err
	}
	if len(procs) > 0 {
		// Read last, so that re-sends the node made while the counters
		// were read are in the clients' figures too.
		rep, err := collectReports(procs)
		if err != nil {
			return res, err
		}
		res.Check = checkDeliveries(rep.Counts, conv.ConvID, seqs, s.Online)
		res.Dups, res.Gaps = rep.Dups, rep.Gaps
		res.Latency = rep.Latency.Summarize()
		res.FromSend = rep.FromSend.Summarize()
		if rep.LastNS > 0 {
			res.Elapsed = time.Unix(0, rep.LastNS).Sub(start)
		}
		if rep.Live != rep.Opened {
			return res, fmt.Errorf("the server closed %d of %d member connections", rep.Opened-rep.Live, rep.Opened)
		}
	}
	res.FanoutMessages = delta(before, after, "parley_fanout_messages_total")
	res.Rows = delta(before, after, "parley_fanout_row_writes_total")
	res.Pushes = delta(before, after, "parley_fanout_pushes_total")
	res.Retransmits = delta(before, after, "parley_retransmits_total")
	return res, nil
}

// window appends "EDGE SCENARIO" to the configured window file, synced,
// so that a reader polling it sees the line at once.
func (r *fanoutRun) window(edge, scenario string) error {
	if r.cfg.WindowFile == "" {
		return nil
	}
	f, err := os.OpenFile(r.cfg.WindowFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("window file: %w", err)
	}
	_, err = fmt.Fprintf(f, "%s %s\n", edge, scenario)
	return errors.Join(err, f.Close())
}

// cpuSample is the CPU time used so far by the server and the clients.
type cpuSample struct {
	server, clients time.Duration
	ok              bool // both known
}

func (r *fanoutRun) cpuTimes(procs []*fanoutProc) cpuSample {
	if r.serverPID == 0 {
		return cpuSample{}
	}
	srv, err := ReadCPUTime(r.serverPID)
	if err != nil {
		r.cfg.Logger.Warn("server cpu time", "err", err)
		return cpuSample{}
	}
	c := cpuSample{server: srv, ok: true}
	for _, p := range procs {
		if p.pid == 0 {
			continue // in-process (tests)
		}
		t, err := ReadCPUTime(p.pid)
		if err != nil {
			r.cfg.Logger.Warn("client cpu time", "err", err)
			return cpuSample{}
		}
		c.clients += t
	}
	return c
}

// profile saves a CPU and an allocation profile of the server over the
// sending window. A server without the pprof endpoint (an older build)
// gets a warning, not a failed run.
func (r *fanoutRun) profile(ctx context.Context, scenario string) {
	secs := 5
	if r.cfg.Rate > 0 {
		secs = max(1, int(float64(r.cfg.Messages)/r.cfg.Rate))
	}
	var wg sync.WaitGroup
	for _, kind := range []string{"profile", "allocs"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := "cpu"
			if kind == "allocs" {
				name = "allocs"
			}
			path := filepath.Join(r.cfg.ProfileDir, scenario+"."+name+".pprof")
			if err := fetchProfile(ctx, fmt.Sprintf("http://%s/debug/pprof/%s?seconds=%d", r.pprofAddr, kind, secs), path); err != nil {
				r.cfg.Logger.Warn("profile", "kind", name, "err", err)
				return
			}
			r.cfg.Logger.Info("profile saved", "path", path)
		}()
	}
	wg.Wait()
}

func fetchProfile(ctx context.Context, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func (r *fanoutRun) gauge(ctx context.Context) (float64, error) {
	m, err := ScrapeMetrics(ctx, r.httpc, r.metricsURL)
	if err != nil {
		return 0, err
	}
	v, _ := m.Get("parley_connections")
	return v, nil
}

func (r *fanoutRun) waitGauge(ctx context.Context, want float64) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := r.gauge(ctx)
		if err != nil {
			return err
		}
		if got == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("parley_connections is %.0f, want %.0f", got, want)
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

func (r *fanoutRun) waitFanout(ctx context.Context, before Metrics, messages float64) (Metrics, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		after, err := ScrapeMetrics(ctx, r.httpc, r.metricsURL)
		if err != nil {
			return nil, err
		}
		if delta(before, after, "parley_fanout_messages_total") >= messages || time.Now().After(deadline) {
			return after, nil
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return nil, err
		}
	}
}

// waitDeliveries polls the client processes until every member has every
// message or wait has passed since the last ACK.
func waitDeliveries(ctx context.Context, procs []*fanoutProc, conv uint64, seqs []uint64, members int, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		rep, err := collectReports(procs)
		if err != nil {
			return err
		}
		if checkDeliveries(rep.Counts, conv, seqs, members).Missing == 0 || time.Now().After(deadline) {
			return nil
		}
		if err := sleepCtx(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
}

// collectReports asks every client for its report and merges them.
func collectReports(procs []*fanoutProc) (FanoutReport, error) {
	reps := make([]FanoutReport, len(procs))
	for i, p := range procs {
		rep, err := p.report()
		if err != nil {
			return FanoutReport{}, err
		}
		reps[i] = rep
	}
	return mergeReports(reps), nil
}

// fanoutProc is a client process (or, in tests, goroutine) and its line
// protocol pipes.
type fanoutProc struct {
	name  string
	pid   int // 0 when in-process
	stdin io.WriteCloser
	out   *bufio.Scanner
	// end closes stdin, waits for the client to exit and reaps it.
	end func() error
}

func (p *fanoutProc) ready() error {
	if !p.out.Scan() {
		return fmt.Errorf("%s: exited before it was ready (%v)", p.name, p.out.Err())
	}
	line := p.out.Text()
	verb, rest, _ := strings.Cut(line, " ")
	if verb != respReady {
		return fmt.Errorf("%s: %s", p.name, rest)
	}
	return nil
}

func (p *fanoutProc) report() (FanoutReport, error) {
	if _, err := fmt.Fprintln(p.stdin, cmdReport); err != nil {
		return FanoutReport{}, fmt.Errorf("%s: %w", p.name, err)
	}
	if !p.out.Scan() {
		return FanoutReport{}, fmt.Errorf("%s: exited without answering (%v)", p.name, p.out.Err())
	}
	rep, err := parseReport(p.out.Text())
	if err != nil {
		return FanoutReport{}, fmt.Errorf("%s: %w", p.name, err)
	}
	return rep, nil
}

func (p *fanoutProc) stop() error { return p.end() }

// readyAll waits for every client to have its connections open. A client
// blocked in a handshake does not watch ctx, so cancellation is left to the
// caller stopping the clients.
func readyAll(ctx context.Context, procs []*fanoutProc) error {
	errc := make(chan error, len(procs))
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errc <- p.ready()
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	close(errc)
	var errs []error
	for err := range errc {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// execClient starts a client as a child process of ClientBinary.
func (c FanoutConfig) execClient(name string, cc FanoutClientConfig) (*fanoutProc, error) {
	cmd := exec.Command(c.ClientBinary, c.ClientArgs(cc)...)
	cmd.Stderr = c.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	ch, err := startChild(name, cmd, syscall.SIGKILL)
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	return &fanoutProc{name: name, pid: ch.pid(), stdin: stdin, out: sc, end: func() error {
		// Closing stdin asks the client to close its connections and
		// exit; one that does not in time is killed.
		stdin.Close()
		select {
		case <-ch.done:
		case <-time.After(15 * time.Second):
		}
		return ch.stop(syscall.SIGKILL, time.Second)
	}}, nil
}

// rpcConn is the sender's connection: requests are matched to answers by
// rid, pushes are acknowledged at once, and a ping keeps it alive while
// the members' connections are being opened.
type rpcConn struct {
	*wsConn
	done    chan struct{} // closed when the reader stops
	stopped chan struct{} // closed by close, ends the pinger
	wg      sync.WaitGroup

	mu struct {
		sync.Mutex
		next    int
		pending map[string]chan *protocol.Frame
	}
}

func dialRPC(ctx context.Context, d *dialer, user, device string) (*rpcConn, error) {
	ws, hello, err := d.dial(ctx, user, device)
	if err != nil {
		return nil, err
	}
	c := &rpcConn{wsConn: &wsConn{ws: ws}, done: make(chan struct{}), stopped: make(chan struct{})}
	c.mu.pending = make(map[string]chan *protocol.Frame)
	c.wg.Add(2)
	go c.read()
	go c.ping(time.Duration(hello.HeartbeatMS) * time.Millisecond / 2)
	return c, nil
}

func (c *rpcConn) close() {
	close(c.stopped)
	c.ws.Close()
	c.wg.Wait()
}

func (c *rpcConn) read() {
	defer c.wg.Done()
	defer close(c.done)
	for {
		_, data, err := c.ws.ReadMessage()
		if err != nil {
			return
		}
		var f protocol.Frame
		if err := json.Unmarshal(data, &f); err != nil {
			continue
		}
		if f.Type == protocol.TypeMsg && f.Message != nil {
			// As the SDKs do: a large group's push is never acknowledged.
			if f.Ack != protocol.AckNone {
				_ = c.write(&protocol.Frame{Type: protocol.TypeDelivered, ConvID: f.Message.ConvID, Seq: f.Message.Seq})
			}
			continue
		}
		if f.RID == "" {
			continue
		}
		c.mu.Lock()
		ch := c.mu.pending[f.RID]
		delete(c.mu.pending, f.RID)
		c.mu.Unlock()
		if ch != nil {
			ch <- &f
		}
	}
}

func (c *rpcConn) ping(every time.Duration) {
	defer c.wg.Done()
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-c.stopped:
			return
		case <-t.C:
			_ = c.write(&protocol.Frame{Type: protocol.TypePing})
		}
	}
}

// request writes f with a fresh rid; the channel receives its answer.
func (c *rpcConn) request(f *protocol.Frame) (<-chan *protocol.Frame, error) {
	ch := make(chan *protocol.Frame, 1)
	c.mu.Lock()
	c.mu.next++
	f.RID = "r" + strconv.Itoa(c.mu.next)
	c.mu.pending[f.RID] = ch
	c.mu.Unlock()
	if err := c.write(f); err != nil {
		return nil, fmt.Errorf("%s: %w", f.Type, err)
	}
	return ch, nil
}

var errConnClosed = errors.New("connection closed")

// await returns the answer on ch; an error frame becomes an error.
func (c *rpcConn) await(ctx context.Context, ch <-chan *protocol.Frame) (*protocol.Frame, error) {
	select {
	case f := <-ch:
		if f.Type == protocol.TypeError {
			return f, fmt.Errorf("%s: %s", f.Code, f.Error)
		}
		return f, nil
	case <-c.done:
		return nil, errConnClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (c *rpcConn) call(ctx context.Context, f *protocol.Frame) (*protocol.Frame, error) {
	ch, err := c.request(f)
	if err != nil {
		return nil, err
	}
	return c.await(ctx, ch)
}

// createGroup creates a group of the caller and members, first ids (chunk
// if negative) in create_group and chunk ids per add_members frame after
// it, and returns the group as the node describes it after the last
// addition (its tier included). It records the frames' times in res.
func (c *rpcConn) createGroup(ctx context.Context, name string, members []string, chunk, first int, res *FanoutResult) (*protocol.ConvInfo, error) {
	if first < 0 {
		first = chunk
	}
	first = min(first, len(members))
	parts := append([][]string{members[:first]}, chunks(members[first:], chunk)...)
	start := time.Now()
	f, err := c.call(ctx, &protocol.Frame{Type: protocol.TypeCreateGroup, Name: name, Members: parts[0]})
	if err != nil {
		return nil, fmt.Errorf("create group: %w", err)
	}
	if f.Conv == nil {
		return nil, fmt.Errorf("create group: answered %q without a conversation", f.Type)
	}
	res.Create = time.Since(start)
	info := f.Conv
	for _, p := range parts[1:] {
		if len(p) == 0 {
			continue
		}
		start := time.Now()
		f, err := c.call(ctx, &protocol.Frame{Type: protocol.TypeAddMembers, ConvID: info.ConvID, Members: p})
		res.Add += time.Since(start)
		res.AddFrames++
		if err != nil {
			return nil, fmt.Errorf("add members: %w", err)
		}
		if f.Conv == nil {
			return nil, fmt.Errorf("add members: answered %q without a conversation", f.Type)
		}
		info = f.Conv
	}
	if info.MemberCount != len(members)+1 {
		return nil, fmt.Errorf("create group: the node counts %d members, want %d", info.MemberCount, len(members)+1)
	}
	return info, nil
}

// sendAll sends n messages to conv, paced at rate per second (0: each after
// the previous ACK), and returns the seqs of those ACKed and the number
// answered with an error.
func (c *rpcConn) sendAll(ctx context.Context, conv uint64, prefix string, n int, rate float64, bodyBytes int) ([]uint64, int, error) {
	start := time.Now()
	answers := make([]<-chan *protocol.Frame, 0, n)
	var seqs []uint64
	errs := 0
	collect := func(ch <-chan *protocol.Frame) error {
		f, err := c.await(ctx, ch)
		switch {
		case f != nil && f.Type == protocol.TypeError:
			errs++
		case err != nil:
			return err
		default:
			seqs = append(seqs, f.Seq)
		}
		return nil
	}
	for j := range n {
		if rate > 0 {
			at := start.Add(time.Duration(float64(j) / rate * float64(time.Second)))
			if err := sleepCtx(ctx, time.Until(at)); err != nil {
				return nil, 0, err
			}
		}
		body := stampBody(time.Now(), bodyBytes)
		ch, err := c.request(&protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: prefix + "m" + strconv.Itoa(j), Body: body})
		if err != nil {
			return nil, 0, err
		}
		if rate == 0 {
			if err := collect(ch); err != nil {
				return nil, 0, err
			}
			continue
		}
		answers = append(answers, ch)
	}
	for _, ch := range answers {
		if err := collect(ch); err != nil {
			return nil, 0, err
		}
	}
	return seqs, errs, nil
}

// ackString describes the clients' acknowledgements.
func ackString(byPush bool, every time.Duration) string {
	if byPush {
		return fmt.Sprintf("as each push asks (none: never; batch: every %v; else at once)", every)
	}
	if every == 0 {
		return "every push"
	}
	return fmt.Sprintf("every %v", every)
}
