package settings

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

type inner struct {
	Rate  float64       `yaml:"rate" help:"a rate"`
	Wait  time.Duration `yaml:"wait" help:"a wait"`
	Owned string        `yaml:"-"`
}

type outer struct {
	Items []string `yaml:"items"`
	Name  string   `yaml:"name" help:"a name"`
	On    bool     `yaml:"on" help:"a switch"`
	N     int      `yaml:"n" help:"a count"`
	Big   int64    `yaml:"big" help:"a big count"`
	Inner inner    `yaml:"inner"`
	skip  int
}

func TestFields(t *testing.T) {
	var o outer
	fs := Fields(&o)
	var got []string
	for _, f := range fs {
		got = append(got, f.Path+"="+f.Kind()+"="+f.Env()+"="+f.Flag())
	}
	want := "name=string=PARLEY_NAME=name on=bool=PARLEY_ON=on n=int=PARLEY_N=n big=int=PARLEY_BIG=big " +
		"inner.rate=number=PARLEY_INNER_RATE=inner.rate inner.wait=duration=PARLEY_INNER_WAIT=inner.wait"
	if strings.Join(got, " ") != want {
		t.Fatalf("fields %v\nwant %s", got, want)
	}
	for _, set := range [][2]string{{"name", "x"}, {"on", "true"}, {"n", "7"}, {"big", "9000000000"}, {"inner.rate", "2.5"}, {"inner.wait", "3s"}} {
		for _, f := range fs {
			if f.Path == set[0] {
				if err := f.Value.Set(set[1]); err != nil {
					t.Fatal(err)
				}
				if f.Value.String() != set[1] {
					t.Errorf("%s = %q after Set(%q)", f.Path, f.Value.String(), set[1])
				}
			}
		}
	}
	if !reflect.DeepEqual(o, outer{Name: "x", On: true, N: 7, Big: 9000000000, Inner: inner{Rate: 2.5, Wait: 3 * time.Second}, skip: o.skip}) {
		t.Fatalf("struct after sets: %+v", o)
	}
	for _, f := range fs {
		if err := f.Value.Set("not-a-value"); err == nil && f.Kind() != "string" {
			t.Errorf("%s accepted a bad value", f.Path)
		}
	}
}

func TestFieldsRefusesUndocumented(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "no help tag") {
			t.Fatalf("recover() = %v, want a panic naming the missing help tag", r)
		}
	}()
	var v struct {
		X int `yaml:"x"`
	}
	Fields(&v)
}

func TestProblemsMerge(t *testing.T) {
	var inner Problems
	inner.Check(false, "rate", "must be positive, got %d", 0)
	inner.Check(true, "wait", "never")
	var p Problems
	p.Add("name", "empty")
	p.Merge("inner", inner.Err("inner"))
	p.Merge("other", errors.New("plain"))
	p.Merge("none", nil)
	err := p.Err("outer")
	var e *Error
	if !errors.As(err, &e) || len(e.Problems) != 3 {
		t.Fatalf("err = %v", err)
	}
	if want := "outer: name: empty; inner.rate: must be positive, got 0; other: plain"; err.Error() != want {
		t.Fatalf("err = %q, want %q", err, want)
	}
	if (Problems{}).Err("x") != nil {
		t.Fatal("no problems, yet an error")
	}
}

func TestLists(t *testing.T) {
	if got := Lists(&outer{}); len(got) != 1 || got[0] != "items" {
		t.Fatalf("Lists = %v, want [items]", got)
	}
}
