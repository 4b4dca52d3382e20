// Command parley is the Parley instant-messaging server and its tools. One
// binary runs every role: `parley serve` with no flags runs them all in one
// process on embedded storage under ./data.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

const usage = `parley — instant-messaging backend

usage: parley <command> [flags]

commands:
  serve    run a node (every role, embedded storage under ./data, by default)
  token    mint a development token for a user
  chat     terminal chat client
  bench    benchmarks: idle, send, fanout, history (embedded or against a cluster)
  migrate  create or upgrade the Cassandra schema of cluster mode
  version  print the version

Run 'parley <command> -h' for a command's flags.
`

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

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
	case "chat":
		return runChat(ctx, rest, os.Stdin, os.Stdout)
	case "bench":
		return runBench(ctx, rest)
	case "migrate":
		return runMigrate(ctx, rest, os.Stdout)
	case "version":
		fmt.Println("parley", version)
		return nil
	case "-h", "-help", "--help", "help":
		fmt.Print(usage)
		return nil
	}
	fmt.Fprint(os.Stderr, usage)
	return fmt.Errorf("unknown command %q", cmd)
}
