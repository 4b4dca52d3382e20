package server

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/parley-im/parley/third_party/nbio/logging"
)

// nbioLog routes nbio's global printf-style log into slog. nbio's info lines
// (engine start and stop) go to debug: the node logs its own start.
type nbioLog struct{ l *slog.Logger }

func (n nbioLog) Debug(f string, v ...any) { n.l.Debug(fmt.Sprintf(f, v...), "component", "nbio") }
func (n nbioLog) Info(f string, v ...any)  { n.l.Debug(fmt.Sprintf(f, v...), "component", "nbio") }
func (n nbioLog) Warn(f string, v ...any)  { n.l.Warn(fmt.Sprintf(f, v...), "component", "nbio") }
func (n nbioLog) Error(f string, v ...any) { n.l.Error(fmt.Sprintf(f, v...), "component", "nbio") }

var nbioLogOnce sync.Once

// setNBIOLogger installs the first node's logger as nbio's (nbio has one
// global logger per process).
func setNBIOLogger(l *slog.Logger) {
	nbioLogOnce.Do(func() { logging.SetLogger(nbioLog{l}) })
}
