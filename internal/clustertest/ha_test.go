package clustertest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	natsio "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	goredis "github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/internal/server"
)

// The failover tests kill one node of a replicated engine mid-storm and
// report the time from the fault to the first acknowledgement after it,
// then check what every storm test checks: each acknowledged message
// stored once at its seq, seqs dense, the clients' streams complete.

// redisHA is a private Redis primary, replica and three Sentinels run by
// scripts/engines/redis-ha.sh in a directory and on ports of the test's own.
type redisHA struct {
	t         *testing.T
	dir       string
	env       []string
	port      int // the first primary's
	sentinels []string
}

// freePorts returns a base port with n free ports from it.
func freePorts(t *testing.T, n int) int {
	t.Helper()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		base := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if base+n > 65535 {
			continue
		}
		ok := true
		for i := 1; i < n && ok; i++ {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+i))
			if err != nil {
				ok = false
				continue
			}
			l.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
	return 0
}

func startRedisHA(t *testing.T) *redisHA {
	t.Helper()
	if _, err := exec.LookPath("redis-sentinel"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires redis-sentinel (Debian redis-sentinel) for the Redis failover test")
		}
		t.Skip("redis-sentinel not on PATH (apt-get install redis-sentinel)")
	}
	h := &redisHA{t: t, dir: t.TempDir(), port: freePorts(t, 2)}
	sport := freePorts(t, 3)
	h.env = append(os.Environ(), "PARLEY_ENGINES_DIR="+h.dir,
		"PARLEY_REDIS_HA_PORT="+strconv.Itoa(h.port), "PARLEY_REDIS_SENTINEL_PORT="+strconv.Itoa(sport))
	for i := range 3 {
		h.sentinels = append(h.sentinels, "127.0.0.1:"+strconv.Itoa(sport+i))
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range []string{"r0/redis.log", "r1/redis.log", "s0/sentinel.log"} {
				b, _ := os.ReadFile(filepath.Join(h.dir, "redis-ha", f))
				t.Logf("--- %s ---\n%s", f, tail(string(b), 1500))
			}
		}
		_ = h.script("stop")
	})
	if err := h.script("start"); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *redisHA) script(action string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "../../scripts/engines/redis-ha.sh", action)
	cmd.Env = h.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("redis-ha.sh %s: %v\n%s", action, err, out)
	}
	return nil
}

// primary returns the address the Sentinels name as the primary.
func (h *redisHA) primary() string {
	for _, s := range h.sentinels {
		sc := goredis.NewSentinelClient(&goredis.Options{Addr: s, DialTimeout: 200 * time.Millisecond})
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		a, err := sc.GetMasterAddrByName(ctx, "parley").Result()
		cancel()
		sc.Close()
		if err == nil && len(a) == 2 {
			return a[0] + ":" + a[1]
		}
	}
	return ""
}

// killPrimary kills the current primary with SIGKILL and returns its address.
func (h *redisHA) killPrimary() string {
	h.t.Helper()
	addr := h.primary()
	_, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	n := p - h.port
	if n != 0 && n != 1 {
		h.t.Fatalf("the Sentinels name %q as the primary", addr)
	}
	b, err := os.ReadFile(filepath.Join(h.dir, "redis-ha", "r"+strconv.Itoa(n), "redis.pid"))
	if err != nil {
		h.t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		h.t.Fatal(err)
	}
	return addr
}

// TestRedisFailoverMidStorm: the cluster's Redis is a primary with a
// replica behind three Sentinels (cluster.redis_sentinels); the primary is
// killed with SIGKILL during a send storm. The Sentinels promote the
// replica, every process's Redis client follows it, and: sends go on (the
// partition leases are in JetStream, not Redis), the SDK clients keep
// their connections and get their pushes, every acknowledged message is
// stored once at its seq.
func TestRedisFailoverMidStorm(t *testing.T) {
	ha := startRedisHA(t)
	c := Start(t, Options{Gateways: 2, Chats: 2, Redis: "parley",
		Extra: []string{"--cluster.redis-sentinels", strings.Join(ha.sentinels, ",")}})
	s := startRawStorm(t, c, 6)
	time.Sleep(2 * time.Second)
	before := make([]int, len(s.watchers))
	for i, w := range s.watchers {
		before[i] = len(w.connections())
	}
	killed := time.Now()
	old := ha.killPrimary()
	var promoted time.Duration
	for deadline := time.Now().Add(30 * time.Second); ; {
		if p := ha.primary(); p != "" && p != old {
			promoted = time.Since(killed)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Sentinels promoted no replica within 30s of killing the primary %s", old)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// After the promotion, a message of the group acknowledged then must
	// reach every client over the connection it had.
	time.Sleep(500 * time.Millisecond)
	s.awaitPushes(time.Now().Add(25*time.Second), "the Redis failover")
	pushed := time.Since(killed)
	first, gap := s.got.afterFault(killed, killed.Add(pushed))
	if first.IsZero() {
		t.Fatal("no message acknowledged after the primary was killed")
	}
	t.Logf("Redis primary %s killed: replica promoted after %v; first ACK %v after the kill, longest pause between ACKs %v; pushes at every client after %v",
		old, promoted.Round(10*time.Millisecond), first.Sub(killed).Round(time.Millisecond), gap.Round(time.Millisecond), pushed.Round(100*time.Millisecond))
	for i, w := range s.watchers {
		if n := len(w.connections()); n != before[i] {
			t.Errorf("SDK client of %s connected %d more times across the failover (%v)", w.user, n-before[i], w.connections())
		}
	}
	time.Sleep(time.Second)
	s.finish()
}

// startNATSCluster runs a 3-node NATS cluster with JetStream on loopback
// (file storage in the test's directory) and returns its nodes once
// JetStream has a meta leader.
func startNATSCluster(t *testing.T) []*engineProc {
	t.Helper()
	startPrivateNATS(t).kill() // builds natsserver once
	cport := freePorts(t, 3)
	var routes []string
	for i := range 3 {
		routes = append(routes, "nats://127.0.0.1:"+strconv.Itoa(cport+i))
	}
	nodes := make([]*engineProc, 3)
	for i := range nodes {
		addr := freeAddr(t)
		_, port, _ := net.SplitHostPort(addr)
		dir := t.TempDir()
		nodes[i] = &engineProc{
			t: t, name: "nats n" + strconv.Itoa(i), addr: addr, logf: filepath.Join(dir, "nats.log"),
			argv: []string{natsBin, "-js", "-n", "n" + strconv.Itoa(i), "--cluster_name", "parley",
				"-a", "127.0.0.1", "-p", port, "--cluster", routes[i], "--routes", strings.Join(routes, ","),
				"-sd", filepath.Join(dir, "store"), "-l", filepath.Join(dir, "nats.log")},
			// A node alone has no JetStream quorum: readiness is the
			// cluster's, checked below.
			ready: func(addr string) bool {
				c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
				if err == nil {
					c.Close()
				}
				return err == nil
			},
		}
		nodes[i].start()
		t.Cleanup(nodes[i].cleanup)
	}
	nc, err := natsio.Connect(natsURLs(nodes))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	for deadline := time.Now().Add(60 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		info, err := js.AccountInfo(ctx)
		cancel()
		if err == nil && info != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the NATS cluster had no JetStream meta leader within 60s: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nodes
}

func natsURLs(nodes []*engineProc) string {
	var urls []string
	for _, n := range nodes {
		urls = append(urls, n.URL())
	}
	return strings.Join(urls, ",")
}

// TestNATSNodeFailoverMidStorm: NATS is a 3-node JetStream cluster, the
// partition lease bucket and the task streams at R3
// (cluster.jetstream_replicas 3). The node leading the lease bucket's
// stream is killed with SIGKILL during a send storm: the two left elect a
// new leader, the processes' connections move to them, the leases are
// renewed or taken again at higher epochs, and every acknowledged message
// is stored once at its seq.
func TestNATSNodeFailoverMidStorm(t *testing.T) {
	nodes := startNATSCluster(t)
	c := Start(t, Options{Gateways: 2, Chats: 2, NATS: natsURLs(nodes),
		Extra: []string{"--cluster.jetstream-replicas", "3"}})
	s := startRawStorm(t, c, 6)
	time.Sleep(2 * time.Second)
	nc, err := natsio.Connect(natsURLs(nodes))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	stream := "KV_" + server.LeaseBucket(c.keyspace)
	leader := func() string {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		st, err := js.Stream(ctx, stream)
		if err != nil {
			return ""
		}
		info, err := st.Info(ctx)
		if err != nil || info.Cluster == nil {
			return ""
		}
		if len(info.Cluster.Replicas) != 2 {
			t.Errorf("the lease bucket's stream has %d replicas besides its leader, want 2 (R3)", len(info.Cluster.Replicas))
		}
		return info.Cluster.Leader
	}
	was := leader()
	var victim *engineProc
	for i, n := range nodes {
		if "n"+strconv.Itoa(i) == was {
			victim = n
		}
	}
	if victim == nil {
		t.Fatalf("the lease bucket's stream %s has leader %q, not a node of the cluster", stream, was)
	}
	killed := time.Now()
	victim.kill()
	var elected time.Duration
	for deadline := time.Now().Add(30 * time.Second); ; {
		if l := leader(); l != "" && l != was {
			elected = time.Since(killed)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new leader of the lease bucket within 30s of killing %s", was)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Sends resume: a message of the group acknowledged after the election
	// reaches every client.
	deadline := time.Now().Add(30 * time.Second)
	for s.got.firstAfter(s.cs.group, killed.Add(elected)).IsZero() {
		if time.Now().After(deadline) {
			t.Fatalf("no message of the group acknowledged within 30s of the new leader's election (%v after the kill)", elected)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	s.awaitPushes(deadline, "the NATS failover")
	first, gap := s.got.afterFault(killed, time.Now())
	t.Logf("NATS node %s (leader of the lease bucket) killed: new leader after %v; first ACK %v after the kill, longest pause between ACKs %v",
		was, elected.Round(10*time.Millisecond), first.Sub(killed).Round(time.Millisecond), gap.Round(time.Millisecond))
	time.Sleep(time.Second)
	s.finish()
}

// awaitPushes waits until every SDK client of the storm has the group up
// to the highest seq acknowledged now, over the connection it has, and
// fails at deadline: pushes did not resume after fault.
func (s *rawStorm) awaitPushes(deadline time.Time, fault string) {
	s.t.Helper()
	target := s.got.maxSeq(s.cs.group)
	for _, w := range s.watchers {
		for w.lastSeq(s.cs.group) < target {
			if time.Now().After(deadline) {
				s.t.Fatalf("SDK client of %s has the group up to seq %d, not %d acknowledged after %s: pushes did not resume",
					w.user, w.lastSeq(s.cs.group), target, fault)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// cassandraRing is a private 3-node Cassandra ring run by
// scripts/engines/cassandra-ring.sh in a directory and on ports of the
// test's own.
type cassandraRing struct {
	t     *testing.T
	dir   string
	env   []string
	hosts []string // native addresses, node i on 127.0.0.(i+1)
}

func startCassandraRing(t *testing.T) *cassandraRing {
	t.Helper()
	engines(t) // the ring reuses the jars the shared node's script installed
	r := &cassandraRing{t: t, dir: t.TempDir()}
	port := freePorts(t, 2) // native, internode the next
	storage := port + 1
	r.env = append(os.Environ(), "PARLEY_ENGINES_DIR="+r.dir,
		"PARLEY_CASSANDRA_RING_PORT="+strconv.Itoa(port), "PARLEY_CASSANDRA_RING_STORAGE_PORT="+strconv.Itoa(storage))
	for i := range 3 {
		r.hosts = append(r.hosts, fmt.Sprintf("127.0.0.%d:%d", i+1, port))
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i := range 3 {
				b, _ := os.ReadFile(filepath.Join(r.nodeDir(i), "logs", "system.log"))
				t.Logf("--- node %d system.log ---\n%s", i, tail(string(b), 2000))
			}
		}
		// The ring's data goes with the test's directory: no need for
		// the script's graceful stop (about 10 s a node).
		for i := range 3 {
			r.kill(i)
		}
	})
	// About 2 minutes on an idle 2-core machine, 6 under a load of 30.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, "../../scripts/engines/cassandra-ring.sh", "start")
	cmd.Env = r.env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cassandra-ring.sh start: %v\n%s", err, out)
	}
	t.Logf("Cassandra ring %s ready in %v", strings.Join(r.hosts, ","), time.Since(start).Round(time.Second))
	return r
}

func (r *cassandraRing) nodeDir(i int) string {
	return filepath.Join(r.dir, "cassandra-ring", "n"+strconv.Itoa(i))
}

// killPidFile ends the process whose pid the file holds with SIGKILL and
// waits until it is gone (nothing if the file is missing).
func killPidFile(path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid > 0 && syscall.Kill(pid, syscall.SIGKILL) == nil {
		for alive(pid) {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// kill kills node i with SIGKILL (nothing if it is not running).
func (r *cassandraRing) kill(i int) {
	killPidFile(filepath.Join(r.nodeDir(i), "cassandra.pid"))
}

// cassandraNodeLossBound is how soon after one node of three dies every
// conversation must take sends again: the driver drops the dead node's
// connections at once and the statements in flight on them are retried
// by the clients, so this is the request timeouts' order
// (docs/deploy.md, "What a Cassandra outage does").
const cassandraNodeLossBound = 10 * time.Second

// TestCassandraNodeFailoverMidStorm: Cassandra is a 3-node ring, the
// keyspace at replication factor 3 (cluster.replication_factor), reads and
// writes at QUORUM and transactions at SERIAL (the defaults), the driver
// given all three nodes. The first contact point (also the ring's seed) is
// killed with SIGKILL during a send storm: every statement still has two
// replicas, so every conversation takes sends again within
// cassandraNodeLossBound, pushes go on, and every acknowledged message is
// stored once at its seq.
func TestCassandraNodeFailoverMidStorm(t *testing.T) {
	ring := startCassandraRing(t)
	c := Start(t, Options{Gateways: 2, Chats: 2, Cassandra: strings.Join(ring.hosts, ","),
		Extra: []string{"--cluster.replication-factor", "3"}, MigrateTimeout: 10 * time.Minute})
	s := startRawStorm(t, c, 6)
	time.Sleep(2 * time.Second)
	killed := time.Now()
	ring.kill(0)
	deadline := killed.Add(cassandraNodeLossBound)
	convs := map[uint64]bool{}
	for _, cs := range s.cs.convsOf {
		for _, conv := range cs {
			convs[conv] = true
		}
	}
	var resumed time.Duration
	for conv := range convs {
		for {
			if at := s.got.firstAfter(conv, killed); !at.IsZero() {
				resumed = max(resumed, at.Sub(killed))
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("conversation %d: no send acknowledged within %v of killing Cassandra node %s",
					conv, cassandraNodeLossBound, ring.hosts[0])
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	time.Sleep(500 * time.Millisecond)
	s.awaitPushes(time.Now().Add(20*time.Second), "the Cassandra node's loss")
	first, gap := s.got.afterFault(killed, time.Now())
	t.Logf("Cassandra node %s killed (RF 3, QUORUM/SERIAL): first ACK %v after the kill, every one of %d conversations acknowledged a send within %v, longest pause between ACKs %v",
		ring.hosts[0], first.Sub(killed).Round(time.Millisecond), len(convs), resumed.Round(time.Millisecond), gap.Round(time.Millisecond))
	time.Sleep(time.Second)
	s.finish()
}
