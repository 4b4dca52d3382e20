package search

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTerms(t *testing.T) {
	for in, want := range map[string][]string{
		"Hello, World":    {"hello", "world"},
		"我们明天去北京":         {"我", "们", "明", "天", "去", "北", "京"},
		"Parley支持中文 v2.6": {"parley", "支", "持", "中", "文", "v2", "6"},
		"  ...  ":         nil,
		"café naïve":      {"café", "naïve"},
		"カタカナ と 한국어":      {"カ", "タ", "カ", "ナ", "と", "한", "국", "어"},
	} {
		if got := Terms(in); !slices.Equal(got, want) {
			t.Errorf("Terms(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestValidate(t *testing.T) {
	ok := Query{Text: "hello", Windows: []Window{{ConvID: 1, From: 1}}, Limit: 10}
	if err := Validate(ok, DefaultLimits); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		f    func(*Query)
		want error
	}{
		"empty":       {func(q *Query) { q.Text = " ,. " }, ErrEmpty},
		"too long":    {func(q *Query) { q.Text = strings.Repeat("a", 257) }, ErrTooLong},
		"many terms":  {func(q *Query) { q.Text = strings.Repeat("a ", 17) }, ErrTooManyTerms},
		"many cjk":    {func(q *Query) { q.Text = strings.Repeat("中", 17) }, ErrTooManyTerms},
		"not utf-8":   {func(q *Query) { q.Text = "a\xff" }, ErrBadQuery},
		"limit 0":     {func(q *Query) { q.Limit = 0 }, ErrBadQuery},
		"limit big":   {func(q *Query) { q.Limit = 101 }, ErrBadQuery},
		"order":       {func(q *Query) { q.Order = 9 }, ErrBadQuery},
		"time":        {func(q *Query) { q.FromTime, q.ToTime = 5, 4 }, ErrBadQuery},
		"window":      {func(q *Query) { q.Windows = []Window{{ConvID: 1, From: 5, To: 4}} }, ErrBadQuery},
		"window from": {func(q *Query) { q.Windows = []Window{{ConvID: 1}} }, ErrBadQuery},
		"cursor":      {func(q *Query) { q.Cursor = "%%%" }, ErrBadCursor},
		"cursor order": {func(q *Query) {
			q.Cursor = EncodeCursor(Cursor{Order: Relevance, After: []string{"1"}})
		}, ErrBadCursor},
	} {
		q := ok
		c.f(&q)
		if err := Validate(q, DefaultLimits); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}

func TestSnippet(t *testing.T) {
	s, hs := Snippet("The Quick brown fox", "quick", 100)
	if s != "The Quick brown fox" || !slices.Equal(hs, []Highlight{{4, 9}}) {
		t.Fatalf("%q %v", s, hs)
	}
	s, hs = Snippet("我们明天去北京开会", "北京", 100)
	if got := s[hs[0].Start:hs[0].End]; len(hs) != 1 || got != "北京" {
		t.Fatalf("%q %v", s, hs)
	}
	long := strings.Repeat("前文", 100) + "关键字" + strings.Repeat("后文", 100)
	s, hs = Snippet(long, "关键字", 40)
	if utf8.RuneCountInString(s) != 40 || len(hs) != 1 || s[hs[0].Start:hs[0].End] != "关键字" {
		t.Fatalf("%q %v", s, hs)
	}
}

// FuzzCursor: a cursor comes from clients; decoding any string either
// fails with ErrBadCursor or yields one that encodes back to a cursor that
// decodes the same.
func FuzzCursor(f *testing.F) {
	f.Add(EncodeCursor(Cursor{Order: Newest, After: []string{"1790000000000", "0000000000000001:0000000000000002"}}))
	f.Add("")
	f.Add("e30")
	f.Fuzz(func(t *testing.T, s string) {
		for _, o := range []Order{Newest, Relevance} {
			c, err := DecodeCursor(s, o)
			if err != nil {
				if !errors.Is(err, ErrBadCursor) {
					t.Fatalf("%q: %v", s, err)
				}
				continue
			}
			d, err := DecodeCursor(EncodeCursor(c), o)
			if err != nil || !slices.Equal(c.After, d.After) {
				t.Fatalf("%q: round trip %v %v", s, d, err)
			}
		}
	})
}

// FuzzSnippet: any text and query give a snippet of the text with
// highlights inside it, in order.
func FuzzSnippet(f *testing.F) {
	f.Add("我们明天去北京开会", "北京", 10)
	f.Add("ǅemo İstanbul ẞ", "i̇stanbul", 5)
	f.Fuzz(func(t *testing.T, text, query string, width int) {
		if !utf8.ValidString(text) {
			return
		}
		width = 1 + (width & 0xff)
		s, hs := Snippet(text, query, width)
		if !strings.Contains(text, s) {
			t.Fatalf("snippet %q not in %q", s, text)
		}
		end := 0
		for _, h := range hs {
			if h.Start < end || h.End <= h.Start || h.End > len(s) {
				t.Fatalf("highlights %v of %q", hs, s)
			}
			end = h.End
		}
	})
}
