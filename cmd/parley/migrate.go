package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/store/cassandra"
)

const migrateUsage = "parley migrate [--config FILE] [--<setting> VALUE ...]   (uses the cluster.cassandra_hosts, keyspace, replication_factor and consistency settings)"

// runMigrate is `parley migrate`: it creates or upgrades the Cassandra
// keyspace and tables of cluster mode. It takes serve's configuration
// (flags, PARLEY_* variables, --config file), checks only the settings it
// uses (so Redis and NATS need not be configured), and is safe to run
// again.
func runMigrate(ctx context.Context, args []string, out io.Writer) error {
	fs := config.NewFlagSet("parley migrate")
	cfg, err := config.ParseUnchecked(fs, args, os.Environ())
	if errors.Is(err, flag.ErrHelp) {
		config.Usage(stdout, migrateUsage, fs)
	}
	if err != nil {
		return err
	}
	if err := cfg.ValidateMigrate(); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	cc := cfg.Cassandra()
	if err := cassandra.Migrate(ctx, cc); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	_, err = fmt.Fprintf(out, "parley: keyspace %q is up to date on %v\n", cc.Keyspace, cc.Hosts)
	return err
}
