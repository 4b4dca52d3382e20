package s3

import (
	"testing"
	"time"

	"github.com/parley-im/parley/internal/blob"
)

func TestParseURL(t *testing.T) {
	good := []struct {
		in   string
		want Config
	}{
		{"http://ak:sk@127.0.0.1:8333/parley", Config{Endpoint: "127.0.0.1:8333", Bucket: "parley", AccessKey: "ak", SecretKey: "sk"}},
		{"https://ak:s%2Fk@s3.example.com/b/run-1/?region=eu-west-3", Config{Endpoint: "s3.example.com", Bucket: "b", AccessKey: "ak", SecretKey: "s/k", Secure: true, Prefix: "run-1/", Region: "eu-west-3"}},
	}
	for _, c := range good {
		got, err := ParseURL(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseURL(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	bad := []string{
		"", "127.0.0.1:8333/b", "ftp://ak:sk@h/b", "http://h/b", "http://ak@h/b", "http://ak:sk@h", "http://ak:sk@h/",
		"http://ak:sk@h/b/noslash", "http://ak:sk@h/b/a//", "http://ak:sk@h/b?x=1", "http://ak:sk@h/b#f",
	}
	for _, in := range bad {
		if c, err := ParseURL(in); err == nil {
			t.Errorf("ParseURL(%q) = %+v, want an error", in, c)
		}
	}
}

func FuzzParseURL(f *testing.F) {
	f.Add("http://ak:sk@127.0.0.1:8333/parley")
	f.Add("https://a%20k:s%2Fk@h:1/b/p/q/?region=r")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseURL(s)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("ParseURL(%q) = %+v, which Validate refuses: %v", s, c, err)
		}
	})
}

func TestLatest(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	parts := []blob.Part{
		{N: 2, Size: 10, ETag: "b-old"},
		{N: 1, Size: 5, ETag: "a"},
		{N: 2, Size: 8, ETag: "b-new"},
		{N: 3, Size: 3, ETag: "c-cut"},
		{N: 3, Size: 7, ETag: "c-whole"},
		{N: 3, Size: 1, ETag: "c-cut-again"},
	}
	seen := []time.Time{t0, t0, t0.Add(time.Second), t0, t0, t0}
	got := latest(parts, seen)
	want := []blob.Part{{N: 1, Size: 5, ETag: "a"}, {N: 2, Size: 8, ETag: "b-new"}, {N: 3, Size: 7, ETag: "c-whole"}}
	if len(got) != len(want) {
		t.Fatalf("latest = %+v, want %+v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("latest = %+v, want %+v", got, want)
		}
	}
}
