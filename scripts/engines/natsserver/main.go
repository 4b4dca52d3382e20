// Command natsserver is a real NATS server (with JetStream when -js is
// given) built from the nats-server Go module pinned in go.mod, so tests and
// CI need no prebuilt binary. It takes nats-server's own command-line flags;
// scripts/engines/nats.sh builds and runs it.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/nats-io/nats-server/v2/server"
)

func main() {
	fs := flag.NewFlagSet("natsserver", flag.ExitOnError)
	opts, err := server.ConfigureOptions(fs, os.Args[1:],
		server.PrintServerAndExit, fs.Usage, server.PrintTLSHelpAndDie)
	if err != nil {
		server.PrintAndDie(fmt.Sprintf("natsserver: %s", err))
	}
	s, err := server.NewServer(opts)
	if err != nil {
		server.PrintAndDie(fmt.Sprintf("natsserver: %s", err))
	}
	s.ConfigureLogger()
	if err := server.Run(s); err != nil {
		server.PrintAndDie(fmt.Sprintf("natsserver: %s", err))
	}
	s.WaitForShutdown()
}
