package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
	njs "github.com/nats-io/nats.go/jetstream"

	pnats "github.com/parley-im/parley/internal/bus/nats"
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/hooks"
	hjetstream "github.com/parley-im/parley/internal/hooks/jetstream"
	hpebble "github.com/parley-im/parley/internal/hooks/pebble"
	"github.com/parley-im/parley/internal/ledger"
	ljetstream "github.com/parley-im/parley/internal/ledger/jetstream"
	lpebble "github.com/parley-im/parley/internal/ledger/pebble"
	"github.com/parley-im/parley/internal/push"
	"github.com/parley-im/parley/internal/server"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/webhook"
)

// receiver is a webhook endpoint: it answers status and counts each
// event id it is sent, with the body.
type receiver struct {
	status int
	mu     sync.Mutex
	got    map[string][]string // event id → bodies received
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	b, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	r.got[req.Header.Get(webhook.HeaderID)] = append(r.got[req.Header.Get(webhook.HeaderID)], string(b))
	r.mu.Unlock()
	w.WriteHeader(r.status)
}

func (r *receiver) events() map[string][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string][]string{}
	for id, bs := range r.got {
		out[id] = slices.Clone(bs)
	}
	return out
}

// allPartitions holds every partition: the test's own reader of a
// JetStream queue.
type allPartitions int

func (n allPartitions) Partitions() int { return int(n) }
func (allPartitions) Holds(int) bool    { return true }
func (n allPartitions) Watch(f func(int, bool)) {
	for p := range int(n) {
		f(p, true)
	}
}

// buryFirst moves endpoint's first queued event in q to the dead letters
// after attempts failed attempts, as the node's delivery would.
func buryFirst(t *testing.T, q *hpebble.Queue, endpoint string, attempts int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		q.Serve(ctx, []string{endpoint}, func(ctx context.Context, _ string, l hooks.Lane) {
			defer cancel()
			hs, err := l.Heads(ctx, 0, 1, func(uint64) bool { return false })
			if err != nil || len(hs) != 1 {
				t.Errorf("heads of %s: %v, %v", endpoint, hs, err)
				return
			}
			hs[0].Attempts = attempts
			if err := l.Bury(ctx, hs[0], "status 503"); err != nil {
				t.Error(err)
			}
		})
	}()
	<-done
}

// exportAll lists every event of the queue at dir.
func exportAll(t *testing.T, dir string) []hpebble.Exported {
	t.Helper()
	q, err := hpebble.Open(hpebble.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	var out []hpebble.Exported
	for after := []byte(nil); ; {
		evs, err := q.Export(context.Background(), after, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 {
			return out
		}
		out = append(out, evs...)
		after = evs[len(evs)-1].Cursor
	}
}

// exportTasks lists every task of the ledger at dir.
func exportTasks(t *testing.T, dir string) []lpebble.Exported {
	t.Helper()
	l, err := lpebble.Open(lpebble.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	out, err := l.Export(context.Background(), nil, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// checkpointAt is the progress writer of a migrate killed in its queue
// phases: it keeps the checkpoint as it was when the webhook queue's
// phase began, and cancels the run once the ledger's first task is
// copied.
type checkpointAt struct {
	path   string
	cancel context.CancelFunc
	mu     sync.Mutex
	before []byte
	err    error
}

func (c *checkpointAt) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := string(p)
	if strings.Contains(s, "(webhook queue: 0/") && c.before == nil {
		c.before, c.err = os.ReadFile(c.path)
	}
	if strings.Contains(s, "(compensation ledger: 1/") {
		c.cancel()
	}
	return len(p), nil
}

// TestMigrateQueuesFromEmbedded moves an embedded node's durable queues:
// webhook events the node queued for an endpoint that refused them (and
// a dead letter), push events and a dead one, pending compensation tasks
// (one attempted, due in an hour) and a dead one. The migration is killed
// after the first compensation task, and run again from the checkpoint
// as it was before the queues (as if every page had been published but
// none recorded): every event and task is published twice. The cluster
// holds each once: a cluster-mode node delivers each webhook event once
// to the endpoint, now accepting; the push stream and the ledger hand out
// each event and task once; the dead letters are listed once each. The
// source's queues are left as they were.
func TestMigrateQueuesFromEmbedded(t *testing.T) {
	hosts := engineEnv(t, "PARLEY_TEST_CASSANDRA")
	redisAddr := engineEnv(t, "PARLEY_TEST_REDIS")
	natsURL := engineEnv(t, "PARLEY_TEST_NATS")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	ks, ns := "tmigq"+hex.EncodeToString(b), "tmigq"+hex.EncodeToString(b)
	nc, err := pnats.Connect(ctx, pnats.ConnConfig{URL: natsURL, Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	t.Cleanup(func() {
		cl := gocql.NewCluster(hosts)
		cl.Timeout = 60 * time.Second
		if s, err := cl.CreateSession(); err == nil {
			_ = s.Query("DROP KEYSPACE IF EXISTS " + ks).Exec()
			s.Close()
		}
		js, _ := njs.New(nc)
		up := strings.ToUpper(ns)
		for _, s := range []string{up + "_HOOKS", up + "_HOOKS_DEAD", up + "_PUSH_HOOKS", up + "_PUSH_HOOKS_DEAD", up + "_TASKS", up + "_TASKS_DEAD"} {
			_ = js.DeleteStream(context.Background(), s)
		}
		_ = js.DeleteKeyValue(context.Background(), server.LeaseBucket(ns))
	})
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	// The embedded node queues its webhook events for an endpoint that
	// refuses them and retries in an hour.
	refusing := &receiver{status: http.StatusServiceUnavailable, got: map[string][]string{}}
	rs := httptest.NewServer(refusing)
	defer rs.Close()
	hookCfg := func(url string) hooks.Config {
		return hooks.Config{MaxAttempts: 10, MinBackoff: time.Hour, MaxBackoff: time.Hour,
			Endpoints: []hooks.Endpoint{{Name: "crm", URL: url, Secret: "s3cret", Events: []string{webhook.MessageCreated}}}}
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	dataDir := t.TempDir()
	src := servertest.Start(t, servertest.WithDataDir(dataDir), servertest.WithKey(key),
		servertest.WithConfig(func(c *config.Config) { c.Webhooks = hookCfg(rs.URL) }))
	alice, bob := startClient(t, ctx, src, "alice"), startClient(t, ctx, src, "bob")
	var convs []uint64
	for range 50 {
		d, err := alice.OpenDirect(ctx, "bob")
		if err == nil {
			convs = append(convs, d.ConvID)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(convs) == 0 {
		t.Fatal("no direct conversation")
	}
	g, err := alice.CreateGroup(ctx, "team", []string{"bob", "carol"})
	must(err)
	convs = append(convs, g.ConvID)
	sent := 0
	for i := range 6 {
		for _, c := range convs {
			from := alice
			if i%2 == 1 {
				from = bob
			}
			_, err := from.Send(ctx, c, fmt.Sprintf("message %d", i))
			must(err)
			sent++
		}
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if st := src.Hooks().Stats(); st[0].Backlog >= int64(sent) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the webhook backlog is %+v, want %d events", src.Hooks().Stats(), sent)
		}
	}
	alice.Close()
	bob.Close()
	src.Close()

	// Into the stopped node: a webhook event dead; push events, one
	// dead; compensation tasks, one dead, one attempted and due later.
	hq, err := hpebble.Open(hpebble.Config{Dir: dataDir + "/webhooks"})
	must(err)
	buryFirst(t, hq, "crm", 10)
	must(hq.Close())
	pq, err := hpebble.Open(hpebble.Config{Dir: dataDir + "/push"})
	must(err)
	var pushEvs []hooks.Event
	for i, c := range []uint64{convs[0], convs[1], convs[1], convs[0]} {
		pushEvs = append(pushEvs, hooks.Event{Endpoint: push.Endpoint, Key: hooks.Key{Conv: c, Seq: uint64(i + 1)}, Body: fmt.Appendf(nil, `{"push":%d}`, i)})
	}
	must(pq.Put(ctx, pushEvs))
	buryFirst(t, pq, push.Endpoint, 5)
	must(pq.Close())
	runLedger := func(p ledger.Policy, record []ledger.Task, fail bool) {
		t.Helper()
		l, err := lpebble.Open(lpebble.Config{Dir: dataDir + "/ledger", Policy: p, Poll: 10 * time.Millisecond})
		must(err)
		defer l.Close()
		for _, task := range record {
			must(l.Record(ctx, task))
		}
		if !fail {
			return
		}
		// The attempt fails; its outcome is written before the run stops.
		rctx, stop := context.WithCancel(ctx)
		_ = l.Run(rctx, func(context.Context, ledger.Task) error {
			time.AfterFunc(200*time.Millisecond, stop)
			return errors.New("refused")
		})
	}
	runLedger(ledger.Policy{MaxAttempts: 1}, []ledger.Task{{Kind: ledger.KindRows, Conv: convs[1], Seq: 3, Users: []string{"carol"}}}, true)
	runLedger(ledger.Policy{MaxAttempts: 5, MinBackoff: time.Hour, MaxBackoff: time.Hour}, []ledger.Task{{Kind: ledger.KindPush, Conv: convs[0], Seq: 2, Users: []string{"bob"}, Node: "n1"}}, true)
	runLedger(ledger.Policy{}, []ledger.Task{
		{Kind: ledger.KindRows, Conv: convs[1], Seq: 5, Users: []string{"alice", "bob"}, Mention: true},
		{Kind: ledger.KindRows, Conv: convs[0], Seq: 7, Users: []string{"alice"}},
	}, false)

	hookSrc, pushSrc, taskSrc := exportAll(t, dataDir+"/webhooks"), exportAll(t, dataDir+"/push"), exportTasks(t, dataDir+"/ledger")
	count := func(evs []hpebble.Exported) (queued, dead int) {
		for _, e := range evs {
			if e.Dead != nil {
				dead++
			} else {
				queued++
			}
		}
		return queued, dead
	}
	if q, d := count(hookSrc); q < sent-1 || d != 1 {
		t.Fatalf("the node's webhook queue: %d queued, %d dead, want %d, 1", q, d, sent-1)
	}
	if q, d := count(pushSrc); q != 3 || d != 1 {
		t.Fatalf("the node's push queue: %d queued, %d dead, want 3, 1", q, d)
	}
	if len(taskSrc) != 4 || !taskSrc[3].Dead || taskSrc[0].Task.Attempts != 1 || taskSrc[0].Task.NextAt <= time.Now().UnixMilli() {
		t.Fatalf("the node's ledger: %+v", taskSrc)
	}

	// Migrate, killed after the first compensation task, then again from
	// the checkpoint before the queues.
	t.Setenv("PARLEY_CLUSTER_CASSANDRA_HOSTS", hosts)
	t.Setenv("PARLEY_CLUSTER_NATS", natsURL)
	t.Setenv("PARLEY_CLUSTER_NAMESPACE", ns)
	args := []string{"--from", dataDir, "--cluster.keyspace", ks}
	oldEvery, oldW, oldPage := progressEvery, migrateProgress, queuePage
	t.Cleanup(func() { progressEvery, migrateProgress, queuePage = oldEvery, oldW, oldPage })
	progressEvery, queuePage = 0, 1
	cpPath := dataDir + "/migrate.checkpoint"
	mctx, mcancel := context.WithCancel(ctx)
	killer := &checkpointAt{path: cpPath, cancel: mcancel}
	migrateProgress = killer
	var out bytes.Buffer
	if err := runMigrate(mctx, args, &out); !errors.Is(err, context.Canceled) {
		t.Fatalf("a migrate cancelled in the ledger: %v\n%s", err, out.String())
	}
	cp, err := loadCheckpoint(cpPath, fmt.Sprintf("keyspace %s on %s, namespace %s", ks, hosts, ns))
	must(err)
	if !cp.Webhooks.Done || !cp.PushQueue.Done || cp.Ledger.Done || cp.Ledger.Copied != 1 {
		t.Fatalf("checkpoint after the kill: %+v, want the webhook and push queues done, one task copied", cp)
	}
	if killer.err != nil || killer.before == nil {
		t.Fatalf("the checkpoint before the queues: %q, %v", killer.before, killer.err)
	}
	must(os.WriteFile(cpPath, killer.before, 0o600))
	var bar bytes.Buffer
	migrateProgress = &bar
	out.Reset()
	if err := runMigrate(ctx, args, &out); err != nil {
		t.Fatalf("migrate again: %v\n%s", err, out.String())
	}
	q, d := count(hookSrc)
	want := fmt.Sprintf("copied %d webhook events, %d push events and %d compensation tasks", q+d, 4, 4)
	for _, s := range []string{"(webhook queue: 0/", "(push queue: 4/4)", "(compensation ledger: 4/4)", "done"} {
		if !strings.Contains(bar.String(), s) {
			t.Errorf("the bar lacks %q: %q", s, bar.String())
		}
	}
	if !strings.Contains(out.String(), want) {
		t.Errorf("migrate printed %q, want %q", out.String(), want)
	}
	// The source is as it was.
	if got := exportAll(t, dataDir+"/webhooks"); !reflect.DeepEqual(got, hookSrc) {
		t.Errorf("the node's webhook queue after the migration:\n%+v\nbefore:\n%+v", got, hookSrc)
	}
	if got := exportAll(t, dataDir+"/push"); !reflect.DeepEqual(got, pushSrc) {
		t.Errorf("the node's push queue after the migration changed")
	}
	if got := exportTasks(t, dataDir+"/ledger"); !reflect.DeepEqual(got, taskSrc) {
		t.Errorf("the node's ledger after the migration changed")
	}

	// The streams hold each event and task once (a lane would join two
	// copies it holds at once: deliveries alone cannot tell).
	js, err := njs.New(nc)
	must(err)
	up := strings.ToUpper(ns)
	qh, dh := count(hookSrc)
	for stream, want := range map[string]int{up + "_HOOKS": qh, up + "_HOOKS_DEAD": dh, up + "_PUSH_HOOKS": 3, up + "_PUSH_HOOKS_DEAD": 1, up + "_TASKS": 3, up + "_TASKS_DEAD": 1} {
		st, err := js.Stream(ctx, stream)
		must(err)
		info, err := st.Info(ctx)
		must(err)
		if info.State.Msgs != uint64(want) {
			t.Errorf("stream %s holds %d messages, want %d", stream, info.State.Msgs, want)
		}
	}

	// The ledger hands out each pending task once, due at once, and
	// lists the dead one.
	led, err := ljetstream.Open(ctx, nc, server.LedgerConfig(ns, 1))
	must(err)
	var wantTasks []ledger.Task
	for _, e := range taskSrc {
		if !e.Dead {
			task := e.Task
			task.ID, task.Attempts, task.NextAt = 0, 1, 0
			wantTasks = append(wantTasks, task)
		}
	}
	var mu sync.Mutex
	var ran []ledger.Task
	lctx, lstop := context.WithCancel(ctx)
	lerr := make(chan error, 1)
	go func() {
		lerr <- led.Run(lctx, func(_ context.Context, task ledger.Task) error {
			task.ID = 0
			mu.Lock()
			ran = append(ran, task)
			mu.Unlock()
			return nil
		})
	}()
	quiet := func(n func() int, want int) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); n() < want && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(2 * time.Second) // a copy would come now
	}
	quiet(func() int { mu.Lock(); defer mu.Unlock(); return len(ran) }, len(wantTasks))
	lstop()
	must(<-lerr)
	byTask := func(a, b ledger.Task) int { return strings.Compare(fmt.Sprint(a), fmt.Sprint(b)) }
	slices.SortFunc(ran, byTask)
	slices.SortFunc(wantTasks, byTask)
	if !reflect.DeepEqual(ran, wantTasks) {
		t.Errorf("the cluster's ledger ran\n%+v\nwant each once\n%+v", ran, wantTasks)
	}
	deadTasks, err := led.Dead(ctx, 10)
	must(err)
	if len(deadTasks) != 1 || !reflect.DeepEqual(deadTasks[0], taskSrc[3].Task) {
		t.Errorf("the cluster's dead tasks %+v, want %+v", deadTasks, taskSrc[3].Task)
	}

	// The push stream hands out each queued event once and lists the dead
	// one.
	pj, err := hjetstream.Open(ctx, hjetstream.Config{NATS: nc, Namespace: server.PushNamespace(ns), Owner: allPartitions(config.Default().Cluster.Partitions), Node: "test"})
	must(err)
	var pushed []hooks.Event
	pctx, pstop := context.WithCancel(ctx)
	pdone := make(chan struct{})
	go func() {
		defer close(pdone)
		pj.Serve(pctx, []string{push.Endpoint}, func(ctx context.Context, ep string, l hooks.Lane) {
			for ctx.Err() == nil {
				hs, _ := l.Heads(ctx, 0, 100, func(uint64) bool { return false })
				for _, h := range hs {
					mu.Lock()
					pushed = append(pushed, hooks.Event{Endpoint: ep, Key: h.Key, Body: h.Body})
					mu.Unlock()
					_ = l.Done(ctx, h)
				}
				select {
				case <-ctx.Done():
				case <-l.Changed():
				case <-time.After(100 * time.Millisecond):
				}
			}
		})
	}()
	var wantPush []hooks.Event
	var wantPushDead, wantHookDead []hooks.DeadLetter
	for _, e := range pushSrc {
		if e.Dead != nil {
			wantPushDead = append(wantPushDead, *e.Dead)
		} else {
			wantPush = append(wantPush, hooks.Event{Endpoint: e.Endpoint, Key: e.Head.Key, Body: e.Head.Body})
		}
	}
	quiet(func() int { mu.Lock(); defer mu.Unlock(); return len(pushed) }, len(wantPush))
	pstop()
	<-pdone
	byKey := func(a, b hooks.Event) int { return strings.Compare(fmt.Sprint(a.Key), fmt.Sprint(b.Key)) }
	slices.SortFunc(pushed, byKey)
	slices.SortFunc(wantPush, byKey)
	if !reflect.DeepEqual(pushed, wantPush) {
		t.Errorf("the cluster's push queue handed out\n%+v\nwant each once\n%+v", pushed, wantPush)
	}
	if got, err := pj.Dead(ctx, push.Endpoint); err != nil || !reflect.DeepEqual(got, wantPushDead) {
		t.Errorf("the cluster's dead push events %+v, %v; want %+v", got, err, wantPushDead)
	}

	// A cluster-mode node delivers each webhook event once to the
	// endpoint, accepting now.
	hj, err := hjetstream.Open(ctx, hjetstream.Config{NATS: nc, Namespace: ns, Owner: publishOnly(1), Node: "test"})
	must(err)
	for _, e := range hookSrc {
		if e.Dead != nil {
			wantHookDead = append(wantHookDead, *e.Dead)
		}
	}
	if got, err := hj.Dead(ctx, "crm"); err != nil || !reflect.DeepEqual(got, wantHookDead) {
		t.Errorf("the cluster's dead webhook events %+v, %v; want %+v", got, err, wantHookDead)
	}
	accepting := &receiver{status: http.StatusNoContent, got: map[string][]string{}}
	as := httptest.NewServer(accepting)
	defer as.Close()
	wantHooks := map[string][]string{}
	for _, e := range hookSrc {
		if e.Dead == nil {
			wantHooks[webhook.ID(e.Head.Conv, e.Head.Seq, webhook.Types[e.Head.Type])] = []string{string(e.Head.Body)}
		}
	}
	servertest.Start(t, servertest.WithDataDir(t.TempDir()), servertest.WithKey(key), servertest.WithConfig(func(c *config.Config) {
		c.Cluster.Redis, c.Cluster.NATS, c.Cluster.CassandraHosts = redisAddr, natsURL, hosts
		c.Cluster.Keyspace, c.Cluster.Namespace = ks, ns
		c.Webhooks = hookCfg(as.URL)
		c.Attach.MaxFileBytes = 0 // no S3 here
	}))
	quiet(func() int { return len(accepting.events()) }, len(wantHooks))
	if got := accepting.events(); !reflect.DeepEqual(got, wantHooks) {
		t.Errorf("the cluster delivered (id → bodies)\n%v\nwant each once\n%v", got, wantHooks)
	}
}
