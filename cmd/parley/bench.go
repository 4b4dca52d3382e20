package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/parley-im/parley/internal/bench"
)

const benchUsage = `usage: parley bench <idle|send|fanout|history> [flags]

  idle     server RSS per idle authenticated connection (starts its own server)
  send     durable 1:1 send→ACK throughput and send→deliver latency
  fanout   group write amplification per fan-out tier and delivery to a large group
  history  "latest 50" history reads through a running cluster's gateways

send and fanout start their own node, or drive a running one (-addr) or a
running cluster (-urls ws://g1,ws://g2 -key HEX -chats c1,c2).

Run 'parley bench <name> -h' for its flags. Results: docs/benchmarks.md.
`

func runBench(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, benchUsage)
		return fmt.Errorf("bench: no benchmark named")
	}
	switch args[0] {
	case "idle":
		return runBenchIdle(ctx, args[1:])
	case "send":
		return runBenchSend(ctx, args[1:])
	case "fanout":
		return runBenchFanout(ctx, args[1:])
	case "history":
		return runBenchHistory(ctx, args[1:])
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
	return fmt.Errorf("bench: unknown benchmark %q", args[0])
}

const (
	idleClientCmd   = "idle-client"
	fanoutClientCmd = "fanout-client"
	stormClientCmd  = "storm-client"
)

func benchLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func runBenchIdle(ctx context.Context, args []string) error {
	cfg := bench.DefaultIdleConfig()
	fs := flag.NewFlagSet("bench idle", flag.ContinueOnError)
	fs.IntVar(&cfg.Conns, "conns", cfg.Conns, "idle connections in total")
	fs.IntVar(&cfg.Procs, "procs", cfg.Procs, fmt.Sprintf("client processes (each holds at most %d)", bench.MaxConnsPerClient))
	fs.IntVar(&cfg.Step, "step", cfg.Step, "connections added between RSS checkpoints")
	fs.DurationVar(&cfg.Settle, "settle", cfg.Settle, "pause before each RSS sample")
	if err := fs.Parse(args); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench idle: %w", err)
	}
	cfg.Binary = exe
	cfg.Logger = benchLogger()
	cfg.ClientArgs = func(c bench.IdleClientConfig) []string {
		return []string{"bench", idleClientCmd,
			"-addr", c.Addr, "-data-dir", c.DataDir, "-local-ip", c.LocalIP,
			"-prefix", c.Prefix, "-concurrency", strconv.Itoa(c.Concurrency)}
	}
	_, err = bench.RunIdle(ctx, cfg)
	return err
}

func runBenchIdleClient(ctx context.Context, args []string) error {
	cfg := bench.DefaultIdleClientConfig()
	fs := flag.NewFlagSet("bench "+idleClientCmd, flag.ContinueOnError)
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
	fs := flag.NewFlagSet("bench send", flag.ContinueOnError)
	fs.IntVar(&cfg.Pairs, "pairs", cfg.Pairs, "sender/receiver pairs, each in its own direct conversation")
	fs.IntVar(&cfg.Messages, "messages", cfg.Messages, "messages per sender")
	fs.IntVar(&cfg.Inflight, "inflight", cfg.Inflight, "unacknowledged sends per sender")
	fs.IntVar(&cfg.BodyBytes, "body-bytes", cfg.BodyBytes, "message body size")
	fs.StringVar(&cfg.Addr, "addr", "", "attach to this running node (host:port) instead of starting one")
	fs.StringVar(&cfg.DataDir, "data-dir", "", "with -addr: the node's data directory (its development key signs the tokens)")
	fs.BoolVar(&cfg.Fsyncs, "fsyncs", false, "count the server's fsync/fdatasync calls with perf(1); needs perf and permission to trace")
	fs.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "bound on the whole run")
	cluster := clusterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if t, err := cluster(); err != nil || t != nil {
		if err != nil {
			return fmt.Errorf("bench send: %w", err)
		}
		cfg.Logger = benchLogger()
		_, err := bench.RunClusterSend(ctx, *t, cfg)
		return err
	}
	if cfg.Addr == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("bench send: %w", err)
		}
		cfg.Binary = exe
	}
	cfg.Logger = benchLogger()
	_, err := bench.RunSend(ctx, cfg)
	return err
}

func runBenchFanout(ctx context.Context, args []string) error {
	cfg := bench.DefaultFanoutConfig()
	fs := flag.NewFlagSet("bench fanout", flag.ContinueOnError)
	fs.IntVar(&cfg.Messages, "messages", cfg.Messages, "messages sent per scenario")
	fs.Float64Var(&cfg.Rate, "rate", cfg.Rate, "messages per second; 0 sends each after the previous ACK")
	fs.IntVar(&cfg.BodyBytes, "body-bytes", cfg.BodyBytes, "message body size")
	fs.DurationVar(&cfg.AckEvery, "ack-every", cfg.AckEvery, "each member connection's cumulative delivered cadence; 0 acks every push")
	procs := fs.Int("procs", 3, fmt.Sprintf("client processes of the delivery scenario (each holds at most %d)", bench.MaxConnsPerClient))
	members := fs.Int("delivery-members", 10000, "members of the delivery scenario's group, all online")
	only := fs.String("only", "", "comma-separated scenario names to run (default: all)")
	fs.DurationVar(&cfg.DeliveryWait, "delivery-wait", cfg.DeliveryWait, "wait for pushes after the last ACK")
	fs.IntVar(&cfg.Chunk, "chunk", cfg.Chunk, "member ids per create_group / add_members frame of the setup")
	fs.IntVar(&cfg.CreateMembers, "create-members", cfg.CreateMembers, "member ids of the create_group frame, the rest in add_members frames (negative: -chunk)")
	groupMembers := fs.Int("group-members", 0, "also offer scenario group-N: a group of N members, none online (its setup time is the figure; pick it with -only)")
	fs.StringVar(&cfg.Addr, "addr", "", "attach to this running node (host:port) instead of starting one")
	fs.StringVar(&cfg.DataDir, "data-dir", "", "with -addr: the node's data directory (its development key signs the tokens)")
	fs.IntVar(&cfg.ServerPID, "server-pid", 0, "with -addr: the node's process id, to report its CPU time per delivery")
	fs.StringVar(&cfg.ServerBinary, "server-binary", "", "start this parley executable as the server (e.g. an older build), with this one's clients")
	fs.StringVar(&cfg.ProfileDir, "profile-dir", "", "save CPU and allocation profiles of the server's sending window here (the server opens pprof on PARLEY_PPROF)")
	fs.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "bound on the whole run")
	cluster := clusterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	target, err := cluster()
	if err != nil {
		return fmt.Errorf("bench fanout: %w", err)
	}
	cfg.Scenarios = bench.DefaultFanoutScenarios(*members, *procs)
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
				return fmt.Errorf("bench fanout: no scenario %q", name)
			}
		}
		cfg.Scenarios = picked
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench fanout: %w", err)
	}
	cfg.Binary = exe
	cfg.Logger = benchLogger()
	cfg.ClientArgs = func(c bench.FanoutClientConfig) []string {
		return []string{"bench", fanoutClientCmd,
			"-addr", c.Addr, "-data-dir", c.DataDir, "-local-ip", c.LocalIP, "-prefix", c.Prefix,
			"-from", strconv.Itoa(c.From), "-to", strconv.Itoa(c.To), "-device", c.Device,
			"-concurrency", strconv.Itoa(c.Concurrency), "-ack-every", c.AckEvery.String()}
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
	fs := flag.NewFlagSet("bench history", flag.ContinueOnError)
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
		return fmt.Errorf("bench history: %w", err)
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
	fs := flag.NewFlagSet("bench "+fanoutClientCmd, flag.ContinueOnError)
	fs.StringVar(&cfg.Addr, "addr", "", "node address, host:port")
	fs.StringVar(&cfg.DataDir, "data-dir", "", "the node's data directory (development key)")
	fs.StringVar(&cfg.LocalIP, "local-ip", "", "source IP address of the connections")
	fs.StringVar(&cfg.Prefix, "prefix", "", "user id prefix")
	fs.IntVar(&cfg.From, "from", 0, "first user number")
	fs.IntVar(&cfg.To, "to", 0, "user number after the last")
	fs.StringVar(&cfg.Device, "device", cfg.Device, "device id of every connection")
	fs.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "handshakes in flight")
	fs.DurationVar(&cfg.AckEvery, "ack-every", cfg.AckEvery, "cumulative delivered cadence; 0 acks every push")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Logger = benchLogger().With("client", fmt.Sprintf("%s%d-%d", cfg.Prefix, cfg.From, cfg.To))
	return bench.RunFanoutClient(ctx, cfg, os.Stdin, os.Stdout)
}

func runBenchStormClient(ctx context.Context, args []string) error {
	cfg := bench.DefaultStormClientConfig()
	fs := flag.NewFlagSet("bench "+stormClientCmd, flag.ContinueOnError)
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
		return fmt.Errorf("bench %s: %w", stormClientCmd, err)
	}
	cfg.URLs, cfg.Key = t.URLs, t.Key
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("client", fmt.Sprintf("%s%d-%d", cfg.Prefix, cfg.From, cfg.To))
	return bench.RunStormClient(ctx, cfg, os.Stdin, os.Stdout)
}
