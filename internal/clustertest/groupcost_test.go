package clustertest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/protocol"
)

// redisCalls is the total of Redis's INFO commandstats calls, and the
// calls per command.
func redisCalls(t *testing.T, rdb *goredis.Client) (int64, map[string]int64) {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	per := make(map[string]int64)
	var total int64
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
		per[strings.TrimPrefix(name, "cmdstat_")] = n
		total += n
	}
	return total, per
}

// TestGroupMessageRedisCommandsFlat: on a cluster of real processes (3
// gateways, 2 chat processes) with a Redis of its own, the Redis commands
// a group message costs do not grow with its members online: a group
// with 10 times the online members, spread over the same three gateways,
// costs at most a few commands more per message, and at most 10 above
// the idle cluster's background (leases, the registry's refreshes). Each
// group's messages are counted once every member has received them.
func TestGroupMessageRedisCommandsFlat(t *testing.T) {
	redis := startPrivateRedis(t)
	c := Start(t, Options{Gateways: 3, Chats: 2, Redis: redis.addr, Extra: []string{"--chat.small-below", "4", "--chat.large-above", "40"}})
	rdb := goredis.NewClient(&goredis.Options{Addr: redis.addr})
	defer rdb.Close()

	const few, many = 15, 150
	conns := make([]*liveConn, many)
	for i := range conns {
		conns[i] = dialLive(t, c, c.Gateways[i%len(c.Gateways)], fmt.Sprintf("m%03d", i))
	}
	owner := conns[0]
	group := func(name string, n int) uint64 {
		var others []string
		for _, l := range conns[1:n] {
			others = append(others, l.user)
		}
		return owner.call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: name, Members: others}, protocol.TypeConv).Conv.ConvID
	}
	small, large := group("few", few), group("many", many)
	round := 0
	// send sends k messages to conv and waits until its first n members
	// have each; it returns the time it took.
	send := func(conv uint64, n, k int) time.Duration {
		start := time.Now()
		var seqs []uint64
		for range k {
			round++
			cmid := fmt.Sprintf("r%d", round)
			seqs = append(seqs, owner.call(protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: cmid, Body: "x"}, protocol.TypeAck).Seq)
		}
		deadline := time.Now().Add(30 * time.Second)
		for _, l := range conns[:n] {
			for _, seq := range seqs {
				for {
					l.mu.Lock()
					_, ok := l.pushes[conv][seq]
					l.mu.Unlock()
					if ok {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("%s (on %s) never got seq %d of the %d-member group", l.user, l.node, seq, n)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
		}
		return time.Since(start)
	}
	// Warm up: the partitions shared out between the chat processes
	// (their leases settle in a few seconds), every member in the owner's
	// online index and every gateway holding its lists.
	time.Sleep(5 * time.Second)
	send(small, few, 2)
	send(large, many, 2)
	const k = 20
	measure := func(conv uint64, n int) (float64, map[string]int64) {
		_, per0 := redisCalls(t, rdb)
		took := send(conv, n, k)
		_, per1 := redisCalls(t, rdb)
		time.Sleep(took) // the background of an idle cluster for as long
		_, per2 := redisCalls(t, rdb)
		diff := make(map[string]int64)
		var during, idle int64
		for name, v := range per1 {
			if d := v - per0[name]; d > 0 {
				diff[name] = d
			}
			// Lease renewals (a script, its PEXPIRE, the epoch GET) run
			// on a timer whatever is sent; they are not a message's cost
			// and their timing makes the background subtraction noisy.
			if leaseCommands[name] {
				continue
			}
			during += v - per0[name]
			idle += per2[name] - v
		}
		return float64(during-idle) / k, diff
	}
	perFew, cmdsFew := measure(small, few)
	perMany, cmdsMany := measure(large, many)
	t.Logf("Redis commands per group message: %.1f with %d members online, %.1f with %d (background subtracted); commands during the sends: %v / %v",
		perFew, few, perMany, many, cmdsFew, cmdsMany)
	// The per-user registry reads (HGETALL) of a message fanned out by
	// registry lookups: one per member online per message.
	if cmdsMany["hgetall"] >= int64(k*many/2) || perMany > 10 || perMany > perFew+3 {
		t.Fatalf("a group message costs %.1f Redis commands with %d members online and %.1f with %d: it grows with the members (want ≤ 10 and flat); commands: %v",
			perFew, few, perMany, many, cmdsMany)
	}
}

// leaseCommands are the Redis commands of the partition and node-number
// leases, renewed on a timer by every chat process.
var leaseCommands = map[string]bool{"eval": true, "evalsha": true, "pexpire": true, "get": true}
