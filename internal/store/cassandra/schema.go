package cassandra

import (
	"context"
	"errors"
	"fmt"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
)

// migration is one schema step. Its statements are idempotent (IF NOT
// EXISTS), so a step cut short by a crash is simply run again.
type migration struct {
	version int
	desc    string
	stmts   []string
}

// migrations are applied in order; append, never edit a released one.
var migrations = []migration{
	{1, "messages, seq index, conversations, members, rows, positions, idempotency", []string{
		`CREATE TABLE IF NOT EXISTS messages (
			conv_id bigint, bucket int, message_id bigint,
			sender text, sender_device text, client_msg_id text, kind text, body text,
			target_seq bigint, server_time bigint,
			mentions list<text>, mention_all boolean, coalesce_key text,
			rev int, edit blob,
			PRIMARY KEY ((conv_id, bucket), message_id)
		) WITH CLUSTERING ORDER BY (message_id DESC)`,
		`CREATE TABLE IF NOT EXISTS message_seq (
			conv_id bigint, seq_block bigint, seq bigint,
			message_id bigint, bucket int,
			PRIMARY KEY ((conv_id, seq_block), seq)
		) WITH CLUSTERING ORDER BY (seq ASC)`,
		`CREATE TABLE IF NOT EXISTS coalesce_latest (
			conv_id bigint, key text, seq bigint,
			PRIMARY KEY (conv_id, key)
		)`,
		`CREATE TABLE IF NOT EXISTS conversations (
			conv_id bigint PRIMARY KEY,
			kind tinyint, name text, created_at bigint, members int, direct_pair text, tier tinyint,
			last_seq bigint
		)`,
		`CREATE TABLE IF NOT EXISTS members (
			conv_id bigint, user_id text,
			role tinyint, join_seq bigint, leave_seq bigint, muted boolean,
			PRIMARY KEY (conv_id, user_id)
		)`,
		`CREATE TABLE IF NOT EXISTS user_conversations (
			user_id text, conv_id bigint,
			kind tinyint, join_seq bigint, leave_seq bigint, last_seq bigint, mention_seq bigint,
			PRIMARY KEY (user_id, conv_id)
		)`,
		`CREATE TABLE IF NOT EXISTS direct_pairs (
			user_lo text, user_hi text, conv_id bigint,
			PRIMARY KEY ((user_lo, user_hi))
		)`,
		`CREATE TABLE IF NOT EXISTS idempotency (
			conv_id bigint, sender text, client_msg_id text,
			message_id bigint, bucket int, start_seq bigint,
			PRIMARY KEY ((conv_id, sender, client_msg_id))
		)`,
		`CREATE TABLE IF NOT EXISTS read_positions (
			user_id text, conv_id bigint, device text, seq bigint,
			PRIMARY KEY (user_id, conv_id, device)
		)`,
		`CREATE TABLE IF NOT EXISTS delivered_positions (
			user_id text, conv_id bigint, seq bigint,
			PRIMARY KEY (user_id, conv_id)
		)`,
	}},
	{2, "e2e: key directory, end-to-end conversations", []string{
		`CREATE TABLE IF NOT EXISTS e2e_devices (
			user_id text, device_id text,
			reg_id bigint, identity_key blob,
			spk_id bigint, spk blob, spk_sig blob,
			lr_id bigint, lr_key blob, lr_sig blob,
			updated_at bigint,
			PRIMARY KEY (user_id, device_id)
		)`,
		`CREATE TABLE IF NOT EXISTS e2e_prekeys (
			user_id text, device_id text, kind tinyint, key_id bigint,
			pub blob, sig blob,
			PRIMARY KEY ((user_id, device_id), kind, key_id)
		)`,
		`ALTER TABLE conversations ADD IF NOT EXISTS e2e boolean`,
	}},
	{3, "fan-out outbox, @everyone on the conversation", []string{
		`ALTER TABLE conversations ADD IF NOT EXISTS everyone_seq bigint`,
		`CREATE TABLE IF NOT EXISTS fanout_pending (
			shard int, conv_id bigint, seq bigint,
			PRIMARY KEY (shard, conv_id, seq)
		)`,
	}},
	{4, "message edits: a former member reads a body as of its leave_seq", []string{
		`CREATE TABLE IF NOT EXISTS message_edits (
			conv_id bigint, target_seq bigint, edit_seq bigint,
			body text, edited boolean,
			PRIMARY KEY ((conv_id, target_seq), edit_seq)
		) WITH CLUSTERING ORDER BY (edit_seq DESC)`,
	}},
	{5, "owned appends: the seq of an idempotency record", []string{
		`ALTER TABLE idempotency ADD IF NOT EXISTS seq bigint`,
	}},
	{6, "owned membership changes: the members partition's fencing epoch", []string{
		`ALTER TABLE members ADD IF NOT EXISTS fence bigint static`,
	}},
	// A resurrected outbox entry or index row (a replica that missed its
	// delete for longer than gc_grace_seconds) only fans a message out
	// again, which is idempotent, or has an empty bucket scanned once
	// more: the tables keep tombstones briefly. fanout_pending's shorter
	// grace lets compaction purge the tombstones that made it fail.
	{7, "fan-out outbox in time buckets with an index of live buckets", []string{
		`CREATE TABLE IF NOT EXISTS fanout_outbox (
			shard int, bucket bigint, conv_id bigint, seq bigint,
			PRIMARY KEY ((shard, bucket), conv_id, seq)
		) WITH gc_grace_seconds = 600`,
		`CREATE TABLE IF NOT EXISTS fanout_buckets (
			shard int, bucket bigint,
			PRIMARY KEY (shard, bucket)
		) WITH gc_grace_seconds = 600`,
		`ALTER TABLE fanout_pending WITH gc_grace_seconds = 600`,
	}},
	{8, "key transparency: the log's leaves in buckets of 1000, its keys", []string{
		`CREATE TABLE IF NOT EXISTS kt_leaves (
			bucket bigint, idx bigint, leaf blob,
			PRIMARY KEY (bucket, idx)
		)`,
		`CREATE TABLE IF NOT EXISTS kt_keys (
			id int PRIMARY KEY, keyset blob
		)`,
	}},
	{9, "e2e: a device's account key and device certificate", []string{
		`ALTER TABLE e2e_devices ADD IF NOT EXISTS account_key blob`,
		`ALTER TABLE e2e_devices ADD IF NOT EXISTS device_sig blob`,
	}},
	// Attachment records with their owner's usage in static columns (one
	// partition per owner: a record and the usage change in one
	// conditional batch), the id → owner lookup, a conversation's
	// listing, and the due listing in (shard, hour) partitions with an
	// index of its live buckets (attach.go).
	{10, "attachments: records and usage, listings by conversation and by due time, a message's attachment", []string{
		`CREATE TABLE IF NOT EXISTS attachments (
			owner text, id bigint,
			device text, conv_id bigint, size bigint, sha256 blob, media_type text, name text,
			state tinyint, created_at bigint, expires_at bigint,
			blob_upload text, part_size bigint, received int, hash_state blob,
			width int, height int, thumb tinyint, ref_client_msg_id text, ref_seq bigint,
			due bigint,
			bytes bigint static, inflight int static, rev bigint static,
			PRIMARY KEY (owner, id)
		)`,
		`CREATE TABLE IF NOT EXISTS attachment_ids (
			id bigint PRIMARY KEY, owner text
		)`,
		`CREATE TABLE IF NOT EXISTS attachments_by_conv (
			conv_id bigint, id bigint, owner text,
			PRIMARY KEY (conv_id, id)
		)`,
		`CREATE TABLE IF NOT EXISTS attachments_due (
			shard int, bucket bigint, due bigint, id bigint, owner text,
			PRIMARY KEY ((shard, bucket), due, id)
		) WITH gc_grace_seconds = 3600`,
		`CREATE TABLE IF NOT EXISTS attachments_due_buckets (
			shard int, bucket bigint,
			PRIMARY KEY (shard, bucket)
		) WITH gc_grace_seconds = 3600`,
		`ALTER TABLE messages ADD IF NOT EXISTS attachment bigint`,
	}},
	// Push registrations by user and device, and the device each token
	// names (push.go).
	{11, "push: the devices' push registrations and the device each token names", []string{
		`CREATE TABLE IF NOT EXISTS push_regs (
			user_id text, device_id text, provider text, push_token text,
			topic text, sandbox boolean, p256dh blob, auth blob, updated_at bigint,
			PRIMARY KEY (user_id, device_id, provider, push_token)
		)`,
		`CREATE TABLE IF NOT EXISTS push_tokens (
			provider text, push_token text, user_id text, device_id text, updated_at bigint,
			PRIMARY KEY ((provider, push_token))
		)`,
	}},
	// The seq of the message a reply answers (unset: none).
	{12, "messages: the message a reply answers", []string{
		`ALTER TABLE messages ADD IF NOT EXISTS reply_to bigint`,
	}},
	// Notification preferences: a user's conversation mutes, one
	// partition per user, and do-not-disturb (notify.go).
	{13, "notify: conversation mutes and do-not-disturb", []string{
		`CREATE TABLE IF NOT EXISTS conv_mutes (
			user_id text, conv_id bigint, mute_until bigint,
			PRIMARY KEY (user_id, conv_id)
		)`,
		`CREATE TABLE IF NOT EXISTS dnd (
			user_id text PRIMARY KEY, dnd_until bigint, daily boolean,
			start_min int, end_min int, utc_offset int
		)`,
	}},
	// Reactions: each user's emojis on a message, one partition per
	// (conversation, user), ordered by the message's seq (react.go); the
	// counts are in the message's edit image.
	{14, "reactions: each user's reactions to messages", []string{
		`CREATE TABLE IF NOT EXISTS reactions (
			conv_id bigint, user_id text, seq bigint, emojis list<text>,
			PRIMARY KEY ((conv_id, user_id), seq)
		)`,
	}},
}

var latestVersion = migrations[len(migrations)-1].version

// lockVersion is the schema_migrations row that serves as the migration
// lock; real versions start at 1.
const (
	ddlTimeout  = time.Minute
	lockVersion = 0
	lockTTL     = 120 // seconds; frees the lock of a crashed migrate
)

// Migrate creates the keyspace of cfg (SimpleStrategy, ReplicationFactor)
// if it does not exist and applies the schema migrations it lacks. It is
// safe to run again and from several processes: a lock row taken with a
// transaction lets one of them apply the steps at a time. Its requests
// wait at least a minute for an answer (cfg.Timeout if longer): schema
// changes are slow on a busy node.
func Migrate(ctx context.Context, cfg Config) error {
	_, err := MigrateReport(ctx, cfg)
	return err
}

// Applied is one migration a MigrateReport applied.
type Applied struct {
	Version     int
	Description string
}

// MigrateReport is Migrate, and says which migrations it applied (none:
// the keyspace was up to date), so `parley migrate` can tell a new
// keyspace from an upgraded or an unchanged one.
func MigrateReport(ctx context.Context, cfg Config) ([]Applied, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	// A schema change waits for Cassandra to write its schema tables,
	// which on a busy node takes far longer than a query: the request
	// timeout of a migration is at least ddlTimeout.
	cfg.Timeout = max(cfg.Timeout, ddlTimeout)
	cluster, err := newCluster(cfg, "")
	if err != nil {
		return nil, err
	}
	sess, err := cluster.CreateSession()
	if err != nil {
		return nil, fmt.Errorf("cassandra: migrate: connect: %w", err)
	}
	defer sess.Close()
	applied, err := migrate(ctx, sess, cfg)
	if err != nil {
		return applied, fmt.Errorf("cassandra: migrate %s: %w", cfg.Keyspace, err)
	}
	return applied, nil
}

// SchemaVersion is the highest migration this build knows: what a keyspace
// Migrate brought up to date holds.
func SchemaVersion() int { return migrations[len(migrations)-1].version }

func migrate(ctx context.Context, sess *gocql.Session, cfg Config) (applied []Applied, _ error) {
	ks := cfg.Keyspace // validated: a plain identifier, safe to splice
	ddl := []string{
		fmt.Sprintf(`CREATE KEYSPACE IF NOT EXISTS %s WITH replication = {'class': 'SimpleStrategy', 'replication_factor': %d}`,
			ks, cfg.ReplicationFactor),
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.schema_migrations (
			version int PRIMARY KEY, description text, applied_at timestamp, owner text)`, ks),
	}
	for _, stmt := range ddl {
		if err := execDDL(ctx, sess, stmt); err != nil {
			return nil, err
		}
	}
	owner := gocql.TimeUUID().String()
	if err := lockMigrations(ctx, sess, ks, owner); err != nil {
		return nil, err
	}
	defer func() {
		// Best effort: the TTL frees the lock if this fails.
		unlockCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		cur := map[string]any{}
		_, err := sess.Query(fmt.Sprintf(`DELETE FROM %s.schema_migrations WHERE version = ? IF owner = ?`, ks),
			lockVersion, owner).WithContext(unlockCtx).MapScanCAS(cur)
		if err != nil {
			cfg.Logger.Warn("cassandra: migrate: releasing the lock failed", logKeyErr, err)
		}
	}()
	done, err := appliedVersions(ctx, sess, ks)
	if err != nil {
		return nil, err
	}
	for _, m := range migrations {
		if done[m.version] {
			continue
		}
		for _, stmt := range m.stmts {
			if err := execDDL(ctx, sess, qualify(ks, stmt)); err != nil {
				return applied, fmt.Errorf("migration %d: %w", m.version, err)
			}
		}
		err := sess.Query(fmt.Sprintf(`INSERT INTO %s.schema_migrations (version, description, applied_at) VALUES (?, ?, ?)`, ks),
			m.version, m.desc, time.Now()).WithContext(ctx).Exec()
		if err != nil {
			return applied, fmt.Errorf("migration %d: record: %w", m.version, err)
		}
		applied = append(applied, Applied{Version: m.version, Description: m.desc})
		cfg.Logger.Info("cassandra: migrated", "version", m.version, "keyspace", ks)
	}
	return applied, nil
}

// qualify prefixes the table of a CREATE TABLE IF NOT EXISTS statement with
// the keyspace, so migrations need no session bound to it.
func qualify(ks, stmt string) string {
	for _, prefix := range []string{"CREATE TABLE IF NOT EXISTS ", "ALTER TABLE "} {
		if len(stmt) > len(prefix) && stmt[:len(prefix)] == prefix {
			return prefix + ks + "." + stmt[len(prefix):]
		}
	}
	return stmt
}

// execDDL runs a schema change and waits until every node agrees on the
// schema, so the next statement sees it.
func execDDL(ctx context.Context, sess *gocql.Session, stmt string) error {
	if err := sess.Query(stmt).WithContext(ctx).Exec(); err != nil {
		return err
	}
	return sess.AwaitSchemaAgreement(ctx)
}

// lockMigrations takes the lock row, waiting while another migrate holds it.
func lockMigrations(ctx context.Context, sess *gocql.Session, ks, owner string) error {
	stmt := fmt.Sprintf(`INSERT INTO %s.schema_migrations (version, description, owner) VALUES (?, 'lock', ?) IF NOT EXISTS USING TTL %d`,
		ks, lockTTL)
	for {
		cur := map[string]any{}
		applied, err := sess.Query(stmt, lockVersion, owner).WithContext(ctx).MapScanCAS(cur)
		if err != nil {
			return fmt.Errorf("lock: %w", err)
		}
		if applied || cur["owner"] == owner {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("lock held by %v: %w", cur["owner"], ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func appliedVersions(ctx context.Context, sess *gocql.Session, ks string) (map[int]bool, error) {
	iter := sess.Query(fmt.Sprintf(`SELECT version FROM %s.schema_migrations`, ks)).WithContext(ctx).Iter()
	done := map[int]bool{}
	var v int
	for iter.Scan(&v) {
		if v != lockVersion {
			done[v] = true
		}
	}
	if err := iter.Close(); err != nil {
		return nil, fmt.Errorf("read versions: %w", err)
	}
	return done, nil
}

// schemaVersion returns the highest applied migration of the session's
// keyspace, 0 if none.
func schemaVersion(ctx context.Context, sess *gocql.Session) (int, error) {
	iter := sess.Query(`SELECT version FROM schema_migrations`).WithContext(ctx).Iter()
	top, v := 0, 0
	for iter.Scan(&v) {
		top = max(top, v)
	}
	if err := iter.Close(); err != nil {
		var reqErr gocql.RequestError
		if errors.As(err, &reqErr) && reqErr.Code() == gocql.ErrCodeInvalid {
			return 0, nil // no schema_migrations table: never migrated
		}
		return 0, fmt.Errorf("schema version: %w", err)
	}
	return top, nil
}
