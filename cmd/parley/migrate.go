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

// migrateSettings are the settings migrate reads (config.Cassandra).
var migrateSettings = []string{"cluster.cassandra_hosts", "cluster.keyspace", "cluster.replication_factor", "cluster.consistency", "cluster.serial_consistency", "store.bucket_width", "store.conversation_states", "store.conversation_idle"}

// runMigrate is `parley migrate`: it creates or upgrades the Cassandra
// keyspace and tables of cluster mode. It takes serve's configuration
// (flags, PARLEY_* variables, --config file), checks only the settings it
// uses (so Redis and NATS need not be configured), and is safe to run
// again.
func runMigrate(ctx context.Context, args []string, out io.Writer) error {
	fs := config.NewFlagSet("parley migrate")
	cfg, err := config.ParseUnchecked(fs, args, os.Environ())
	if errors.Is(err, flag.ErrHelp) {
		config.UsageOf(stdout, migrateUsage, fs, migrateSettings)
	}
	if err != nil {
		return err
	}
	if err := cfg.ValidateMigrate(); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	cc := cfg.Cassandra()
	applied, err := cassandra.MigrateReport(ctx, cc)
	for _, a := range applied {
		fmt.Fprintf(out, "parley: applied migration %d: %s\n", a.Version, a.Description)
	}
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	switch {
	case len(applied) == 0:
		_, err = fmt.Fprintf(out, "parley: keyspace %q is up to date (schema %d) on %v: nothing to do\n", cc.Keyspace, cassandra.SchemaVersion(), cc.Hosts)
	case applied[0].Version == 1:
		_, err = fmt.Fprintf(out, "parley: created keyspace %q (replication factor %d) with schema %d on %v\n", cc.Keyspace, cc.ReplicationFactor, cassandra.SchemaVersion(), cc.Hosts)
	default:
		_, err = fmt.Fprintf(out, "parley: upgraded keyspace %q to schema %d on %v\n", cc.Keyspace, cassandra.SchemaVersion(), cc.Hosts)
	}
	return err
}
