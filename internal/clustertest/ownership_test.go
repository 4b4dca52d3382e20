package clustertest

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	natsio "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	goredis "github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/internal/cluster/lease"
	"github.com/parley-im/parley/internal/server"
	"github.com/parley-im/parley/protocol"
)

// The ownership fault tests run a send storm (every acknowledged message
// must end stored once at its acknowledged seq, seqs dense) while the chat
// process that owns the storm's group conversation dies, stalls or
// restarts. Takeover times are logged (performance is reported, not
// asserted; docs/benchmarks.md "Ownership").

// owner returns the node holding conv's partition lease and its epoch
// ("" if none), from the lease store the processes use (the JetStream KV
// bucket by default, Redis with --cluster.leases redis).
func (c *Cluster) owner(conv uint64) (string, uint64) {
	c.t.Helper()
	v, _ := c.leaseEntry(conv)
	node, e, _ := strings.Cut(v, "/")
	epoch, _ := strconv.ParseUint(e, 10, 64)
	return node, epoch
}

// redisLeases reports whether the processes keep their leases in Redis.
func (c *Cluster) redisLeases() bool {
	for i, a := range c.common {
		if (a == "--cluster.leases" && i+1 < len(c.common) && c.common[i+1] == "redis") || a == "--cluster.leases=redis" {
			return true
		}
	}
	return false
}

// leaseEntry returns conv's partition lease ("node/epoch", "" if none)
// and the time left on it.
func (c *Cluster) leaseEntry(conv uint64) (string, time.Duration) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	p := lease.Partition(conv, lease.DefaultPartitions)
	if c.redisLeases() {
		rdb := goredis.NewClient(&goredis.Options{Addr: c.redis})
		defer rdb.Close()
		key := c.keyspace + ":part:" + strconv.Itoa(p)
		v, err := rdb.Get(ctx, key).Result()
		if err != nil {
			if !errors.Is(err, goredis.Nil) {
				c.t.Logf("read lease of partition %d: %v", p, err)
			}
			return "", 0
		}
		d, _ := rdb.PTTL(ctx, key).Result()
		return v, d
	}
	nc, err := natsio.Connect(c.nats)
	if err != nil {
		c.t.Logf("read lease of partition %d: %v", p, err)
		return "", 0
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(ctx, server.LeaseBucket(c.keyspace))
	if err != nil {
		c.t.Logf("read lease of partition %d: %v", p, err)
		return "", 0
	}
	e, err := kv.Get(ctx, "part."+strconv.Itoa(p))
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			c.t.Logf("read lease of partition %d: %v", p, err)
		}
		return "", 0
	}
	v := string(e.Value())
	if strings.HasPrefix(v, "/") { // released
		return "", 0
	}
	// A lease lasts cluster.partition_lease (3 s) from its last renewal.
	return v, lease.DefaultLeaseTTL - time.Since(e.Created())
}

// leaseLeft returns the time left on conv's partition lease.
func (c *Cluster) leaseLeft(conv uint64) time.Duration {
	_, d := c.leaseEntry(conv)
	return d
}

// waitOwner waits until conv's partition has an owner other than not and
// returns it.
func (c *Cluster) waitOwner(conv uint64, not string, timeout time.Duration) (string, uint64) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if node, epoch := c.owner(conv); node != "" && node != not {
			return node, epoch
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("conv %d: no new owner within %v", conv, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (c *Cluster) chat(name string) *Proc {
	c.t.Helper()
	for _, p := range c.Chats {
		if p.Name == name {
			return p
		}
	}
	c.t.Fatalf("no chat process %q", name)
	return nil
}

// stormOwner starts a storm and returns it with the owner of its group.
func stormOwner(t *testing.T, c *Cluster) (*rawStorm, *Proc, uint64) {
	t.Helper()
	s := startRawStorm(t, c, 8)
	time.Sleep(2 * time.Second)
	node, epoch := c.waitOwner(s.cs.group, "", 10*time.Second)
	return s, c.chat(node), epoch
}

// TestKillOwnerDuringSendStorm: the owner of the storm's group is killed
// with SIGKILL; another chat process takes the partition over after the
// lease expires, and the senders' retries land there.
func TestKillOwnerDuringSendStorm(t *testing.T) {
	c := Start(t, Options{Gateways: 2, Chats: 3})
	s, victim, epoch := stormOwner(t, c)
	left := c.leaseLeft(s.cs.group)
	killed := time.Now()
	c.Kill9(victim)
	node, newEpoch := c.waitOwner(s.cs.group, victim.Name, 30*time.Second)
	moved := time.Since(killed)
	if newEpoch <= epoch {
		t.Errorf("new lease epoch %d is not above the dead owner's %d", newEpoch, epoch)
	}
	time.Sleep(3 * time.Second)
	first := s.got.firstAfter(s.cs.group, killed.Add(100*time.Millisecond))
	if first.IsZero() {
		t.Errorf("no message of the group acknowledged within 3s of the takeover by %s", node)
	}
	t.Logf("takeover after kill -9 of %s (lease had %v left): lease at %s after %v, first ACK in the group %v after the kill",
		victim.Name, left, node, moved.Round(time.Millisecond), first.Sub(killed).Round(time.Millisecond))
	c.Restart(victim)
	time.Sleep(2 * time.Second)
	s.finish()
}

// TestStalledOwnerFenced: the owner of the storm's group is stopped with
// SIGSTOP past its lease; another process takes over and the storm goes
// on; then the stalled process resumes (SIGCONT) with requests and writes
// in flight. Nothing it writes after the takeover is acknowledged or
// shows: every acknowledged message is stored once at its seq, seqs
// dense, no seq acknowledged twice.
func TestStalledOwnerFenced(t *testing.T) {
	c := Start(t, Options{Gateways: 2, Chats: 2})
	s, victim, epoch := stormOwner(t, c)
	left := c.leaseLeft(s.cs.group)
	stopped := time.Now()
	if err := victim.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = victim.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	node, newEpoch := c.waitOwner(s.cs.group, victim.Name, 30*time.Second)
	moved := time.Since(stopped)
	if newEpoch <= epoch {
		t.Errorf("new lease epoch %d is not above the stalled owner's %d", newEpoch, epoch)
	}
	time.Sleep(3 * time.Second)
	first := s.got.firstAfter(s.cs.group, stopped.Add(100*time.Millisecond))
	t.Logf("takeover after SIGSTOP of %s (lease had %v left): lease at %s after %v, first ACK in the group after the stop %v later",
		victim.Name, left, node, moved.Round(time.Millisecond), first.Sub(stopped).Round(time.Millisecond))
	if err := victim.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed = true
	// The zombie wakes with a backlog; the storm goes on around it.
	time.Sleep(4 * time.Second)
	s.finish()
}

// TestRollingRestartOfChats: under a send storm every chat process in
// turn is stopped with SIGTERM (it gives its partitions up) and started
// again.
func TestRollingRestartOfChats(t *testing.T) {
	c := Start(t, Options{Gateways: 2, Chats: 3})
	s := startRawStorm(t, c, 8)
	time.Sleep(1500 * time.Millisecond)
	for _, p := range c.Chats {
		owned, _ := c.owner(s.cs.group)
		start := time.Now()
		c.Stop(p)
		if owned == p.Name {
			node, _ := c.waitOwner(s.cs.group, p.Name, 30*time.Second)
			t.Logf("%s stopped (owner of the group); %s took it over %v after SIGTERM", p.Name, node, time.Since(start).Round(time.Millisecond))
		}
		c.Restart(p)
		time.Sleep(1500 * time.Millisecond)
	}
	time.Sleep(time.Second)
	s.finish()
}

// TestNodeNumberCollisionRefused: a chat process configured with the
// Snowflake node number of a live chat process refuses to start.
func TestNodeNumberCollisionRefused(t *testing.T) {
	c := Start(t, Options{Gateways: 1, Chats: 1, Extra: []string{"--node-number", "7"}})
	name := "c2-" + c.keyspace
	args := append([]string{"serve", "--roles", "chat", "--node-id", name, "--listen", freeAddr(t),
		"--data-dir", t.TempDir()}, c.common...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary, args...).CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("second chat process with node number 7: %v (context %v); output:\n%s", err, ctx.Err(), out)
	}
	if !strings.Contains(string(out), "node number in use") {
		t.Errorf("refusal does not name the cause:\n%s", out)
	}
}

// TestChatAdmissionControl: a chat process serving at most one request at
// a time answers the requests over that bound at once with overloaded and
// a retry_after_ms, never queues them, and serves the rest; clients that
// honour retry_after_ms all get their answers.
func TestChatAdmissionControl(t *testing.T) {
	c := Start(t, Options{Gateways: 1, Chats: 1, Extra: []string{"--cluster.chat-max-inflight", "1"}})
	cs := setupConvs(t, c, c.Gateways[0], []string{"u0", "u1"})
	conv := cs.convsOf["u0"][1]
	const clients, reads = 16, 5
	var (
		mu         sync.Mutex
		overloaded int
		served     int
		problems   []string
		wg         sync.WaitGroup
	)
	for i := range clients {
		wg.Go(func() {
			rc, err := dialRaw(c, c.Gateways[0], "u0", fmt.Sprintf("d%d", i))
			if err != nil {
				mu.Lock()
				problems = append(problems, err.Error())
				mu.Unlock()
				return
			}
			defer rc.close()
			for range reads {
				for attempt := 0; ; attempt++ {
					r, err := rc.call(protocol.Frame{Type: protocol.TypeConvInfo, ConvID: conv}, 10*time.Second)
					mu.Lock()
					switch {
					case err != nil:
						problems = append(problems, err.Error())
					case r.Type == protocol.TypeError && r.Code == protocol.CodeOverloaded:
						overloaded++
						if r.RetryAfter <= 0 {
							problems = append(problems, "overloaded without retry_after_ms: "+frameString(r))
						}
					case r.Type == protocol.TypeError:
						problems = append(problems, frameString(r))
					default:
						served++
					}
					mu.Unlock()
					if err != nil || r.Type != protocol.TypeError || r.Code != protocol.CodeOverloaded || attempt > 50 {
						break
					}
					time.Sleep(time.Duration(r.RetryAfter) * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	if len(problems) > 0 {
		t.Fatalf("%d problems: %s", len(problems), strings.Join(problems[:min(5, len(problems))], "; "))
	}
	if served != clients*reads {
		t.Errorf("%d requests served, want %d", served, clients*reads)
	}
	if overloaded == 0 {
		t.Errorf("%d concurrent clients against a bound of 1: no request was refused", clients)
	}
	t.Logf("%d served, %d answered overloaded (retried after retry_after_ms)", served, overloaded)
}
