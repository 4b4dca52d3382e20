// Package enginetest gives tests the real engines they run against: a
// NATS server with JetStream embedded in the test process, and a client of
// the shared Redis at $PARLEY_TEST_REDIS with a key prefix of the test's
// own. Without $PARLEY_TEST_REDIS a Redis test skips, except under
// CI=true, where a missing engine fails it.
//
// Everything it starts or opens is stopped or closed by t.Cleanup; it keeps
// no state of its own.
package enginetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	goredis "github.com/redis/go-redis/v9"
)

// NATS starts a real NATS server with JetStream in this process on
// 127.0.0.1:port (0 for a free one), with its store in dir.
func NATS(t testing.TB, port int, dir string) *server.Server {
	t.Helper()
	if port == 0 {
		port = -1
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("embedded NATS server not ready within 10s")
	}
	t.Cleanup(s.Shutdown)
	return s
}

// RestartNATS stops s and starts it again on the same port and store.
func RestartNATS(t testing.TB, s *server.Server, dir string) *server.Server {
	t.Helper()
	port := s.Addr().(*net.TCPAddr).Port
	s.Shutdown()
	s.WaitForShutdown()
	return NATS(t, port, dir)
}

// Redis connects to the Redis at $PARLEY_TEST_REDIS (scripts/engines/up.sh)
// and checks that it answers.
func Redis(t testing.TB) *goredis.Client {
	t.Helper()
	addr := os.Getenv("PARLEY_TEST_REDIS")
	if addr == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires Redis: PARLEY_TEST_REDIS is unset (scripts/engines/up.sh start)")
		}
		t.Skip("PARLEY_TEST_REDIS is unset; run scripts/engines/up.sh start")
	}
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis at %s: %v", addr, err)
	}
	return c
}

// RedisPrefix returns a key prefix of the test's own and deletes its keys
// when the test ends, so tests share one Redis without seeing each other.
func RedisPrefix(t testing.TB, c *goredis.Client) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "parleytest:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
	})
	return prefix
}
