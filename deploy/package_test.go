package deploy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/parley-im/parley/internal/config"
)

// The packaging checks: the container image (Dockerfile) built with
// podman and run with buildah, the Helm chart rendered with helm and
// validated against the Kubernetes schemas, and the compose file checked
// with podman-compose. Each tool is found on PATH or where .ci/run
// installs it (under /tmp); without it a test skips, and under CI=true,
// where .ci/run installs it, it fails. Every check also loads each
// process's environment and arguments into Parley's configuration, so a
// misspelt PARLEY_* variable or an invalid value fails here.

// tool finds a packaging tool: $env, then PATH, then the places given.
func tool(t *testing.T, env, name string, places ...string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		return p
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, p := range places {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI requires %s (.ci/run installs it; or set %s)", name, env)
	}
	t.Skipf("%s not found (set %s; .ci/run says how it is installed)", name, env)
	return ""
}

func run(t *testing.T, dir string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s\n%s", name, strings.Join(args, " "), err, errb.String(), out.String())
	}
	return out.String()
}

// knownEnv is every PARLEY_* variable a setting reads.
func knownEnv() map[string]bool {
	c := config.Default()
	m := map[string]bool{}
	for _, f := range config.Fields(&c) {
		m[f.Env()] = true
	}
	return m
}

// checkProcess loads a process's arguments (after the command) and its
// environment as `parley serve` or `parley migrate` would.
func checkProcess(t *testing.T, what string, args []string, env map[string]string) config.Config {
	t.Helper()
	known := knownEnv()
	var list []string
	for k, v := range env {
		if strings.HasPrefix(k, "PARLEY_") && !known[k] {
			t.Errorf("%s: %s is no Parley setting", what, k)
		}
		list = append(list, k+"="+v)
	}
	if len(args) == 0 {
		t.Fatalf("%s: no command", what)
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve":
		c, err := config.Load(rest, list)
		if err != nil {
			t.Fatalf("%s: parley serve %v: %v", what, rest, err)
		}
		if !c.Cluster.Enabled() {
			t.Errorf("%s: not in cluster mode", what)
		}
		return c
	case "migrate":
		c, err := config.ParseUnchecked(config.NewFlagSet("migrate"), rest, list)
		if err == nil {
			err = c.ValidateMigrate()
		}
		if err != nil {
			t.Fatalf("%s: parley migrate %v: %v", what, rest, err)
		}
		return c
	}
	t.Fatalf("%s: unexpected command %q", what, cmd)
	return config.Config{}
}

const (
	containersRoot = "/tmp/parley-containers"
	deployVenv     = "/tmp/parley-deploy-venv/bin/"
)

// TestContainerImage builds the Dockerfile with podman (rootful, vfs
// storage under /tmp, chroot isolation) and runs `parley version` and
// `parley keygen` in the image with buildah run (podman run's OCI runtime
// cannot set rlimits in this sandbox). The build stage's image is made
// here from an empty base, busybox and this machine's Go release mounted
// read-only (no registry holds images here); the final stage is the
// Dockerfile's own.
func TestContainerImage(t *testing.T) {
	if testing.Short() {
		t.Skip("short: builds an image")
	}
	podman := tool(t, "PARLEY_PODMAN", "podman")
	buildah := tool(t, "PARLEY_BUILDAH", "buildah")
	busybox := tool(t, "PARLEY_BUSYBOX", "busybox", "/bin/busybox")
	if out, _ := exec.Command("file", "-L", busybox).Output(); len(out) > 0 && !bytes.Contains(out, []byte("statically linked")) {
		t.Fatalf("%s is not static (apt-get install busybox-static): %s", busybox, out)
	}
	goroot := runtime.GOROOT()
	if out, err := exec.Command("go", "env", "GOROOT").Output(); err == nil {
		goroot = strings.TrimSpace(string(out))
	}
	modcache := strings.TrimSpace(run(t, ".", "go", "env", "GOMODCACHE"))
	run(t, "..", "go", "mod", "download") // the build reads the module cache only
	store := []string{"--root", containersRoot + "/root", "--runroot", containersRoot + "/run", "--storage-driver", "vfs"}
	bah := func(args ...string) string { return run(t, "..", buildah, append(slices.Clone(store), args...)...) }
	pod := func(args ...string) string { return run(t, "..", podman, append(slices.Clone(store), args...)...) }

	// The build stage's image: busybox for the shell, CA certificates, Go
	// mounted at build time.
	ctr := strings.TrimSpace(bah("from", "scratch"))
	defer bah("rm", ctr)
	bah("copy", ctr, busybox, "/bin/busybox")
	bah("copy", ctr, "/etc/ssl/certs/ca-certificates.crt", "/etc/ssl/certs/ca-certificates.crt")
	bah("run", "--isolation", "chroot", ctr, "/bin/busybox", "sh", "-c", "/bin/busybox --install -s /bin && mkdir -p -m 1777 /tmp && mkdir -p /usr/local/go /go/pkg/mod")
	bah("config", "--env", "PATH=/usr/local/go/bin:/bin", "--env", "HOME=/root", "--env", "GOPATH=/go",
		"--env", "GOCACHE=/root/.cache/go-build", "--env", "GOPROXY=off", "--env", "GOFLAGS=-mod=mod", ctr)
	bah("commit", "-q", ctr, "localhost/parley-go-build")

	gocache := filepath.Join(containersRoot, "gocache")
	if err := os.MkdirAll(gocache, 0o755); err != nil {
		t.Fatal(err)
	}
	pod("build", "--isolation", "chroot", "--build-arg", "GO_IMAGE=localhost/parley-go-build",
		"--build-arg", "VERSION=v0.0.0-imagetest", "--build-arg", "COMMIT=imagetest",
		"-v", goroot+":/usr/local/go:ro", "-v", modcache+":/go/pkg/mod:ro", "-v", gocache+":/root/.cache/go-build",
		"-t", "localhost/parley:imagetest", ".")

	img := strings.TrimSpace(bah("from", "localhost/parley:imagetest"))
	defer bah("rm", img)
	cfg := bah("inspect", "--format", "{{.OCIv1.Config.User}}|{{range $k, $v := .OCIv1.Config.Volumes}}{{$k}}{{end}}|{{.OCIv1.Config.Entrypoint}}|{{.OCIv1.Config.Cmd}}", img)
	if want := "65532:65532|/data|[/usr/local/bin/parley]|[serve]"; strings.TrimSpace(cfg) != want {
		t.Errorf("image config %q, want %q", strings.TrimSpace(cfg), want)
	}
	v := bah("run", "--isolation", "chroot", "--user", "65532:65532", img, "--", "/usr/local/bin/parley", "version")
	if !regexp.MustCompile(`^parley v0\.0\.0-imagetest \(commit imagetest, go1\.[0-9.]+\)\n$`).MatchString(v) {
		t.Errorf("parley version in the image: %q", v)
	}
	// The data volume is the non-root user's: a key written there.
	k := bah("run", "--isolation", "chroot", "--user", "65532:65532", img, "--", "/usr/local/bin/parley", "keygen", "-type", "hs256", "-out", "/data/k")
	if !strings.Contains(k, "/data/k") {
		t.Errorf("keygen in the image: %q", k)
	}
}

// renderChart runs helm template with values given as --set pairs.
func renderChart(t *testing.T, helm string, set ...string) []map[string]any {
	t.Helper()
	args := []string{"template", "parley", "helm/parley", "--namespace", "chat"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out := run(t, ".", helm, args...)
	f, err := os.CreateTemp(t.TempDir(), "chart-*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(out)
	f.Close()
	kv := tool(t, "PARLEY_KUBERNETES_VALIDATE", "kubernetes-validate", deployVenv+"kubernetes-validate")
	res := run(t, ".", kv, "--strict", "--kubernetes-version", "1.33.0", f.Name())
	if strings.Contains(res, "ERROR") || strings.Contains(res, "WARN") {
		t.Fatalf("kubernetes-validate: %s", res)
	}
	var docs []map[string]any
	dec := yaml.NewDecoder(strings.NewReader(out))
	for {
		var d map[string]any
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if d != nil {
			docs = append(docs, d)
		}
	}
	return docs
}

func dig(m any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			mm, _ := m.(map[string]any)
			m = mm[k]
		case int:
			s, _ := m.([]any)
			if k >= len(s) {
				return nil
			}
			m = s[k]
		}
	}
	return m
}

// podProcess returns the first container's arguments and environment
// (a value taken from a Secret or the pod becomes a placeholder).
func podProcess(t *testing.T, pod any) ([]string, map[string]string) {
	c := dig(pod, "containers", 0)
	var args []string
	for _, a := range dig(c, "args").([]any) {
		args = append(args, a.(string))
	}
	env := map[string]string{}
	for _, e := range dig(c, "env").([]any) {
		name := dig(e, "name").(string)
		switch v := dig(e, "value").(type) {
		case string:
			env[name] = v
		default:
			if dig(e, "valueFrom") == nil {
				t.Fatalf("%s has neither value nor valueFrom", name)
			}
			env[name] = "from-secret"
		}
	}
	return args, env
}

// TestHelmChart renders deploy/helm/parley with helm template (defaults,
// and with the ingress and an HS256 key), validates every object against
// the Kubernetes schemas with kubernetes-validate --strict (a bundled copy
// of the schemas kubeconform uses, offline), lints the chart, and loads
// each process's arguments and environment into Parley's configuration.
func TestHelmChart(t *testing.T) {
	helm := tool(t, "PARLEY_HELM", "helm", "/tmp/parley-tools/helm")
	run(t, ".", helm, "lint", "--strict", "helm/parley")
	for _, tc := range []struct {
		name  string
		set   []string
		kinds []string
	}{
		{"defaults", nil, []string{"Deployment", "Deployment", "Job", "PodDisruptionBudget", "PodDisruptionBudget", "Service"}},
		{"ingress-hs256", []string{"ingress.enabled=true", "ingress.tlsSecret=tls", "auth.type=hs256", "env.PARLEY_LOG_FORMAT=json", "chat.replicas=3"},
			[]string{"Deployment", "Deployment", "Ingress", "Job", "PodDisruptionBudget", "PodDisruptionBudget", "Service"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			docs := renderChart(t, helm, tc.set...)
			var kinds []string
			roles := map[string]bool{}
			for _, d := range docs {
				kind := d["kind"].(string)
				kinds = append(kinds, kind)
				if kind != "Deployment" && kind != "Job" {
					continue
				}
				spec := dig(d, "spec", "template", "spec")
				if dig(spec, "securityContext", "runAsNonRoot") != true {
					t.Errorf("%s %v runs as root", kind, dig(d, "metadata", "name"))
				}
				args, env := podProcess(t, spec)
				if kind == "Deployment" {
					env["PARLEY_NODE_ID"] = "pod-1" // the pod's name
				}
				c := checkProcess(t, kind, args, env)
				if kind == "Deployment" {
					for r := range c.RoleSet() {
						roles[r] = true
					}
					if tc.name == "ingress-hs256" && c.Auth.HS256KeyFile == "" {
						t.Errorf("auth.type hs256: no hs256 key file")
					}
				}
			}
			slices.Sort(kinds)
			if !slices.Equal(kinds, tc.kinds) {
				t.Errorf("kinds %v, want %v", kinds, tc.kinds)
			}
			if !roles["chat"] || !roles["gateway"] {
				t.Errorf("roles %v, want chat and gateway", roles)
			}
		})
	}
}

// TestComposeFile checks deploy/compose/compose.yaml with podman-compose
// config (the file's interpolation and structure, as compose reads it),
// then loads each Parley service's command and environment into Parley's
// configuration and checks that every dependency names a service.
func TestComposeFile(t *testing.T) {
	pc := tool(t, "PARLEY_PODMAN_COMPOSE", "podman-compose", deployVenv+"podman-compose")
	if _, err := exec.LookPath("podman"); err != nil {
		tool(t, "PARLEY_PODMAN", "podman") // podman-compose needs podman on PATH
	}
	cmd := exec.Command(pc, "-f", "compose/compose.yaml", "config")
	cmd.Env = append(os.Environ(), "PARLEY_HS256_KEY="+strings.Repeat("ab", 32), "PARLEY_S3_SECRET=s3secret")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("podman-compose config: %v\n%s", err, errb.String())
	}
	var f struct {
		Services map[string]struct {
			Image       string
			Command     []string
			Environment map[string]string
			DependsOn   map[string]any `yaml:"depends_on"`
		}
	}
	if err := yaml.Unmarshal(out.Bytes(), &f); err != nil {
		t.Fatalf("podman-compose config output: %v\n%s", err, out.String())
	}
	want := []string{"cassandra", "chat-1", "chat-2", "gateway", "migrate", "nats", "redis", "seaweedfs"}
	var got []string
	for name, s := range f.Services {
		got = append(got, name)
		for dep := range s.DependsOn {
			if _, ok := f.Services[dep]; !ok {
				t.Errorf("%s depends on %s, no service", name, dep)
			}
		}
		if !strings.Contains(s.Image, "parley") {
			continue
		}
		c := checkProcess(t, name, s.Command, s.Environment)
		if c.Auth.HS256Key != strings.Repeat("ab", 32) {
			t.Errorf("%s: the token key is not the one given", name)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("services %v, want %v", got, want)
	}

	// Without the key, compose refuses the file (no service starts with a
	// development key of its own).
	cmd = exec.Command(pc, "-f", "compose/compose.yaml", "config")
	cmd.Env = slices.DeleteFunc(os.Environ(), func(s string) bool { return strings.HasPrefix(s, "PARLEY_HS256_KEY=") })
	cmd.Env = append(cmd.Env, "PARLEY_S3_SECRET=s3secret")
	if b, err := cmd.CombinedOutput(); err == nil {
		t.Errorf("compose config without PARLEY_HS256_KEY passed:\n%s", b)
	}
}
