package main

import (
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// pprofEnv names a loopback address on which `parley serve` exposes
// net/http/pprof, for profiling (`parley-bench fanout -profile-dir`). It is
// off unless set, and kept apart from the public listener.
const pprofEnv = "PARLEY_PPROF"

// servePprof serves the profiling endpoints on addr until the process
// exits. A failure to listen is logged, not fatal: profiling is optional.
func servePprof(addr string, log *slog.Logger) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Warn("pprof: listen failed", "addr", addr, "err", err)
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	log.Warn("pprof endpoints open", "addr", ln.Addr().String())
	go func() {
		_ = (&http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}).Serve(ln)
	}()
}
