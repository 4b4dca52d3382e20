// Command parley is the Parley instant-messaging server: it serves a node
// and administers one (tokens, the Cassandra schema). One binary runs every
// role: `parley serve` with no flags runs them all in one process on
// embedded storage under ./data. The terminal client (cmd/parley-chat) and
// the load tools (cmd/parley-bench) are commands of their own, so this
// binary links no client or benchmark code (deps_test.go).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/parley-im/parley/internal/buildinfo"
)

const usage = `parley — instant-messaging backend

usage: parley <command> [flags]

commands:
  serve    run a node (every role, embedded storage under ./data, by default)
  token    mint a token for a user with the server's HS256 key
  keygen   make an HS256 key or an Ed25519 key pair for tokens
  migrate  create or upgrade the Cassandra schema of cluster mode
  backup   write a consistent archive of a running embedded node's data
  restore  unpack a backup archive into a new data directory
  search   search reindex: rebuild a running node's search index
  kt       kt audit: verify a server's key transparency log from outside
  version  print the version, commit and Go release of this build

Run 'parley <command> -h' for a command's flags; serve, migrate and token
also list every setting with its YAML key, environment variable and default.
The terminal chat client and the benchmarks are commands of their own:
parley-chat (go run ./cmd/parley-chat) and parley-bench.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "parley:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return errors.New("no command")
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve":
		return runServe(ctx, rest)
	case "token":
		return runToken(rest, os.Stdout)
	case "keygen":
		return runKeygen(rest, os.Stdout)
	case "migrate":
		return runMigrate(ctx, rest, os.Stdout)
	case "backup":
		return runBackup(ctx, rest, os.Stderr)
	case "restore":
		return runRestore(rest, os.Stderr)
	case "search":
		return runSearch(ctx, rest, os.Stderr)
	case "kt":
		return runKT(ctx, rest, stdout)
	case "version":
		bi := buildinfo.Get()
		fmt.Fprintf(stdout, "parley %s (commit %s, %s)\n", bi.Version, bi.Commit, bi.Go)
		return nil
	case "-h", "-help", "--help", "help":
		fmt.Print(usage)
		return nil
	}
	fmt.Fprint(os.Stderr, usage)
	return fmt.Errorf("unknown command %q", cmd)
}
