package cassandra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/storetest"
)

// The tests run against the Cassandra at $PARLEY_TEST_CASSANDRA (host:port,
// as printed by scripts/engines/cassandra.sh start). Without it they skip,
// except under CI=true, where a missing engine fails the run.
//
// All tests of one run share one keyspace, created by Migrate on first use
// and dropped by TestMain; each test starts by truncating every table,
// which costs ~0.3 s where a fresh keyspace costs several seconds.

const envAddr = "PARLEY_TEST_CASSANDRA"

var suite struct {
	once     sync.Once
	keyspace string
	admin    *gocql.Session // bound to keyspace; truncates
	err      error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if suite.admin != nil {
		// Dropping is best effort: a leftover keyspace costs only disk.
		if err := suite.admin.Query(`DROP KEYSPACE IF EXISTS ` + suite.keyspace).Exec(); err != nil {
			fmt.Fprintf(os.Stderr, "cassandra test: drop keyspace %s: %v\n", suite.keyspace, err)
		}
		suite.admin.Close()
	}
	os.Exit(code)
}

// addr returns the engine's address or ends the test without one.
func addr(tb testing.TB) string {
	tb.Helper()
	a := os.Getenv(envAddr)
	if a == "" {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("CI requires Cassandra: set %s (scripts/engines/cassandra.sh start)", envAddr)
		}
		tb.Skipf("%s not set; run scripts/engines/cassandra.sh start", envAddr)
	}
	return a
}

// testConfig returns a Config for the shared test keyspace. SeqBlock 8
// and a one-hour BucketWidth make the suite cross seq blocks and time
// buckets.
func testConfig(tb testing.TB) Config {
	tb.Helper()
	a := addr(tb)
	suite.once.Do(func() {
		suite.keyspace = fmt.Sprintf("parley_test_%d", time.Now().UnixNano()%1_000_000_000)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if suite.err = Migrate(ctx, Config{Hosts: []string{a}, Keyspace: suite.keyspace}); suite.err != nil {
			return
		}
		cluster := gocql.NewCluster(a)
		cluster.Keyspace = suite.keyspace
		cluster.Timeout = 30 * time.Second
		suite.admin, suite.err = cluster.CreateSession()
	})
	if suite.err != nil {
		tb.Fatalf("test keyspace: %v", suite.err)
	}
	return Config{Hosts: []string{a}, Keyspace: suite.keyspace, SeqBlock: 8, BucketWidth: time.Hour}
}

// fresh empties the test keyspace (every table but schema_migrations, read
// from the schema so that a new table is never left out) and returns its
// Config.
func fresh(tb testing.TB) Config {
	tb.Helper()
	cfg := testConfig(tb)
	iter := suite.admin.Query(`SELECT table_name FROM system_schema.tables WHERE keyspace_name = ?`, suite.keyspace).Iter()
	var (
		tables []string
		tbl    string
	)
	for iter.Scan(&tbl) {
		if tbl != "schema_migrations" {
			tables = append(tables, tbl)
		}
	}
	if err := iter.Close(); err != nil || len(tables) == 0 {
		tb.Fatalf("tables of %s: %v (%d found)", suite.keyspace, err, len(tables))
	}
	for _, tbl := range tables {
		if err := suite.admin.Query(`TRUNCATE ` + tbl).Exec(); err != nil {
			tb.Fatalf("truncate %s: %v", tbl, err)
		}
	}
	return cfg
}

// openT opens the engine itself, without the seam's checks.
func openT(tb testing.TB, cfg Config) *Store {
	tb.Helper()
	s, err := open(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("open: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

// openSeam opens what Open returns: the engine behind the seam, as the
// conformance suite runs it.
func openSeam(tb testing.TB, cfg Config) store.Store {
	tb.Helper()
	s, err := Open(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("Open: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	var cfg Config
	storetest.Run(t, storetest.Harness{
		Open: func(t *testing.T) store.Store {
			cfg = fresh(t)
			return openSeam(t, cfg)
		},
		// A restart: a new session, and a new Store with no in-process
		// state, so everything comes back from the keyspace.
		Reopen: func(t *testing.T, old store.Store) store.Store {
			if err := old.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			return openSeam(t, cfg)
		},
		Evict: func(s store.Store) { store.Engine(s).(*Store).EvictIdle() },
	})
}

func TestConfigValidate(t *testing.T) {
	hosts := []string{"127.0.0.1"}
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{Hosts: hosts}, true},
		{"local quorum", Config{Hosts: hosts, Consistency: "LOCAL_QUORUM", SerialConsistency: "LOCAL_SERIAL"}, true},
		{"no hosts", Config{}, false},
		{"empty host", Config{Hosts: []string{" "}}, false},
		{"bad keyspace", Config{Hosts: hosts, Keyspace: "Parley-1"}, false},
		{"unknown consistency", Config{Hosts: hosts, Consistency: "MOST"}, false},
		{"serial for reads", Config{Hosts: hosts, Consistency: "SERIAL"}, false},
		{"quorum as serial", Config{Hosts: hosts, SerialConsistency: "QUORUM"}, false},
		{"replication 0 is the default", Config{Hosts: hosts, ReplicationFactor: 0}, true},
		{"negative replication", Config{Hosts: hosts, ReplicationFactor: -1}, false},
		{"bucket below 1ms", Config{Hosts: hosts, BucketWidth: time.Microsecond}, false},
		{"seq block 1", Config{Hosts: hosts, SeqBlock: 1}, false},
		{"negative timeout", Config{Hosts: hosts, Timeout: -time.Second}, false},
	}
	for _, tc := range tests {
		if err := tc.cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
	if _, err := Open(context.Background(), Config{}); err == nil {
		t.Error("Open with an invalid Config succeeded")
	}
	if err := Migrate(context.Background(), Config{}); err == nil {
		t.Error("Migrate with an invalid Config succeeded")
	}
}

// TestMigrate checks that Migrate is idempotent, also run concurrently,
// and that Open refuses a keyspace it has not migrated.
func TestMigrate(t *testing.T) {
	cfg := testConfig(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Go(func() { errs[i] = Migrate(ctx, cfg) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("Migrate of a migrated keyspace: %v", err)
	}
	other := cfg
	other.Keyspace = suite.keyspace + "_bare"
	t.Cleanup(func() { _ = suite.admin.Query(`DROP KEYSPACE IF EXISTS ` + other.Keyspace).Exec() })
	if err := suite.admin.Query(fmt.Sprintf(`CREATE KEYSPACE %s WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}`,
		other.Keyspace)).Exec(); err != nil {
		t.Fatalf("create bare keyspace: %v", err)
	}
	if s, err := Open(ctx, other); err == nil {
		s.Close()
		t.Fatal("Open of an unmigrated keyspace succeeded")
	}
}
