//go:build !race

package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/third_party/nbio/nbhttp"
	"github.com/parley-im/parley/third_party/nbio/nbhttp/websocket"
)

// TestAutobahn runs the Autobahn|Testsuite cases (driven by kosoku, see
// docs/decisions.md) against an echo endpoint built from the gateway's own
// WebSocket code: EngineConfig and configureUpgrader, with the message
// bound raised so the 16 MiB cases fit. Every case must end with the
// outcome listed in testdata/autobahn-accepted.txt.
//
// PARLEY_KOSOKU names the kosoku executable; PARLEY_AUTOBAHN_CASES, a
// comma-separated list of case globs, runs a subset (CI runs the whole
// suite); PARLEY_ARTIFACTS, if set, receives the report.
//
// The race detector is off for this test: under -race the node serves with
// net/http, and this test is about the event loop that ships.
func TestAutobahn(t *testing.T) {
	kosoku := os.Getenv("PARLEY_KOSOKU")
	if kosoku == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("PARLEY_KOSOKU must name the kosoku executable under CI (pip install kosoku==0.1.0)")
		}
		t.Skip("set PARLEY_KOSOKU to the kosoku executable (pip install kosoku==0.1.0) to run the Autobahn cases")
	}
	accepted := readAccepted(t, "testdata/autobahn-accepted.txt")
	addr := startEcho(t)

	out := t.TempDir()
	args := []string{"ws://" + addr + "/echo", "-p", "2", "-o", out}
	if sel := os.Getenv("PARLEY_AUTOBAHN_CASES"); sel != "" {
		for _, c := range strings.Split(sel, ",") {
			args = append(args, "-i", strings.TrimSpace(c))
		}
	}
	cmd := exec.Command(kosoku, args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	start := time.Now()
	// kosoku exits 1 when a case fails; the report decides.
	_ = cmd.Run()
	t.Logf("kosoku ran for %v", time.Since(start).Round(time.Second))

	results := readReport(t, out)
	if len(results) == 0 {
		t.Fatal("kosoku wrote no results")
	}
	if dst := os.Getenv("PARLEY_ARTIFACTS"); dst != "" {
		saveReport(t, out, filepath.Join(dst, "autobahn"))
	}
	var bad []string
	counts := map[string]int{}
	for id, r := range results {
		counts[r.Behavior]++
		want := accepted.outcome(id)
		if r.Behavior != want || (r.BehaviorClose != "OK" && r.BehaviorClose != "INFORMATIONAL" && r.BehaviorClose != want) {
			bad = append(bad, fmt.Sprintf("%s: behavior %s, close %s (accepted: %s)", id, r.Behavior, r.BehaviorClose, want))
		}
	}
	t.Logf("outcomes: %v", counts)
	sort.Strings(bad)
	for _, b := range bad {
		t.Error(b)
	}
}

// startEcho serves /echo on the gateway's engine settings.
func startEcho(t *testing.T) string {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Limits.MaxFrameBytes = 20 << 20 // case 9.x sends 16 MiB messages
	cfg.OutboundQueueBytes = 64 << 20
	cfg.MaxConnections = 1000
	u := websocket.NewUpgrader()
	configureUpgrader(u, cfg)
	u.CheckOrigin = func(*http.Request) bool { return true }
	u.OnMessage(func(c *websocket.Conn, mt websocket.MessageType, data []byte) {
		_ = c.WriteMessage(mt, data)
	})
	mux := http.NewServeMux()
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		_, _ = u.Upgrade(w, r, nil)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	engine := nbhttp.NewEngine(EngineConfig(cfg, ln, mux))
	if err := engine.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(engine.Stop)
	return ln.Addr().String()
}

type caseResult struct {
	Behavior      string `json:"behavior"`
	BehaviorClose string `json:"behaviorClose"`
}

// readReport reads the Autobahn-format index.json kosoku wrote under dir.
func readReport(t *testing.T, dir string) map[string]caseResult {
	t.Helper()
	var path string
	_ = filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Name() == "index.json" {
			path = p
		}
		return nil
	})
	if path == "" {
		t.Fatalf("no index.json under %s", dir)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var byAgent map[string]map[string]caseResult
	if err := json.Unmarshal(data, &byAgent); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	out := map[string]caseResult{}
	for _, cases := range byAgent {
		for id, r := range cases {
			out[id] = r
		}
	}
	return out
}

func saveReport(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		if info.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, data, 0o644)
	})
	if err != nil {
		t.Errorf("saving the report: %v", err)
	}
}

// accepted is the list of outcomes other than OK that a case may end with,
// each argued in the file; every other case must be OK.
type accepted map[string]string

func (a accepted) outcome(id string) string {
	if o, ok := a[id]; ok {
		return o
	}
	for pat, o := range a {
		if ok, _ := filepath.Match(pat, id); ok {
			return o
		}
	}
	return "OK"
}

func readAccepted(t *testing.T, path string) accepted {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a := accepted{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 {
			t.Fatalf("%s: %q: want <case glob> <outcome>", path, line)
		}
		a[fields[0]] = fields[1]
	}
	return a
}
