// Package pebblelog routes the log of a cockroachdb/pebble database to
// slog, for every Pebble that Parley opens (the embedded store, the webhook
// queue, the compensation ledger): pebble's routine messages (flushes,
// compactions) at Debug, its errors at Error, and Fatalf, which pebble calls
// when its own state can no longer be trusted, at Error before a panic (it
// must not return). A Logger is safe for concurrent use, as slog is.
package pebblelog

import (
	"fmt"
	"log/slog"
)

// Logger is a pebble Logger (Options.Logger) writing to L.
type Logger struct{ L *slog.Logger }

// New returns a Logger writing to l, with attribute component=component.
func New(l *slog.Logger, component string) Logger {
	return Logger{l.With("component", component)}
}

func (p Logger) Infof(format string, args ...any) {
	p.L.Debug(fmt.Sprintf(format, args...))
}

func (p Logger) Errorf(format string, args ...any) {
	p.L.Error(fmt.Sprintf(format, args...))
}

func (p Logger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	p.L.Error(msg)
	panic("pebble: fatal: " + msg)
}
