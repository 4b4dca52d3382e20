package pebblelog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestLevels(t *testing.T) {
	var buf bytes.Buffer
	l := New(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), "store")
	l.Infof("flushed %d", 1)
	l.Errorf("compaction %s", "failed")
	func() {
		defer func() {
			if r := recover(); r != "pebble: fatal: corrupt 7" {
				t.Errorf("Fatalf panicked with %v, want pebble: fatal: corrupt 7", r)
			}
		}()
		l.Fatalf("corrupt %d", 7)
		t.Error("Fatalf returned")
	}()
	got := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{`level=DEBUG msg="flushed 1" component=store`, `level=ERROR msg="compaction failed" component=store`, `level=ERROR msg="corrupt 7" component=store`}
	if len(got) != len(want) {
		t.Fatalf("log = %q, want %d lines", got, len(want))
	}
	for i := range want {
		if !strings.HasSuffix(got[i], want[i]) {
			t.Errorf("line %d = %q, want it to end with %q", i, got[i], want[i])
		}
	}
}
