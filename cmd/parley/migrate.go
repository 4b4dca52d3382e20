package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/store/cassandra"
)

// runMigrate is `parley migrate`: it creates or upgrades the Cassandra
// keyspace and tables of cluster mode. It takes serve's configuration
// (flags, PARLEY_* variables, --config file) and is safe to run again.
func runMigrate(ctx context.Context, args []string, out io.Writer) error {
	cfg, err := loadConfig(config.NewFlagSet("parley migrate"), "parley migrate [--config FILE] [--<setting> VALUE ...]   (uses the cluster.* settings)", args)
	if err != nil {
		return err
	}
	if cfg.Cluster.CassandraHosts == "" {
		return errors.New("migrate: cluster.cassandra_hosts is not set: the embedded store needs no migration")
	}
	cc := cassandraConfig(cfg)
	if err := cassandra.Migrate(ctx, cc); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	_, err = fmt.Fprintf(out, "parley: keyspace %q is up to date on %v\n", cc.Keyspace, cc.Hosts)
	return err
}
