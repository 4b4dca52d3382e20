package config

import (
	"flag"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const examplePath = "../../docs/parley.example.yaml"

var update = flag.Bool("update", false, "rewrite docs/parley.example.yaml from the settings")

// exampleYAML renders every setting with its help and default as a YAML
// file, in the order of the Config structs.
func exampleYAML() string {
	var b strings.Builder
	b.WriteString(`# Parley: every setting of ` + "`parley serve`" + ` with its default.
#
# Generated from the settings' declarations (go test ./internal/config
# -run TestExampleConfig -update); TestExampleConfig checks that it lists
# every setting and that its values are the defaults. Copy it, keep what
# you change, and pass it with --config FILE (or PARLEY_CONFIG=FILE).
# Each key also has an environment variable and a flag, named after each
# comment; flags beat variables, which beat this file, which beats the
# defaults. Durations are Go durations (500ms, 25s, 1h30m).
`)
	c := defaults()
	var section []string // the open sections, outermost first
	for _, f := range Fields(&c) {
		parts := strings.Split(f.Path, ".")
		sec, key := parts[:len(parts)-1], parts[len(parts)-1]
		// Sections already open stay open; the rest are opened, each
		// one level deeper.
		same := 0
		for same < len(sec) && same < len(section) && sec[same] == section[same] {
			same++
		}
		if same < len(sec) || len(sec) < len(section) || len(sec) == 0 {
			b.WriteString("\n")
		}
		for i := same; i < len(sec); i++ {
			b.WriteString(strings.Repeat("  ", i) + sec[i] + ":\n")
		}
		section = sec
		indent := strings.Repeat("  ", len(sec))
		v := f.Value.String()
		if f.Kind() == "string" {
			v = strconv.Quote(v)
		}
		fmt.Fprintf(&b, "%s# %s (%s, --%s)\n%s%s: %s\n", indent, f.Help, f.Env(), f.Flag(), indent, key, v)
	}
	b.WriteString(`  # Webhook endpoints are a list, in this file only (docs/webhooks.md):
  # endpoints:
  #   - name: push                      # names the endpoint's queue
  #     url: https://push.internal/parley
  #     secret_file: /etc/parley/push.secret   # or secret: "..."
  #     events: [recipient.offline]     # default: every event type
  #     preview: sender                 # none (default), sender or full
  #     timeout: 5s                     # per attempt (default 5s)
  #     concurrency: 8                  # conversations at once (default 8)
`)
	return b.String()
}

// TestExampleConfig: docs/parley.example.yaml loads, names every setting
// once, and holds the defaults.
func TestExampleConfig(t *testing.T) {
	if *update {
		if err := os.WriteFile(examplePath, []byte(exampleYAML()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	body, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}
	var keys []string
	var walk func(n *yaml.Node, prefix string)
	walk = func(n *yaml.Node, prefix string) {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i].Value, n.Content[i+1]
			if v.Kind == yaml.MappingNode {
				walk(v, prefix+k+".")
				continue
			}
			keys = append(keys, prefix+k)
		}
	}
	walk(doc.Content[0], "")
	var c Config
	var want []string
	for _, f := range Fields(&c) {
		want = append(want, f.Path)
	}
	sort.Strings(keys)
	sort.Strings(want)
	if !reflect.DeepEqual(keys, want) {
		t.Fatalf("%s keys\n%v\nwant every setting once\n%v\n(regenerate: go test ./internal/config -run TestExampleConfig -update)", examplePath, keys, want)
	}
	got, err := Load([]string{"--config", examplePath}, nil)
	if err != nil {
		t.Fatal(err)
	}
	def, err := Load(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, def) {
		t.Fatalf("the example's values are not the defaults:\n%+v\n%+v", got, def)
	}
	if string(body) != exampleYAML() {
		t.Fatalf("%s differs from the settings' help or defaults; regenerate: go test ./internal/config -run TestExampleConfig -update", examplePath)
	}
}
