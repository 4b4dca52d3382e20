package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/server"
)

const serveUsage = "parley serve [--config FILE] [--<setting> VALUE ...]"

func runServe(ctx context.Context, args []string) error {
	cfg, err := loadConfig(config.NewFlagSet("parley serve"), serveUsage, args)
	if err != nil {
		return err
	}
	log := newLogger(cfg.Log, os.Stderr)
	if addr := os.Getenv(pprofEnv); addr != "" {
		servePprof(addr, log)
	}
	if cfg.UsesDevKey() {
		log.Warn("using the development token key in the data directory; configure auth.hs256_key_file or auth.ed25519_public_key_file for production", "data_dir", cfg.DataDir)
	}
	// SIGHUP reads the TLS certificate and key again; it never stops the
	// node. Registered before the node starts so an early one is not fatal.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	srv, err := server.Start(ctx, cfg, server.Deps{Logger: log})
	if err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, startedLine(cfg, srv.Addr()))
	if a := srv.AdminAddr(); a != "" {
		fmt.Fprintf(os.Stderr, "parley: admin API on http://%s/v1/admin/\n", a)
	}
	for waiting := true; waiting; {
		select {
		case <-ctx.Done():
			waiting = false
		case <-hup:
			if !srv.TLS() {
				log.Info("SIGHUP: no tls.cert_file configured, nothing to reload")
			} else if err := srv.ReloadTLS(); err != nil {
				log.Error("SIGHUP: keeping the certificate served so far", "err", err)
			}
		}
	}
	log.Info("stopping: draining connections", "timeout", cfg.Gateway.DrainTimeout)
	stopCtx, cancel := context.WithTimeout(context.Background(), cfg.Gateway.DrainTimeout+5*time.Second)
	defer cancel()
	srv.Drain(stopCtx)
	return srv.Shutdown(stopCtx)
}

// startedLine is what serve prints once it listens: the client URL on a
// gateway, and the web page's when it serves one; a chat-only node serves no clients, only /healthz, /readyz and
// /metrics.
func startedLine(cfg config.Config, addr string) string {
	ws, web := "ws", "http"
	if cfg.TLS.Enabled() {
		ws, web = "wss", "https"
	}
	if cfg.RoleSet()[config.RoleGateway] {
		line := fmt.Sprintf("parley: serving on %s://%s/v1/ws (node %s, data %s)", ws, addr, cfg.NodeID, cfg.DataDir)
		if cfg.Web.Page {
			line += fmt.Sprintf("\nparley: web chat page on %s://%s/", web, addr)
		}
		return line
	}
	return fmt.Sprintf("parley: chat node %s up (no client endpoints); health and metrics on %s://%s/healthz, /readyz, /metrics", cfg.NodeID, web, addr)
}

// stdout receives help (a variable for tests).
var stdout io.Writer = os.Stdout

// loadConfig parses a command's flags and the configuration; after -h or
// --help it prints the command's usage and every setting to stdout and
// returns flag.ErrHelp (exit status 0).
func loadConfig(fs *flag.FlagSet, usageLine string, args []string) (config.Config, error) {
	return loadConfigOf(fs, usageLine, args, nil)
}

// loadConfigOf is loadConfig for a command whose help lists only the
// settings in uses (config.UsageOf).
func loadConfigOf(fs *flag.FlagSet, usageLine string, args []string, uses []string) (config.Config, error) {
	cfg, err := config.Parse(fs, args, os.Environ())
	if errors.Is(err, flag.ErrHelp) {
		config.UsageOf(stdout, usageLine, fs, uses)
	}
	return cfg, err
}

// newLogger builds the server's log. Durations are written as Go duration
// strings ("1.5s", "250ms") in both formats: slog's JSON handler would
// otherwise write nanoseconds.
func newLogger(l config.Log, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: l.SlogLevel(), ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Value.Kind() == slog.KindDuration {
			a.Value = slog.StringValue(a.Value.Duration().String())
		}
		return a
	}}
	if l.Format == config.LogJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
