// Command parley-bench is Parley's load tools (internal/bench): idle
// memory, send throughput and latency, group fan-out, history reads. It
// starts a real `parley serve` child from the parley executable beside it
// (or -server-binary), or drives a running node or cluster, and re-executes
// itself for the client processes that hold the many connections (hidden
// subcommands idle-client, fanout-client, storm-client). It is a command of
// its own so that the server's binary links none of it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/parley-im/parley/internal/bench"
)

const benchUsage = `usage: parley-bench <idle|send|fanout|reactions|history|attach> [flags]

  idle     server RSS per idle authenticated connection (starts its own server)
  send     durable 1:1 send→ACK throughput and send→deliver latency
  fanout   group write amplification per fan-out tier and delivery to a large group
  reactions a reaction storm on one message of a large group, and plain messages beside it
  history  "latest 50" history reads through a running cluster's gateways
  attach   attachment throughput on each blob engine: the raw engine (dd, minio-go) and the blob seam

send and fanout start their own node, or drive a running one (-addr) or a
running cluster (-urls ws://g1,ws://g2 -key HEX -chats c1,c2). A node they
start runs the parley executable in this one's directory, or -server-binary.

Run 'parley-bench <name> -h' for its flags. Results: docs/benchmarks.md.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := runBench(ctx, os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "parley-bench:", err)
		os.Exit(1)
	}
}

func runBench(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, benchUsage)
		return errors.New("no benchmark named")
	}
	switch args[0] {
	case "idle":
		return runBenchIdle(ctx, args[1:])
	case "send":
		return runBenchSend(ctx, args[1:])
	case "fanout":
		return runBenchFanout(ctx, args[1:])
	case "reactions":
		return runBenchReactions(ctx, args[1:])
	case "history":
		return runBenchHistory(ctx, args[1:])
	case "attach":
		return runBenchAttach(ctx, args[1:])
	case idleClientCmd:
		// Not in the usage: the idle benchmark starts these itself.
		return runBenchIdleClient(ctx, args[1:])
	case fanoutClientCmd:
		// Not in the usage: the fanout benchmark starts these itself.
		return runBenchFanoutClient(ctx, args[1:])
	case stormClientCmd:
		// Not in the usage: internal/clustertest's reconnect storm starts these.
		return runBenchStormClient(ctx, args[1:])
	case "-h", "-help", "--help", "help":
		fmt.Print(benchUsage)
		return nil
	}
	fmt.Fprint(os.Stderr, benchUsage)
	return fmt.Errorf("unknown benchmark %q", args[0])
}

const (
	idleClientCmd   = "idle-client"
	fanoutClientCmd = "fanout-client"
	stormClientCmd  = "storm-client"
)

// serverBinaryFlag registers -server-binary on fs; the function it returns
// gives the parley executable to start as the server after parsing: the
// flag's value, or parley in this executable's directory.
func serverBinaryFlag(fs *flag.FlagSet) func() (string, error) {
	bin := fs.String("server-binary", "", "start this parley executable as the server (default: parley beside this executable; e.g. an older build, with this one's clients)")
	return func() (string, error) {
		if *bin != "" {
			return *bin, nil
		}
		exe, err := os.Executable()
		if err != nil {
			return "", err
		}
		beside := filepath.Join(filepath.Dir(exe), "parley")
		if st, err := os.Stat(beside); err != nil || !st.Mode().IsRegular() {
			return "", fmt.Errorf("no parley executable beside %s: build one (go build -o %s ./cmd/parley) or name one with -server-binary", exe, beside)
		}
		return beside, nil
	}
}

func benchLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func runBenchIdle(ctx context.Context, args []string) error {
	cfg := bench.DefaultIdleConfig()
	fs := flag.NewFlagSet("parley-bench idle", flag.ContinueOnError)
	fs.IntVar(&cfg.Conns, "conns", cfg.Conns, "idle connections in total")
	fs.IntVar(&cfg.Procs, "procs", cfg.Procs, fmt.Sprintf("client processes (each holds at most %d)", bench.MaxConnsPerClient))
	fs.IntVar(&cfg.Step, "step", cfg.Step, "connections added between RSS checkpoints")
	fs.DurationVar(&cfg.Settle, "settle", cfg.Settle, "pause before each RSS sample")
	server := serverBinaryFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("idle: %w", err)
	}
	if cfg.ServerBinary, err = server(); err != nil {
		return fmt.Errorf("idle: %w", err)
	}
	cfg.ClientBinary = exe
	cfg.Logger = benchLogger()
	cfg.ClientArgs = func(c bench.IdleClientConfig) []string {
		return []string{idleClientCmd,
			"-addr", c.Addr, "-data-dir", c.DataDir, "-local-ip", c.LocalIP,
			"-prefix", c.Prefix, "-concurrency", strconv.Itoa(c.Concurrency)}
	}
	_, err = bench.RunIdle(ctx, cfg)
	return err
}

func runBenchIdleClient(ctx context.Context, args []string) error {
	cfg := bench.DefaultIdleClientConfig()
	fs := flag.NewFlagSet("parley-bench "+idleClientCmd, flag.ContinueOnError)
	fs.StringVar(&cfg.Addr, "addr", "", "node address, host:port")
	fs.StringVar(&cfg.DataDir, "data-dir", "", "the node's data directory (development key)")
	fs.StringVar(&cfg.LocalIP, "local-ip", "", "source IP address of the connections")
	fs.StringVar(&cfg.Prefix, "prefix", "", "user id prefix, unique per client process")
	fs.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "handshakes in flight")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Logger = benchLogger().With("client", cfg.Prefix)
	return bench.RunIdleClient(ctx, cfg, os.Stdin, os.Stdout)
}

func runBenchSend(ctx context.Context, args []string) error {
	cfg := bench.DefaultSendConfig()
	fs := flag.NewFlagSet("parley-bench send", flag.ContinueOnError)
	fs.IntVar(&cfg.Pairs, "pairs", cfg.Pairs, "sender/receiver pairs, each in its own direct conversation")
	fs.IntVar(&cfg.Messages, "messages", cfg.Messages, "messages per sender")
	fs.IntVar(&cfg.Inflight, "inflight", cfg.Inflight, "unacknowledged sends per sender")
	fs.IntVar(&cfg.BodyBytes, "body-bytes", cfg.BodyBytes, "message body size")
	fs.StringVar(&cfg.Addr, "addr", "", "attach to this running node (host:port) instead of starting one")
	fs.StringVar(&cfg.DataDir, "data-dir", "", "with -addr: the node's data directory (its development key signs the tokens)")
	fs.BoolVar(&cfg.Fsyncs, "fsyncs", false, "count the server's fsync/fdatasync calls with perf(1); needs perf and permission to trace")
	fs.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "bound on the whole run")
	server := serverBinaryFlag(fs)
	cluster := clusterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if t, err := cluster(); err != nil || t != nil {
		if err != nil {
			return fmt.Errorf("send: %w", err)
		}
		cfg.Logger = benchLogger()
		_, err := bench.RunClusterSend(ctx, *t, cfg)
		return err
	}
	if cfg.Addr == "" {
		bin, err := server()
		if err != nil {
			return fmt.Errorf("send: %w", err)
		}
		cfg.ServerBinary = bin
	}
	cfg.Logger = benchLogger()
	_, err := bench.RunSend(ctx, cfg)
	return err
}

func runBenchFanout(ctx context.Context, args []string) error {
	cfg := bench.DefaultFanoutConfig()
	fs := flag.NewFlagSet("parley-bench fanout", flag.ContinueOnError)
	fs.IntVar(&cfg.Messages, "messages", cfg.Messages, "messages sent per scenario")
	fs.Float64Var(&cfg.Rate, "rate", cfg.Rate, "messages per second; 0 sends each after the previous ACK")
	fs.IntVar(&cfg.BodyBytes, "body-bytes", cfg.BodyBytes, "message body size")
	fs.DurationVar(&cfg.AckEvery, "ack-every", cfg.AckEvery, "each member connection's cumulative delivered cadence (with -ack-by push: of the pushes asking for batched acks); 0 acks every push")
	ackBy := fs.String("ack-by", "push", "push: acknowledge as each push's ack field asks, as the SDKs do; timer: every push on the -ack-every cadence")
	procs := fs.Int("procs", 3, fmt.Sprintf("client processes of the delivery scenario (each holds at most %d)", bench.MaxConnsPerClient))
	members := fs.Int("delivery-members", 10000, "members of the delivery scenario's group")
	online := fs.Int("delivery-online", -1, "of them online (negative: all)")
	only := fs.String("only", "", "comma-separated scenario names to run (default: all)")
	fs.DurationVar(&cfg.DeliveryWait, "delivery-wait", cfg.DeliveryWait, "wait for pushes after the last ACK")
	fs.IntVar(&cfg.Chunk, "chunk", cfg.Chunk, "member ids per create_group / add_members frame of the setup")
	fs.IntVar(&cfg.CreateMembers, "create-members", cfg.CreateMembers, "member ids of the create_group frame, the rest in add_members frames (negative: -chunk)")
	groupMembers := fs.Int("group-members", 0, "also offer scenario group-N: a group of N members, none online (its setup time is the figure; pick it with -only)")
	fs.StringVar(&cfg.Addr, "addr", "", "attach to this running node (host:port) instead of starting one")
	fs.StringVar(&cfg.DataDir, "data-dir", "", "with -addr: the node's data directory (its development key signs the tokens)")
	fs.IntVar(&cfg.ServerPID, "server-pid", 0, "with -addr: the node's process id, to report its CPU time per delivery")
	server := serverBinaryFlag(fs)
	fs.StringVar(&cfg.WindowFile, "window-file", "", `append "start SCENARIO" and "end SCENARIO" to this file at the edges of each sending window (for scripts that measure processes outside the benchmark)`)
	fs.StringVar(&cfg.ProfileDir, "profile-dir", "", "save CPU and allocation profiles of the server's sending window here (the server opens pprof on PARLEY_PPROF)")
	fs.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "bound on the whole run")
	cluster := clusterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	byPush, err := parseAckBy(*ackBy)
	if err != nil {
		return fmt.Errorf("fanout: %w", err)
	}
	cfg.AckByPush = byPush
	target, err := cluster()
	if err != nil {
		return fmt.Errorf("fanout: %w", err)
	}
	if *online < 0 {
		*online = *members
	}
	if *online > *members {
		return fmt.Errorf("fanout: -delivery-online %d exceeds -delivery-members %d", *online, *members)
	}
	cfg.Scenarios = bench.FanoutScenarios(*members, *online, *procs)
	if *groupMembers > 0 {
		cfg.Scenarios = append(cfg.Scenarios, bench.FanoutScenario{Name: "group-" + strconv.Itoa(*groupMembers), Members: *groupMembers})
	}
	if *only != "" {
		var picked []bench.FanoutScenario
		for _, name := range strings.Split(*only, ",") {
			found := false
			for _, s := range cfg.Scenarios {
				if s.Name == strings.TrimSpace(name) {
					picked, found = append(picked, s), true
				}
			}
			if !found {
				return fmt.Errorf("fanout: no scenario %q", name)
			}
		}
		cfg.Scenarios = picked
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("fanout: %w", err)
	}
	cfg.ClientBinary = exe
	if target == nil && cfg.Addr == "" {
		if cfg.ServerBinary, err = server(); err != nil {
			return fmt.Errorf("fanout: %w", err)
		}
	}
	cfg.Logger = benchLogger()
	cfg.ClientArgs = func(c bench.FanoutClientConfig) []string {
		return []string{fanoutClientCmd,
			"-addr", c.Addr, "-data-dir", c.DataDir, "-local-ip", c.LocalIP, "-prefix", c.Prefix,
			"-from", strconv.Itoa(c.From), "-to", strconv.Itoa(c.To), "-device", c.Device,
			"-concurrency", strconv.Itoa(c.Concurrency), "-ack-every", c.AckEvery.String(), "-ack-by", ackByString(c.AckByPush)}
	}
	if target != nil {
		_, err = bench.RunClusterFanout(ctx, *target, cfg)
		return err
	}
	_, err = bench.RunFanout(ctx, cfg)
	return err
}

func runBenchHistory(ctx context.Context, args []string) error {
	cfg := bench.DefaultHistoryConfig()
	fs := flag.NewFlagSet("parley-bench history", flag.ContinueOnError)
	fs.IntVar(&cfg.Convs, "convs", cfg.Convs, "direct conversations, read in parallel")
	fs.IntVar(&cfg.Messages, "messages", cfg.Messages, "messages seeded per conversation")
	fs.IntVar(&cfg.BodyBytes, "body-bytes", cfg.BodyBytes, "message body size")
	fs.IntVar(&cfg.Reads, "reads", cfg.Reads, "history requests per conversation, of each kind (latest, page before a random seq)")
	fs.IntVar(&cfg.Limit, "limit", cfg.Limit, "messages per page")
	fs.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "bound on the whole run")
	cluster := clusterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	t, err := cluster()
	if err == nil && t == nil {
		err = fmt.Errorf("-urls and -key are required")
	}
	if err != nil {
		return fmt.Errorf("history: %w", err)
	}
	cfg.Logger = benchLogger()
	_, err = bench.RunClusterHistory(ctx, *t, cfg)
	return err
}

// clusterFlags registers -urls, -key and -chats on fs; the function it
// returns gives the cluster they name after parsing, or nil without -urls.
func clusterFlags(fs *flag.FlagSet) func() (*bench.ClusterTarget, error) {
	urls := fs.String("urls", "", "drive a running cluster: its gateways, comma-separated ws://host:port")
	key := fs.String("key", "", "with -urls: the cluster's HS256 key (auth.hs256_key), hex; it signs the benchmark's tokens")
	chats := fs.String("chats", "", "with -urls: the chat processes' host:port, comma-separated (their /metrics count stored and fanned-out messages)")
	return func() (*bench.ClusterTarget, error) {
		if *urls == "" {
			if *key != "" || *chats != "" {
				return nil, fmt.Errorf("-key and -chats need -urls")
			}
			return nil, nil
		}
		t, err := bench.ParseClusterTarget(*urls, *key, *chats)
		if err != nil {
			return nil, err
		}
		return &t, nil
	}
}

func runBenchFanoutClient(ctx context.Context, args []string) error {
	cfg := bench.DefaultFanoutClientConfig()
	fs := flag.NewFlagSet("parley-bench "+fanoutClientCmd, flag.ContinueOnError)
	fs.StringVar(&cfg.Addr, "addr", "", "node address, host:port")
	fs.StringVar(&cfg.DataDir, "data-dir", "", "the node's data directory (development key)")
	fs.StringVar(&cfg.LocalIP, "local-ip", "", "source IP address of the connections")
	fs.StringVar(&cfg.Prefix, "prefix", "", "user id prefix")
	fs.IntVar(&cfg.From, "from", 0, "first user number")
	fs.IntVar(&cfg.To, "to", 0, "user number after the last")
	fs.StringVar(&cfg.Device, "device", cfg.Device, "device id of every connection")
	fs.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "handshakes in flight")
	fs.DurationVar(&cfg.AckEvery, "ack-every", cfg.AckEvery, "cumulative delivered cadence; 0 acks every push")
	ackBy := fs.String("ack-by", "push", "push or timer (see fanout)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if cfg.AckByPush, err = parseAckBy(*ackBy); err != nil {
		return err
	}
	cfg.Logger = benchLogger().With("client", fmt.Sprintf("%s%d-%d", cfg.Prefix, cfg.From, cfg.To))
	return bench.RunFanoutClient(ctx, cfg, os.Stdin, os.Stdout)
}

func runBenchStormClient(ctx context.Context, args []string) error {
	cfg := bench.DefaultStormClientConfig()
	fs := flag.NewFlagSet("parley-bench "+stormClientCmd, flag.ContinueOnError)
	urls := fs.String("urls", "", "comma-separated gateway WebSocket bases (ws://host:port)")
	key := fs.String("key", "", "the cluster's HS256 key, hex (mints the tokens)")
	fs.StringVar(&cfg.Prefix, "prefix", "", "user id prefix")
	fs.IntVar(&cfg.From, "from", 0, "first user number")
	fs.IntVar(&cfg.To, "to", 0, "user number after the last")
	fs.StringVar(&cfg.Device, "device", cfg.Device, "device id of every client")
	fs.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "clients making their first connection at once")
	fs.DurationVar(&cfg.MinBackoff, "min-backoff", cfg.MinBackoff, "reconnect backoff floor")
	fs.DurationVar(&cfg.MaxBackoff, "max-backoff", cfg.MaxBackoff, "reconnect backoff ceiling")
	if err := fs.Parse(args); err != nil {
		return err
	}
	t, err := bench.ParseClusterTarget(*urls, *key, "")
	if err != nil {
		return fmt.Errorf("%s: %w", stormClientCmd, err)
	}
	cfg.URLs, cfg.Key = t.URLs, t.Key
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("client", fmt.Sprintf("%s%d-%d", cfg.Prefix, cfg.From, cfg.To))
	return bench.RunStormClient(ctx, cfg, os.Stdin, os.Stdout)
}

// parseAckBy reads -ack-by: push (true) or timer.
func parseAckBy(s string) (bool, error) {
	switch s {
	case "push":
		return true, nil
	case "timer":
		return false, nil
	}
	return false, fmt.Errorf("-ack-by must be push or timer, got %q", s)
}

func ackByString(byPush bool) string {
	if byPush {
		return "push"
	}
	return "timer"
}

func runBenchReactions(ctx context.Context, args []string) error {
	cfg := bench.DefaultReactionsConfig()
	fs := flag.NewFlagSet("parley-bench reactions", flag.ContinueOnError)
	fs.IntVar(&cfg.Members, "members", cfg.Members, "members of the group")
	fs.IntVar(&cfg.Online, "online", cfg.Online, "of them online, each counting the pushes it receives")
	fs.IntVar(&cfg.Reactors, "reactors", cfg.Reactors, "members reacting (each toggles one emoji on the message)")
	fs.Float64Var(&cfg.Rate, "rate", cfg.Rate, "reactions per second, all reactors together")
	fs.Float64Var(&cfg.MessageRate, "message-rate", cfg.MessageRate, "plain messages per second of the comparison phase")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of each phase")
	fs.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "bound on the whole run")
	server := serverBinaryFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if cfg.ServerBinary, err = server(); err != nil {
		return fmt.Errorf("reactions: %w", err)
	}
	cfg.Logger = benchLogger()
	_, err = bench.RunReactions(ctx, cfg)
	return err
}
