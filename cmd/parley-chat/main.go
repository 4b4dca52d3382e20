// Command parley-chat is Parley's terminal chat client, on the Go client
// SDK (client, client/e2ee, client/e2eechat). It is a command of its own,
// not a subcommand of cmd/parley, so that the server's binary links no
// client code.
//
//	parley-chat -token "$(parley token -user alice)"
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

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := runChat(ctx, os.Args[1:], os.Stdin, os.Stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "parley-chat:", err)
		os.Exit(1)
	}
}
