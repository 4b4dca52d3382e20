package clustertest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/internal/testbin"
)

// binary is parley; benchBinary is parley-bench, whose storm-client
// processes the reconnect storm runs.
var binary, benchBinary string

func TestMain(m *testing.M) {
	testbin.Main(m, &binary, testbin.Command{Name: "parley-bench", Path: &benchBinary})
}

// engines returns the engines' addresses or skips (fails under CI).
func engines(t *testing.T) (redis, nats, cassandra string) {
	t.Helper()
	redis, nats, cassandra = os.Getenv("PARLEY_TEST_REDIS"), os.Getenv("PARLEY_TEST_NATS"), os.Getenv("PARLEY_TEST_CASSANDRA")
	if redis == "" || nats == "" || cassandra == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires PARLEY_TEST_REDIS, PARLEY_TEST_NATS and PARLEY_TEST_CASSANDRA (scripts/engines/up.sh)")
		}
		t.Skip("cluster engines not configured; run scripts/engines/up.sh and source its env")
	}
	return redis, nats, cassandra
}

// Cluster is a set of parley processes sharing one keyspace.
type Cluster struct {
	t        *testing.T
	dir      string
	key      []byte
	common   []string
	env      []string // more environment of every process
	mu       sync.Mutex
	procs    map[string]*Proc
	cass     string // Cassandra contact points, comma-separated
	ownCass  bool   // cass is the test's own, thrown away after it
	redis    string
	nats     string
	keyspace string // also the NATS and Redis namespace
	Gateways []*Proc
	Chats    []*Proc
}

// Proc is one parley process.
type Proc struct {
	Name string
	Addr string
	args []string
	cmd  *exec.Cmd
	log  *os.File
}

// URL is the process's WebSocket base URL.
func (p *Proc) URL() string { return "ws://" + p.Addr }

// Options shape a test cluster.
type Options struct {
	Gateways, Chats int
	Redis, NATS     string   // override the shared engines (restart tests)
	Cassandra       string   // contact points overriding the shared node (a test's own ring)
	Extra           []string // more flags for every process
	Env             []string // more environment of every process (KEY=value)
	// MigrateTimeout bounds `parley migrate` (default 2 minutes; a ring
	// agrees on each schema change across its nodes, which takes longer).
	MigrateTimeout time.Duration
}

// Start migrates a fresh keyspace and starts the processes.
func Start(t *testing.T, o Options) *Cluster {
	t.Helper()
	redis, nats, cass := engines(t)
	if o.Redis != "" {
		redis = o.Redis
	}
	if o.NATS != "" {
		nats = o.NATS
	}
	if o.Cassandra != "" {
		cass = o.Cassandra
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	ks := "t" + strings.ToLower(hex.EncodeToString(key[:6]))
	c := &Cluster{t: t, dir: t.TempDir(), key: key, env: o.Env, procs: make(map[string]*Proc), cass: cass, ownCass: o.Cassandra != "", redis: redis, nats: nats, keyspace: ks}
	c.common = append([]string{
		"--cluster.redis", redis, "--cluster.nats", nats, "--cluster.cassandra-hosts", cass,
		"--cluster.keyspace", ks, "--cluster.namespace", ks, "--auth.hs256-key", hex.EncodeToString(key), "--log.level", "warn",
		// Storms and floods drive single users hard; the limits have their
		// own tests (internal/e2e).
		"--gateway.user-send-rate", "1e9", "--gateway.user-send-burst", "1000000000",
		"--gateway.conn-request-rate", "1e9", "--gateway.conn-request-burst", "1000000000",
		"--gateway.max-sessions-per-user", "1000000", "--gateway.max-poll-sessions-per-user", "1000000",
		"--gateway.user-handshake-rate", "1e9", "--gateway.user-handshake-burst", "1000000000",
		"--gateway.source-accept-rate", "0",
		// Attachments need an S3 server in cluster mode; the tests that
		// upload configure one in Extra.
		"--attach.max-file-bytes", "0",
	}, o.Extra...)
	if o.MigrateTimeout == 0 {
		o.MigrateTimeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.MigrateTimeout)
	defer cancel()
	migrated := time.Now()
	out, err := exec.CommandContext(ctx, binary, append([]string{"migrate"}, c.common...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("migrate (%v): %v\n%s", time.Since(migrated).Round(time.Second), err, out)
	}
	t.Cleanup(c.stopAll)
	for i := 1; i <= o.Chats; i++ {
		c.Chats = append(c.Chats, c.start(fmt.Sprintf("c%d-%s", i, ks), "chat"))
	}
	for i := 1; i <= o.Gateways; i++ {
		c.Gateways = append(c.Gateways, c.start(fmt.Sprintf("g%d-%s", i, ks), "gateway"))
	}
	return c
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func (c *Cluster) start(name, role string) *Proc {
	c.t.Helper()
	p := &Proc{Name: name, Addr: freeAddr(c.t)}
	p.args = append([]string{"serve", "--roles", role, "--node-id", name, "--listen", p.Addr,
		"--data-dir", filepath.Join(c.dir, name)}, c.common...)
	c.run(p)
	c.mu.Lock()
	c.procs[name] = p
	c.mu.Unlock()
	return p
}

func (c *Cluster) run(p *Proc) {
	c.t.Helper()
	f, err := os.OpenFile(filepath.Join(c.dir, p.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	p.log = f
	p.cmd = exec.Command(binary, p.args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if c.env != nil {
		p.cmd.Env = append(os.Environ(), c.env...)
	}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		c.t.Fatalf("start %s: %v", p.Name, err)
	}
	if !testbin.Ready(p.Addr, 60*time.Second) {
		c.t.Fatalf("%s not ready within 60s; log:\n%s", p.Name, c.Log(p))
	}
}

// Log returns a process's output so far.
func (c *Cluster) Log(p *Proc) string {
	b, _ := os.ReadFile(filepath.Join(c.dir, p.Name+".log"))
	return string(b)
}

// Kill9 kills a process with SIGKILL.
func (c *Cluster) Kill9(p *Proc) {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
	p.log.Close()
}

// Restart starts a stopped process again with the same name and address.
func (c *Cluster) Restart(p *Proc) { c.run(p) }

// Stop sends SIGTERM (drain) and waits.
func (c *Cluster) Stop(p *Proc) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		c.Kill9(p)
	}
	p.log.Close()
}

func (c *Cluster) stopAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.procs {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			_ = p.cmd.Wait()
		}
	}
	if c.t.Failed() {
		for _, p := range c.procs {
			c.t.Logf("--- log of %s ---\n%s", p.Name, tail(c.Log(p), 3000))
		}
	}
	if !c.ownCass {
		c.dropKeyspace()
	}
	testbin.DropStreams(c.t, c.nats, c.keyspace)
}

// dropKeyspace removes the test's keyspace: every table costs the single
// test node heap, and keyspaces left behind by many runs exhaust it.
func (c *Cluster) dropKeyspace() {
	cl := gocql.NewCluster(strings.Split(c.cass, ",")...)
	cl.Timeout = 30 * time.Second
	cl.ConnectTimeout = 5 * time.Second
	s, err := cl.CreateSession()
	if err != nil {
		c.t.Logf("drop keyspace %s: %v", c.keyspace, err)
		return
	}
	defer s.Close()
	if err := s.Query("DROP KEYSPACE IF EXISTS " + c.keyspace).Exec(); err != nil {
		c.t.Logf("drop keyspace %s: %v", c.keyspace, err)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// Token mints a token for user.
func (c *Cluster) Token(user string) string {
	tok, err := auth.MintHS256(c.key, auth.Claims{User: user, IssuedAt: time.Now().Add(-time.Minute), Expires: time.Now().Add(time.Hour)})
	if err != nil {
		c.t.Fatal(err)
	}
	return tok
}

// URLs are the gateways' WebSocket base URLs.
func (c *Cluster) URLs() []string {
	var out []string
	for _, g := range c.Gateways {
		out = append(out, g.URL())
	}
	return out
}

// Metrics returns the lines of a process's /metrics whose names start with
// one of prefixes (failure diagnostics), or the error that kept them away.
func (c *Cluster) Metrics(p *Proc, prefixes ...string) string {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get("http://" + p.Addr + "/metrics")
	if err != nil {
		return fmt.Sprintf("metrics of %s: %v", p.Name, err)
	}
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		for _, pre := range prefixes {
			if strings.HasPrefix(line, pre) {
				out = append(out, p.Name+": "+line)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
