// Package deploy holds what runs Parley outside the binary: the systemd
// unit, the Prometheus alert rules, the Grafana dashboard and the nginx
// reverse-proxy example. Its tests
// check that the rules and the dashboard query only what a node exports,
// and run the proxy example in a real nginx in front of a node.
package deploy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"

	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/hooks"
	"github.com/parley-im/parley/internal/push"
	"github.com/parley-im/parley/internal/servertest"
)

// family is one exported metric family: its type and, per label name, the
// values seen.
type family struct {
	typ    dto.MetricType
	labels map[string]map[string]bool
}

// targetLabels are added by Prometheus to every scraped series; le is the
// bucket label of histograms.
var targetLabels = map[string]bool{"instance": true, "job": true, "le": true}

var (
	nameRE     = regexp.MustCompile(`\b((?:parley|go|process)_[a-zA-Z0-9_]+|up)\b(\{[^}]*\})?`)
	matcherRE  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	groupingRE = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	plainAlt   = regexp.MustCompile(`^[a-zA-Z0-9_]+(\|[a-zA-Z0-9_]+)*$`)
)

// checkExpr returns what expr names that the exported families lack: a
// metric, a label, or a label value in an equality or a plain alternation.
func checkExpr(expr string, fams map[string]family) []string {
	var problems []string
	labelsSeen := map[string]bool{}
	found := false
	for _, m := range nameRE.FindAllStringSubmatch(expr, -1) {
		name, sel := m[1], m[2]
		found = true
		if name == "up" { // synthesized by Prometheus per target
			continue
		}
		f, ok := fams[name]
		if !ok {
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if base, cut := strings.CutSuffix(name, suf); cut {
					if bf, ok2 := fams[base]; ok2 && (bf.typ == dto.MetricType_HISTOGRAM || bf.typ == dto.MetricType_SUMMARY) {
						f, ok = bf, true
					}
				}
			}
		}
		if !ok {
			problems = append(problems, fmt.Sprintf("metric %s is not exported", name))
			continue
		}
		for l := range f.labels {
			labelsSeen[l] = true
		}
		for _, mm := range matcherRE.FindAllStringSubmatch(sel, -1) {
			label, op, val := mm[1], mm[2], mm[3]
			if targetLabels[label] {
				continue
			}
			values, ok := f.labels[label]
			if !ok {
				problems = append(problems, fmt.Sprintf("%s has no label %s", name, label))
				continue
			}
			if strings.Contains(val, "$") || (op != "=" && op != "=~") || !plainAlt.MatchString(val) {
				continue
			}
			for _, v := range strings.Split(val, "|") {
				if !values[v] {
					problems = append(problems, fmt.Sprintf("%s{%s} has no value %q", name, label, v))
				}
			}
		}
	}
	if !found {
		problems = append(problems, "names no metric")
	}
	for _, g := range groupingRE.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" && !targetLabels[l] && !labelsSeen[l] {
				problems = append(problems, fmt.Sprintf("groups by %s, a label of none of its metrics", l))
			}
		}
	}
	return problems
}

func scrape(t *testing.T) map[string]family {
	t.Helper()
	// A webhook endpoint, so that the node exports the per-endpoint
	// webhook metrics too.
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	t.Cleanup(recv.Close)
	// A Web Push key, so that the pusher runs and exports its metrics.
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(k)
	vapid := filepath.Join(t.TempDir(), "vapid.pem")
	if err := os.WriteFile(vapid, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := servertest.Start(t, servertest.WithConfig(func(c *config.Config) {
		c.Webhooks.Endpoints = []hooks.Endpoint{{Name: "ops", URL: recv.URL, Secret: "ops-test-secret"}}
		c.Push.WebPush = push.WebPushConfig{VAPIDKeyFile: vapid, Subject: "mailto:ops@parley.example"}
	}))
	resp, err := http.Get(srv.HTTPURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	fams := map[string]family{}
	for name, mf := range mfs {
		f := family{typ: mf.GetType(), labels: map[string]map[string]bool{}}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if f.labels[l.GetName()] == nil {
					f.labels[l.GetName()] = map[string]bool{}
				}
				f.labels[l.GetName()][l.GetValue()] = true
			}
		}
		fams[name] = f
	}
	return fams
}

// dashboardExprs returns every PromQL query of the dashboard: panel
// targets and template variable queries.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("grafana/parley.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	var out []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, c := range v {
				if s, ok := c.(string); ok && (k == "expr" || k == "definition") {
					out = append(out, s)
				}
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	walk(doc)
	return out
}

func alertExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			out = append(out, r.Expr)
		}
	}
	return out
}

// TestOpsQueriesNameExportedMetrics starts a node, scrapes its /metrics
// and checks every query of the Grafana dashboard and the alert rules
// against what it exports: metric names, label names, label values.
func TestOpsQueriesNameExportedMetrics(t *testing.T) {
	fams := scrape(t)
	dash, alerts := dashboardExprs(t), alertExprs(t)
	if len(dash) < 20 || len(alerts) < 10 {
		t.Fatalf("found %d dashboard and %d alert queries; the files' structure changed?", len(dash), len(alerts))
	}
	for _, set := range []struct {
		file  string
		exprs []string
	}{{"grafana/parley.json", dash}, {"prometheus/alerts.yml", alerts}} {
		for _, e := range set.exprs {
			for _, p := range checkExpr(e, fams) {
				t.Errorf("%s: %q: %s", set.file, e, p)
			}
		}
	}
}

// TestCheckExprCatches: the checker refuses what a node does not export.
func TestCheckExprCatches(t *testing.T) {
	fams := map[string]family{
		"parley_handshakes_total": {typ: dto.MetricType_COUNTER, labels: map[string]map[string]bool{"result": {"ok": true, "full": true}}},
		"parley_send_ack_seconds": {typ: dto.MetricType_HISTOGRAM, labels: map[string]map[string]bool{}},
	}
	for expr, want := range map[string]string{
		`rate(parley_handshakes_total{result="ok"}[5m])`:                                         "",
		`sum by (result) (rate(parley_handshakes_total{result=~"ok|full", instance=~"$i"}[5m]))`: "",
		`histogram_quantile(0.9, sum by (le) (rate(parley_send_ack_seconds_bucket[5m])))`:        "",
		`up{job="parley"} == 0`:                                      "",
		`rate(parley_nonexistent_total[5m])`:                         "metric parley_nonexistent_total is not exported",
		`rate(parley_handshakes_total{reason="x"}[5m])`:              "has no label reason",
		`rate(parley_handshakes_total{result=~"ok|overloaded"}[5m])`: `has no value "overloaded"`,
		`sum by (tier) (rate(parley_handshakes_total[5m]))`:          "groups by tier",
		`parley_connections_bucket`:                                  "is not exported",
		`vector(1)`:                                                  "names no metric",
	} {
		got := strings.Join(checkExpr(expr, fams), "; ")
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("%s: problems %q, want %q", expr, got, want)
		}
	}
}
