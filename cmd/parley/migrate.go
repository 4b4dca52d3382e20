package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/store/cassandra"
)

const migrateUsage = `parley migrate [--from DATA_DIR [--checkpoint FILE]] [--config FILE] [--<setting> VALUE ...]
  creates or upgrades the Cassandra schema; --from then copies a stopped embedded node into it, and its queues into JetStream, resumably (docs/deploy.md)`

// migrateSettings are the settings migrate reads (config.Cassandra).
var migrateSettings = []string{"cluster.cassandra_hosts", "cluster.keyspace", "cluster.nats", "cluster.namespace", "cluster.partitions", "cluster.jetstream_replicas", "cluster.replication_factor", "cluster.consistency", "cluster.serial_consistency", "store.bucket_width", "store.conversation_states", "store.conversation_idle",
	"attach.engine", "attach.s3.endpoint", "attach.s3.bucket", "attach.s3.region", "attach.s3.access_key", "attach.s3.secret_key", "attach.s3.secret_key_file", "attach.s3.secure"}

// migrateProgress is where `migrate --from` draws its progress bar.
var migrateProgress io.Writer = os.Stderr

// migrateFlags takes migrate's own flags (--from, --checkpoint) out of args.
func migrateFlags(args []string) (from, cp string, rest []string, err error) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || (name != "from" && name != "checkpoint") {
			rest = append(rest, a)
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				return "", "", nil, fmt.Errorf("migrate: --%s needs a value", name)
			}
			i++
			val = args[i]
		}
		if name == "from" {
			from = val
		} else {
			cp = val
		}
	}
	return from, cp, rest, nil
}

// runMigrate is `parley migrate`: it creates or upgrades the Cassandra
// keyspace and tables of cluster mode. It takes serve's configuration
// (flags, PARLEY_* variables, --config file), checks only the settings it
// uses (so Redis and NATS need not be configured), and is safe to run
// again.
func runMigrate(ctx context.Context, args []string, out io.Writer) error {
	from, cpPath, args, err := migrateFlags(args)
	if err != nil {
		return err
	}
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
	if err != nil || from == "" {
		return err
	}
	if cpPath == "" {
		cpPath = filepath.Join(from, "migrate.checkpoint")
	}
	if err := migrateFrom(ctx, from, cpPath, cfg, out); err != nil {
		return fmt.Errorf("migrate --from %s: %w", from, err)
	}
	return nil
}

// migrateFrom copies the embedded node of from into the cluster cfg names.
func migrateFrom(ctx context.Context, from, cpPath string, cfg config.Config, out io.Writer) error {
	cc := cfg.Cassandra()
	target := fmt.Sprintf("keyspace %s on %s, namespace %s", cc.Keyspace, strings.Join(cc.Hosts, ","), cfg.Cluster.Namespace)
	cp, err := loadCheckpoint(cpPath, target)
	if err != nil {
		return err
	}
	src, exp, err := openSource(ctx, from, cfg)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := cassandra.Open(ctx, cc)
	if err != nil {
		return err
	}
	defer dst.Close()
	sb, db, err := openMigrationBlobs(ctx, from, cfg)
	if err != nil {
		return err
	}
	if sb != nil {
		defer sb.Close()
		defer db.Close()
	}
	qs, err := openQueues(ctx, from, cfg)
	if err != nil {
		return err
	}
	defer qs.close()
	m := &migration{src: src, exp: exp, dst: dst, srcBlob: sb, dstBlob: db, cp: cp, cpPath: cpPath, bar: &progress{w: migrateProgress}, queues: qs}
	if err := m.run(ctx); err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "parley: copied %s (%d conversations, %d messages) into %s\n", from, m.bar.all, m.bar.total, target)
	if err == nil && qs != nil {
		_, err = fmt.Fprintf(out, "parley: copied %d webhook events, %d push events and %d compensation tasks (dead letters included) into JetStream at %s (namespace %s)\n",
			qs.hookN, qs.pushN, qs.ledN, cfg.Cluster.NATS, cfg.Cluster.Namespace)
	}
	return err
}
