// Package settings turns a package's Config struct into the server's
// settings: each exported field with a `yaml` tag and a `help` tag is one
// setting, whose YAML key is the dotted path of yaml tags, whose
// environment variable is PARLEY_ + the path in upper snake case, whose
// flag is the path with dashes for underscores, and whose default is the
// value the field holds in the struct the package's DefaultConfig returns.
// A field tagged `yaml:"-"` is not a setting (it is filled by the program).
// A slice field without a help tag (a list, such as webhooks.endpoints) is
// set in the YAML file only: it is not a setting with a variable or flag.
// A struct field without a help tag is a section: its fields are settings
// under its key.
//
// So a package declares a setting once, on its Config field:
//
//	IdleTimeout time.Duration `yaml:"idle_timeout" help:"close a connection silent for this long"`
//
// and validates it in its Config.Validate, which reports problems by key
// (Problems) so that the server names the full path of a bad setting.
//
// Supported field types: string, bool, int, int64, float64, time.Duration.
//
// Concurrency: Fields returns values that write into the struct given;
// nothing here keeps state.
package settings

import (
	"errors"
	"flag"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// EnvPrefix starts every environment variable of a setting.
const EnvPrefix = "PARLEY_"

// Field is one setting of a struct.
type Field struct {
	Path  string     // YAML key, dotted: gateway.idle_timeout
	Help  string     // one line of help
	Value flag.Value // reads and writes the field in the struct given to Fields
}

// Env is the setting's environment variable: PARLEY_GATEWAY_IDLE_TIMEOUT.
func (f Field) Env() string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(f.Path, ".", "_"))
}

// Flag is the setting's flag name without dashes: gateway.idle-timeout.
func (f Field) Flag() string { return strings.ReplaceAll(f.Path, "_", "-") }

// Kind names the value type: string, int, number, bool or duration.
func (f Field) Kind() string {
	switch f.Value.(type) {
	case strVal:
		return "string"
	case intVal, int64Val:
		return "int"
	case floatVal:
		return "number"
	case durVal:
		return "duration"
	case boolVal:
		return "bool"
	}
	return ""
}

var durationType = reflect.TypeOf(time.Duration(0))

// Fields lists the settings of the struct ptr points to, in declaration
// order. It panics on a field with a yaml tag but no help tag whose type
// is not a struct, or of an unsupported type: both are programming errors
// that the tests of every package using settings catch.
func Fields(ptr any) []Field {
	v := reflect.ValueOf(ptr)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		panic(fmt.Sprintf("settings: Fields wants a pointer to a struct, got %T", ptr))
	}
	var out []Field
	walk(v.Elem(), "", &out)
	return out
}

// Lists returns the paths of the list fields of the struct ptr points to
// (slices without a help tag): set in the YAML file only, so that help can
// name them next to the settings.
func Lists(ptr any) []string {
	var out []string
	var walkLists func(t reflect.Type, prefix string)
	walkLists = func(t reflect.Type, prefix string) {
		for i := 0; i < t.NumField(); i++ {
			sf := t.Field(i)
			key, _, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
			if !sf.IsExported() || key == "-" || key == "" {
				continue
			}
			if _, hasHelp := sf.Tag.Lookup("help"); hasHelp {
				continue
			}
			switch {
			case sf.Type.Kind() == reflect.Slice:
				out = append(out, prefix+key)
			case sf.Type.Kind() == reflect.Struct && sf.Type != durationType:
				walkLists(sf.Type, prefix+key+".")
			}
		}
	}
	walkLists(reflect.TypeOf(ptr).Elem(), "")
	return out
}

func walk(v reflect.Value, prefix string, out *[]Field) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		key, _, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
		if key == "-" || key == "" {
			continue
		}
		path := key
		if prefix != "" {
			path = prefix + "." + key
		}
		help, hasHelp := sf.Tag.Lookup("help")
		fv := v.Field(i)
		if !hasHelp && sf.Type.Kind() == reflect.Slice {
			continue // a list: in the file only
		}
		if !hasHelp {
			if sf.Type.Kind() != reflect.Struct || sf.Type == durationType {
				panic(fmt.Sprintf("settings: %s (%s.%s) has a yaml tag but no help tag", path, t, sf.Name))
			}
			walk(fv, path, out)
			continue
		}
		*out = append(*out, Field{Path: path, Help: help, Value: value(fv, path)})
	}
}

func value(fv reflect.Value, path string) flag.Value {
	p := fv.Addr().Interface()
	switch p := p.(type) {
	case *string:
		return strVal{p}
	case *bool:
		return boolVal{p}
	case *int:
		return intVal{p}
	case *int64:
		return int64Val{p}
	case *float64:
		return floatVal{p}
	case *time.Duration:
		return durVal{p}
	}
	panic(fmt.Sprintf("settings: %s has unsupported type %s", path, fv.Type()))
}

// Problem is one bad setting.
type Problem struct {
	Key string // the setting's path relative to the Config validated
	Msg string
}

// Problems collects every bad setting of a Config, so that one run shows
// all that needs fixing. The zero value is ready to use.
type Problems []Problem

// Add records a problem with key.
func (p *Problems) Add(key, format string, args ...any) {
	*p = append(*p, Problem{Key: key, Msg: fmt.Sprintf(format, args...)})
}

// Check records a problem with key unless ok.
func (p *Problems) Check(ok bool, key, format string, args ...any) {
	if !ok {
		p.Add(key, format, args...)
	}
}

// Merge adds the problems of err, an error a nested Config's Validate
// returned, with prefix before their keys; any other error becomes one
// problem of key prefix.
func (p *Problems) Merge(prefix string, err error) {
	if err == nil {
		return
	}
	var e *Error
	if !errors.As(err, &e) {
		p.Add(prefix, "%v", err)
		return
	}
	for _, q := range e.Problems {
		if prefix != "" {
			q.Key = prefix + "." + q.Key
		}
		*p = append(*p, q)
	}
}

// Err returns nil without problems, else an *Error holding them.
func (p Problems) Err(component string) error {
	if len(p) == 0 {
		return nil
	}
	return &Error{Component: component, Problems: p}
}

// Error lists the problems of a Config.
type Error struct {
	Component string // the package that validated, for the message
	Problems  Problems
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Component)
	b.WriteString(": ")
	for i, q := range e.Problems {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(q.Key)
		b.WriteString(": ")
		b.WriteString(q.Msg)
	}
	return b.String()
}

// The flag.Value adapters. flag calls String on zero values, hence the nil
// checks.

type strVal struct{ p *string }

func (v strVal) Set(s string) error { *v.p = s; return nil }
func (v strVal) String() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}

type intVal struct{ p *int }

func (v intVal) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return errors.New("not an integer")
	}
	*v.p = n
	return nil
}

func (v intVal) String() string {
	if v.p == nil {
		return "0"
	}
	return strconv.Itoa(*v.p)
}

type int64Val struct{ p *int64 }

func (v int64Val) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return errors.New("not an integer")
	}
	*v.p = n
	return nil
}

func (v int64Val) String() string {
	if v.p == nil {
		return "0"
	}
	return strconv.FormatInt(*v.p, 10)
}

type floatVal struct{ p *float64 }

func (v floatVal) Set(s string) error {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return errors.New("not a number")
	}
	*v.p = f
	return nil
}

func (v floatVal) String() string {
	if v.p == nil {
		return "0"
	}
	return strconv.FormatFloat(*v.p, 'g', -1, 64)
}

type boolVal struct{ p *bool }

func (v boolVal) Set(s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return errors.New("not a boolean")
	}
	*v.p = b
	return nil
}

func (v boolVal) String() string {
	if v.p == nil {
		return "false"
	}
	return strconv.FormatBool(*v.p)
}

// IsBoolFlag lets --metrics.enabled stand for --metrics.enabled=true.
func (v boolVal) IsBoolFlag() bool { return true }

type durVal struct{ p *time.Duration }

func (v durVal) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("not a duration like 25s: %w", err)
	}
	*v.p = d
	return nil
}

func (v durVal) String() string {
	if v.p == nil {
		return "0s"
	}
	return v.p.String()
}
