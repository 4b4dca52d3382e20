package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/parley-im/parley/internal/auth"
)

// ClusterTarget is a running cluster that the benchmarks drive from
// outside: its gateways, the HS256 key its tokens are signed with, and the
// chat processes, whose /metrics hold the stored and fan-out counters.
type ClusterTarget struct {
	URLs     []string // gateway WebSocket bases, ws://host:port, as given
	Gateways []string // host:port of each gateway
	Chats    []string // host:port of each chat process (may be empty)
	Key      []byte
}

// ParseClusterTarget reads comma-separated gateway URLs (ws://host:port or
// host:port), a hex HS256 key and comma-separated chat host:port.
func ParseClusterTarget(urls, key, chats string) (ClusterTarget, error) {
	var t ClusterTarget
	for _, u := range splitList(urls) {
		addr := u
		if strings.Contains(u, "://") {
			p, err := url.Parse(u)
			if err != nil {
				return ClusterTarget{}, fmt.Errorf("cluster target: %w", err)
			}
			if p.Scheme != "ws" {
				return ClusterTarget{}, fmt.Errorf("cluster target: %q: only ws:// gateways are supported", u)
			}
			addr = p.Host
		} else {
			u = "ws://" + u
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return ClusterTarget{}, fmt.Errorf("cluster target: gateway %q: %w", u, err)
		}
		t.URLs, t.Gateways = append(t.URLs, u), append(t.Gateways, addr)
	}
	for _, c := range splitList(chats) {
		if _, _, err := net.SplitHostPort(c); err != nil {
			return ClusterTarget{}, fmt.Errorf("cluster target: chat %q: %w", c, err)
		}
		t.Chats = append(t.Chats, c)
	}
	k, err := auth.ParseHS256Key(key)
	if err != nil {
		return ClusterTarget{}, fmt.Errorf("cluster target: key: %w", err)
	}
	t.Key = k
	return t, t.Validate()
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// Validate reports a target the benchmarks cannot use.
func (t ClusterTarget) Validate() error {
	var errs []error
	if len(t.Gateways) == 0 || len(t.Gateways) != len(t.URLs) {
		errs = append(errs, errors.New("cluster target: no gateways"))
	}
	if len(t.Key) < auth.MinHS256KeyBytes {
		errs = append(errs, fmt.Errorf("cluster target: key is %d bytes, need at least %d", len(t.Key), auth.MinHS256KeyBytes))
	}
	return errors.Join(errs...)
}

// dialers returns one dialer per gateway.
func (t ClusterTarget) dialers(readBuf int) []*dialer {
	out := make([]*dialer, len(t.Gateways))
	for i, g := range t.Gateways {
		out[i] = newDialer(g, t.Key, nil, readBuf)
	}
	return out
}

// scrape sums every process's /metrics by metric name: the cluster's
// counters are spread over gateways (connections, retransmits) and chat
// processes (messages stored, fan-out).
func (t ClusterTarget) scrape(ctx context.Context, client *http.Client) (Metrics, error) {
	sum := Metrics{}
	for _, addr := range slices.Concat(t.Gateways, t.Chats) {
		m, err := ScrapeMetrics(ctx, client, "http://"+addr+"/metrics")
		if err != nil {
			return nil, fmt.Errorf("%s: %w", addr, err)
		}
		for k, v := range m {
			sum[k] += v
		}
	}
	return sum, nil
}

// keyDir writes the key where the client processes of the fan-out
// benchmark look for a node's development key. The caller removes it.
func (t ClusterTarget) keyDir() (string, error) {
	dir, err := os.MkdirTemp("", "parley-bench-key-")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, auth.DevKeyFile)
	if err := os.WriteFile(path, []byte(fmt.Sprintf("%x\n", t.Key)), 0o600); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// metricsSum serves, on a loopback port, the sum of a cluster's /metrics
// in the text format, so that code written against one node's metrics URL
// reads the whole cluster's.
type metricsSum struct {
	srv  *http.Server
	ln   net.Listener
	done chan struct{}
}

func serveMetricsSum(t ClusterTarget) (*metricsSum, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	client := &http.Client{Timeout: 10 * time.Second}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		m, err := t.scrape(r.Context(), client)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		names := make([]string, 0, len(m))
		for k := range m {
			names = append(names, k)
		}
		slices.Sort(names)
		var b strings.Builder
		for _, k := range names {
			b.WriteString(k + " " + strconv.FormatFloat(m[k], 'g', -1, 64) + "\n")
		}
		_, _ = w.Write([]byte(b.String()))
	})
	s := &metricsSum{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, ln: ln, done: make(chan struct{})}
	go func() { defer close(s.done); _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *metricsSum) url() string { return "http://" + s.ln.Addr().String() + "/metrics" }

func (s *metricsSum) close() {
	_ = s.srv.Close()
	<-s.done
}

// RunClusterFanout runs the fan-out scenarios against a running cluster:
// the group's owner sends through the first gateway, and the client
// processes holding the online members connect to the gateways in turn
// (process j of the run to gateway j mod len(Gateways)), so every message
// is delivered through every gateway. The counters are the cluster's sums;
// the chat processes must be in the target for the fan-out counters.
// cfg.Addr and cfg.DataDir must be empty.
func RunClusterFanout(ctx context.Context, t ClusterTarget, cfg FanoutConfig) (results []FanoutResult, err error) {
	probe := cfg
	probe.ServerBinary = "-" // Validate wants a way to reach a node; t is it
	if err := errors.Join(t.Validate(), probe.Validate()); err != nil {
		return nil, fmt.Errorf("bench fanout: %w", err)
	}
	if cfg.ServerBinary != "" || cfg.Addr != "" || cfg.DataDir != "" {
		return nil, errors.New("bench fanout: a cluster run takes no server binary, addr or data dir")
	}
	if len(t.Chats) == 0 {
		return nil, errors.New("bench fanout: the cluster's chat processes are needed for the fan-out counters")
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	dir, err := t.keyDir()
	if err != nil {
		return nil, fmt.Errorf("bench fanout: %w", err)
	}
	defer os.RemoveAll(dir)
	sum, err := serveMetricsSum(t)
	if err != nil {
		return nil, fmt.Errorf("bench fanout: %w", err)
	}
	defer sum.close()

	start := cfg.startClient
	if start == nil {
		start = cfg.execClient
	}
	var mu sync.Mutex
	next := 0
	cfg.startClient = func(name string, cc FanoutClientConfig) (*fanoutProc, error) {
		mu.Lock()
		cc.Addr = t.Gateways[next%len(t.Gateways)]
		next++
		mu.Unlock()
		return start(name+" via "+cc.Addr, cc)
	}
	r := &fanoutRun{
		cfg: cfg, addr: t.Gateways[0], dir: dir, d: newDialer(t.Gateways[0], t.Key, nil, 4096),
		httpc: &http.Client{Timeout: 10 * time.Second}, metricsURL: sum.url(),
		run: strconv.FormatInt(time.Now().UnixNano()%(1<<40), 36),
	}
	fmt.Fprintf(cfg.Out, "cluster: gateways %v, chat processes %v; %d messages per scenario at %s, %d-byte bodies, clients ack %s\n",
		t.Gateways, t.Chats, cfg.Messages, rateString(cfg.Rate), cfg.BodyBytes, ackString(cfg.AckByPush, cfg.AckEvery))
	var errs []error
	for i, s := range cfg.Scenarios {
		res, err := r.scenario(ctx, i, s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.Name, err))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		results = append(results, res)
		for _, p := range res.problems() {
			errs = append(errs, fmt.Errorf("%s: %s", s.Name, p))
		}
	}
	WriteFanoutTables(cfg.Out, results)
	if len(errs) > 0 {
		return results, fmt.Errorf("bench fanout: %w", errors.Join(errs...))
	}
	return results, nil
}
