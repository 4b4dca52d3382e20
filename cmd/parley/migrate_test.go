package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/parley-im/parley/internal/store/cassandra"
)

// TestMigrateNeedsOnlyCassandra: `parley migrate` with only the Cassandra
// contact points set (no Redis, no NATS: what scripts/engines/up.sh
// prints) creates the keyspace; without them it says what is missing.
func TestMigrateNeedsOnlyCassandra(t *testing.T) {
	var out bytes.Buffer
	err := runMigrate(context.Background(), nil, &out)
	if err == nil || !strings.Contains(err.Error(), "cluster.cassandra_hosts: is not set") {
		t.Fatalf("migrate with no hosts: %v", err)
	}

	hosts := os.Getenv("PARLEY_TEST_CASSANDRA")
	if hosts == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires Cassandra: PARLEY_TEST_CASSANDRA is unset")
		}
		t.Skip("PARLEY_TEST_CASSANDRA is unset; run scripts/engines/cassandra.sh start")
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	ks := "tmig" + hex.EncodeToString(b)
	t.Cleanup(func() {
		cl := gocql.NewCluster(hosts)
		cl.Timeout = 60 * time.Second
		s, err := cl.CreateSession()
		if err != nil {
			t.Logf("drop keyspace %s: %v", ks, err)
			return
		}
		defer s.Close()
		if err := s.Query("DROP KEYSPACE IF EXISTS " + ks).Exec(); err != nil {
			t.Logf("drop keyspace %s: %v", ks, err)
		}
	})
	t.Setenv("PARLEY_CLUSTER_CASSANDRA_HOSTS", hosts)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := runMigrate(ctx, []string{"--cluster.keyspace", ks}, &out); err != nil {
		t.Fatal(err)
	}
	// A new keyspace: what was created, every migration by name.
	top := cassandra.SchemaVersion()
	if !strings.Contains(out.String(), `created keyspace "`+ks+`"`) || !strings.Contains(out.String(), fmt.Sprintf("with schema %d", top)) ||
		!strings.Contains(out.String(), "applied migration 1: messages") || !strings.Contains(out.String(), fmt.Sprintf("applied migration %d: ", top)) {
		t.Fatalf("first migrate printed %q", out.String())
	}
	// Again: nothing to do, said so.
	out.Reset()
	if err := runMigrate(ctx, []string{"--cluster.keyspace", ks}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `keyspace "`+ks+`" is up to date`) || strings.Contains(out.String(), "applied migration") {
		t.Fatalf("second migrate printed %q", out.String())
	}
}
