package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/internal/buildinfo"
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/server"
)

func captureStdout(t *testing.T) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	old := stdout
	stdout = &b
	t.Cleanup(func() { stdout = old })
	return &b
}

// TestHelpListsEverySetting: serve prints, for -h and --help, every
// setting with its YAML key, variable, flag and default; migrate and token
// print only the settings they read (a page, not serve's hundred tuning
// knobs) and say the others are accepted; all end with flag.ErrHelp (exit
// status 0).
func TestHelpListsEverySetting(t *testing.T) {
	var c config.Config
	fields := config.Fields(&c)
	for cmd, uses := range map[string][]string{"serve": nil, "migrate": migrateSettings, "token": tokenSettings} {
		keep := map[string]bool{}
		for _, u := range uses {
			keep[u] = true
		}
		for _, h := range []string{"-h", "--help"} {
			out := captureStdout(t)
			err := run(context.Background(), []string{cmd, h})
			if !errors.Is(err, flag.ErrHelp) {
				t.Fatalf("%s %s: err %v, want flag.ErrHelp", cmd, h, err)
			}
			listed := 0
			for _, f := range fields {
				line := strings.Contains(out.String(), "  "+f.Path+" ("+f.Kind()+", default ") && strings.Contains(out.String(), f.Env()+"  --"+f.Flag())
				want := uses == nil || keep[f.Path]
				if line {
					listed++
				}
				if line != want {
					t.Errorf("%s %s: line for %s: %v, want %v", cmd, h, f.Path, line, want)
				}
			}
			if uses != nil {
				if listed != len(uses) {
					t.Errorf("%s %s: %d settings listed, want %d (a name in its list is no setting?)", cmd, h, listed, len(uses))
				}
				// A command's own settings only: serve's whole list is
				// over 300 lines; migrate, which reads the most, about 70.
				if n := strings.Count(out.String(), "\n"); n > 80 {
					t.Errorf("%s %s: %d lines of help, want at most 80:\n%s", cmd, h, n, out)
				}
				if !strings.Contains(out.String(), "parley serve -h") {
					t.Errorf("%s %s: does not say where the other settings are listed:\n%s", cmd, h, out)
				}
			}
			if !strings.Contains(out.String(), "usage: parley "+cmd) {
				t.Errorf("%s %s: no usage line:\n%s", cmd, h, out)
			}
		}
	}
}

// TestVersion: `parley version` prints what parley_build_info exports.
func TestVersion(t *testing.T) {
	out := captureStdout(t)
	if err := run(context.Background(), []string{"version"}); err != nil {
		t.Fatal(err)
	}
	bi := buildinfo.Get()
	if want := "parley " + bi.Version + " (commit " + bi.Commit + ", " + bi.Go + ")\n"; out.String() != want {
		t.Fatalf("version printed %q, want %q", out.String(), want)
	}
}

// TestTokenUsesTheServersKey: `parley token` signs with the key the server
// would use, found through PARLEY_DATA_DIR, --data-dir or --config, and
// never creates a development key of its own.
func TestTokenUsesTheServersKey(t *testing.T) {
	dataDir := t.TempDir()
	key, err := auth.LoadOrCreateDevKey(dataDir) // what `parley serve` did
	if err != nil {
		t.Fatal(err)
	}
	verifier, err := auth.NewVerifier(auth.Config{HS256Key: key})
	if err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(t.TempDir(), "parley.yaml")
	if err := os.WriteFile(cfgFile, []byte("data_dir: "+dataDir+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir()) // another directory, with no ./data
	for name, tc := range map[string]struct {
		args []string
		env  string
	}{
		"env":    {nil, dataDir},
		"flag":   {[]string{"--data-dir", dataDir}, ""},
		"config": {[]string{"--config", cfgFile}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("PARLEY_DATA_DIR", tc.env)
			}
			var out bytes.Buffer
			if err := runToken(append([]string{"-user", "alice", "-device", "d1"}, tc.args...), &out); err != nil {
				t.Fatal(err)
			}
			id, err := verifier.Verify(strings.TrimSpace(out.String()), time.Now())
			if err != nil || id.User != "alice" || id.Device != "d1" {
				t.Fatalf("token verifies as %+v, %v", id, err)
			}
		})
	}
	t.Run("no key", func(t *testing.T) {
		var out bytes.Buffer
		err := runToken([]string{"-user", "alice"}, &out)
		if err == nil || !strings.Contains(err.Error(), "no development key") {
			t.Fatalf("err = %v, want no development key", err)
		}
		if _, err := os.Stat("data"); !os.IsNotExist(err) {
			t.Fatalf("token created ./data: %v", err)
		}
	})
}

// TestJSONLogDurations: durations in JSON logs are Go duration strings.
func TestJSONLogDurations(t *testing.T) {
	var b bytes.Buffer
	log := newLogger(config.Log{Level: "info", Format: config.LogJSON}, &b)
	log.Info("x", "timeout", 1500*time.Millisecond)
	var rec map[string]any
	if err := json.Unmarshal(b.Bytes(), &rec); err != nil {
		t.Fatal(err)
	}
	if rec["timeout"] != "1.5s" {
		t.Fatalf("timeout logged as %#v, want \"1.5s\"", rec["timeout"])
	}
}

// TestServeConfigReachesServer: the configuration serve loads is what the
// server runs with — metrics.enabled off leaves /metrics unserved.
func TestServeConfigReachesServer(t *testing.T) {
	dir := t.TempDir()
	cfg, err := config.Load([]string{"--listen", "127.0.0.1:0", "--data-dir", dir, "--node-id", "n1", "--node-number", "7",
		"--metrics.enabled=false", "--gateway.request-timeout", "3s", "--presence.flush", "250ms", "--chat.history-default", "20"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.Start(context.Background(), cfg, server.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	for path, want := range map[string]int{"/metrics": http.StatusNotFound, "/healthz": http.StatusOK} {
		resp, err := http.Get("http://" + srv.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s: status %d, want %d", path, resp.StatusCode, want)
		}
	}
}

// TestStartedLine: only a node with the gateway role announces a ws:// URL,
// and the web page's URL when it serves the page.
func TestStartedLine(t *testing.T) {
	cfg := config.Default()
	if got := startedLine(cfg, "127.0.0.1:7480"); !strings.HasPrefix(got, "parley: serving on ws://127.0.0.1:7480/v1/ws") {
		t.Errorf("all roles: %q", got)
	}
	if got := startedLine(cfg, "127.0.0.1:7480"); cfg.Web.Page != strings.Contains(got, "web chat page on http://127.0.0.1:7480/") {
		t.Errorf("all roles, page %v: %q", cfg.Web.Page, got)
	}
	if !cfg.Web.Page {
		t.Error("the default node serves no web page")
	}
	cfg.Web.Page = false
	if got := startedLine(cfg, "127.0.0.1:7480"); strings.Contains(got, "http://") {
		t.Errorf("page off: %q", got)
	}
	cfg.Web.Page = true
	cfg.Roles = config.RoleChat
	if got := startedLine(cfg, "127.0.0.1:7481"); strings.Contains(got, "ws://") || !strings.Contains(got, "http://127.0.0.1:7481/healthz") {
		t.Errorf("chat only: %q", got)
	}
	cfg.Roles = config.RoleGateway
	if got := startedLine(cfg, "127.0.0.1:7482"); !strings.Contains(got, "ws://127.0.0.1:7482/v1/ws") {
		t.Errorf("gateway only: %q", got)
	}
	cfg.Roles = config.RoleAll
	cfg.TLS.CertFile, cfg.TLS.KeyFile = "cert.pem", "key.pem"
	if got := startedLine(cfg, "127.0.0.1:7483"); !strings.Contains(got, "wss://127.0.0.1:7483/v1/ws") || !strings.Contains(got, "page on https://127.0.0.1:7483/") {
		t.Errorf("tls: %q", got)
	}
}
