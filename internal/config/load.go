package config

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/parley-im/parley/internal/settings"
)

// EnvPrefix starts every environment variable Load reads.
const EnvPrefix = settings.EnvPrefix

// EnvConfigFile names the YAML file when --config is not given.
const EnvConfigFile = EnvPrefix + "CONFIG"

// Fields lists every setting of c, in the order of the Config structs;
// each Value writes into c.
func Fields(c *Config) []settings.Field { return settings.Fields(c) }

// NewFlagSet returns an empty flag set for a command that reads the
// configuration; define the command's own flags on it, then call Parse.
func NewFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // Parse returns errors; Usage prints help.
	fs.Usage = func() {}
	return fs
}

// Load resolves the configuration of `parley serve` from args and env (see
// Parse); it takes no flags besides the settings and --config.
func Load(args, env []string) (Config, error) {
	return Parse(NewFlagSet("parley serve"), args, env)
}

// Parse resolves the configuration from, in increasing precedence, the
// defaults, the YAML file named by --config or PARLEY_CONFIG, PARLEY_*
// variables in env (KEY=VALUE; a later entry wins over an earlier one) and
// the setting flags in args. fs may define a command's own flags, which it
// parses from args too. An empty node_id is then derived from the host name
// and the final listen port. The result is validated.
//
// Unknown YAML keys and unknown flags are errors. Unknown PARLEY_* variables
// are ignored, since other tools (the test harness) share the prefix.
// errors.Is(err, flag.ErrHelp) after -h or --help; print Usage then.
func Parse(fs *flag.FlagSet, args, env []string) (Config, error) {
	return parse(fs, args, env, false)
}

// ParseUnchecked is Parse without Validate, for a command that uses only
// part of the configuration and checks that part itself (`parley
// migrate`: ValidateMigrate).
func ParseUnchecked(fs *flag.FlagSet, args, env []string) (Config, error) {
	return parse(fs, args, env, true)
}

func parse(fs *flag.FlagSet, args, env []string, unchecked bool) (Config, error) {
	// The flags are parsed once, into a recorder; they are applied after
	// the file and the environment, in the order given.
	probe := defaults()
	var given []setFlag
	file := fs.String("config", "", "YAML configuration file (or "+EnvConfigFile+")")
	for i, f := range Fields(&probe) {
		fs.Var(recorder{f: f, i: i, given: &given}, f.Flag(), f.Help)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return Config{}, err
		}
		return Config{}, fmt.Errorf("config: %w", err)
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("config: unexpected argument %q", fs.Arg(0))
	}
	vars := envMap(env)
	path := *file
	if path == "" {
		path = vars[EnvConfigFile]
	}

	c := defaults()
	if path != "" {
		if err := loadFile(path, &c); err != nil {
			return Config{}, err
		}
	}
	fields := Fields(&c)
	for _, f := range fields {
		name := f.Env()
		v, ok := vars[name]
		if !ok {
			continue
		}
		if err := f.Value.Set(v); err != nil {
			return Config{}, fmt.Errorf("config: %s=%q: %w", name, v, err)
		}
	}
	for _, g := range given {
		if err := fields[g.i].Value.Set(g.v); err != nil { // checked by the recorder already
			return Config{}, fmt.Errorf("config: --%s: %w", fields[g.i].Flag(), err)
		}
	}
	if c.NodeID == "" {
		c.NodeID = DeriveNodeID(hostname(), c.Listen)
	}
	if !unchecked {
		if err := c.Validate(); err != nil {
			return Config{}, err
		}
	}
	return c, nil
}

// setFlag is one setting flag as given on the command line.
type setFlag struct {
	i int // index in Fields
	v string
}

// recorder is a setting's flag: it checks the value on a scratch Config
// (so a bad value fails as a flag error) and records it for Parse.
type recorder struct {
	f     settings.Field
	i     int
	given *[]setFlag
}

func (r recorder) String() string {
	if r.f.Value == nil {
		return ""
	}
	return r.f.Value.String()
}

func (r recorder) Set(s string) error {
	if err := r.f.Value.Set(s); err != nil {
		return err
	}
	*r.given = append(*r.given, setFlag{r.i, s})
	return nil
}

func (r recorder) IsBoolFlag() bool { return r.f.Kind() == "bool" }

// Usage writes the help of a command that reads the configuration: its
// usage line, its own flags (those fs defines before Parse adds the
// settings; pass nil for none) and every setting with its YAML key,
// environment variable, flag and default.
func Usage(w io.Writer, usageLine string, fs *flag.FlagSet) {
	UsageOf(w, usageLine, fs, nil)
}

// UsageOf is Usage for a command that reads only some settings: it lists
// those whose path is in uses (every one when uses is nil) and says that
// the others are accepted too, so that one --config file serves every
// command.
func UsageOf(w io.Writer, usageLine string, fs *flag.FlagSet, uses []string) {
	fmt.Fprintf(w, "usage: %s\n", usageLine)
	if fs != nil {
		own := flag.NewFlagSet("", flag.ContinueOnError)
		settingFlags := map[string]bool{"config": true}
		probe := defaults()
		for _, f := range Fields(&probe) {
			settingFlags[f.Flag()] = true
		}
		fs.VisitAll(func(f *flag.Flag) {
			if !settingFlags[f.Name] {
				own.Var(f.Value, f.Name, f.Usage)
			}
		})
		n := 0
		own.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprintln(w, "\nFlags:")
			own.SetOutput(w)
			own.PrintDefaults()
		}
	}
	fmt.Fprintf(w, `
Settings: each has a YAML key (in the file given by --config FILE or
%s), an environment variable and a flag. Flags beat variables,
which beat the file, which beats the defaults. Durations are Go durations
(500ms, 25s, 1h30m). docs/parley.example.yaml lists them all as a file.

`, EnvConfigFile)
	if uses != nil {
		fmt.Fprint(w, "This command reads the settings below; it accepts every other setting of\n`parley serve` too (`parley serve -h` lists them), so one file serves both.\n\n")
	}
	keep := make(map[string]bool, len(uses))
	for _, u := range uses {
		keep[u] = true
	}
	c := defaults()
	for _, f := range Fields(&c) {
		if uses != nil && !keep[f.Path] {
			continue
		}
		def := f.Value.String()
		if f.Kind() == "string" {
			def = fmt.Sprintf("%q", def)
		}
		if f.Path == "node_id" {
			def = `"" (host name and listen port)`
		}
		fmt.Fprintf(w, "  %s (%s, default %s)\n      %s\n      %s  --%s\n", f.Path, f.Kind(), def, f.Help, f.Env(), f.Flag())
	}
	if lists := settings.Lists(&c); len(lists) > 0 && uses == nil {
		fmt.Fprintf(w, "\nLists, set in the --config file only (docs/ describes each): %s\n", strings.Join(lists, ", "))
	}
}

func loadFile(path string, c *Config) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	// A misspelt key would otherwise silently leave its default in force.
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config: %s: %w", path, err)
	}
	return nil
}

func envMap(env []string) map[string]string {
	m := make(map[string]string)
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if ok && strings.HasPrefix(k, EnvPrefix) {
			m[k] = v
		}
	}
	return m
}
