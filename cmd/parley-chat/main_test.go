package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
)

// TestUsage: -h prints the flags and the command list and ends with
// flag.ErrHelp (exit status 0); no token is an error naming both ways to
// give one, before anything connects.
func TestUsage(t *testing.T) {
	var out bytes.Buffer
	err := runChat(context.Background(), []string{"-h"}, strings.NewReader(""), &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: err %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{"usage: parley-chat [-url URL] [-token TOKEN] [-device ID] [-keys DIR]", "-url", "-token", "-device", "-keys", "/sdm USER", "/quit"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-h output lacks %q:\n%s", want, out.String())
		}
	}

	t.Setenv("PARLEY_TOKEN", "")
	out.Reset()
	err = runChat(context.Background(), []string{"-url", "ws://127.0.0.1:1"}, strings.NewReader(""), &out)
	if err == nil || !strings.Contains(err.Error(), "-token or PARLEY_TOKEN is required") {
		t.Fatalf("no token: err %v", err)
	}
	if out.Len() != 0 {
		t.Fatalf("no token: printed %q", out.String())
	}
}
