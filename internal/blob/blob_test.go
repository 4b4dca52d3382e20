package blob

import (
	"errors"
	"strings"
	"testing"
)

func TestValidKey(t *testing.T) {
	good := []string{"a", "f/123", "t/123", "A-Z_0.9/x", ".a", "a.", "a/.b", "a.b/c.d", "-", "_", strings.Repeat("k", 200)}
	bad := []string{"", "/", "/a", "a/", "a//b", ".", "./a", "a/.", "a/./b", "..", "a..b", "a/../b", "a b", "a\x00", "ü", "a?b", "a\\b", strings.Repeat("k", 201)}
	for _, k := range good {
		if !ValidKey(k) {
			t.Errorf("ValidKey(%q) = false, want true", k)
		}
	}
	for _, k := range bad {
		if ValidKey(k) {
			t.Errorf("ValidKey(%q) = true, want false", k)
		}
	}
}

func FuzzValidKey(f *testing.F) {
	f.Add("f/123")
	f.Add("a/./b")
	f.Fuzz(func(t *testing.T, k string) {
		if !ValidKey(k) {
			return
		}
		if len(k) > 200 || strings.Contains(k, "..") {
			t.Fatalf("ValidKey(%q) = true", k)
		}
		for _, seg := range strings.Split(k, "/") {
			if seg == "" || seg == "." {
				t.Fatalf("ValidKey(%q) = true with segment %q", k, seg)
			}
		}
	})
}

func TestCheckParts(t *testing.T) {
	big := int64(MinPartSize)
	have := []Part{{1, big, "a"}, {2, big, "b"}, {3, 10, "c"}}
	ok := [][]Part{have, have[:1], have[:2]}
	for _, p := range ok {
		if err := CheckParts(p, have); err != nil {
			t.Errorf("CheckParts(%v) = %v", p, err)
		}
	}
	bad := [][]Part{
		nil,
		{have[1]},
		{have[0], have[2]},
		{have[1], have[0]},
		{have[0], have[0]},
		{have[0], {2, big, "x"}},
		{have[0], {2, big + 1, "b"}},
		{have[0], have[1], have[2], {4, 1, "d"}},
	}
	for _, p := range bad {
		if err := CheckParts(p, have); !errors.Is(err, ErrBadParts) {
			t.Errorf("CheckParts(%v) = %v, want ErrBadParts", p, err)
		}
	}
	small := []Part{{1, 10, "a"}, {2, 10, "b"}}
	if err := CheckParts(small, small); !errors.Is(err, ErrBadParts) {
		t.Errorf("CheckParts of a small part before the last = %v, want ErrBadParts", err)
	}
}
