package server

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parley-im/parley/internal/config"
)

// TestBindFailureWritesNothing: a node that cannot bind its address fails
// before it writes anything — no development key, no empty store, ledger
// or webhook directories under a data_dir that did not exist.
func TestBindFailureWritesNothing(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cfg := config.Default()
	cfg.Listen = busy.Addr().String()
	cfg.DataDir = filepath.Join(t.TempDir(), "data")
	_, err = Start(context.Background(), cfg, Deps{})
	if err == nil || !strings.Contains(err.Error(), "listen") {
		t.Fatalf("Start on a busy address = %v, want a listen error", err)
	}
	if _, err := os.Stat(cfg.DataDir); !os.IsNotExist(err) {
		entries, _ := os.ReadDir(cfg.DataDir)
		t.Fatalf("data_dir exists after the failed bind (stat: %v), holding %v", err, entries)
	}
}

// TestBadCertificateWritesNothing: a node whose TLS certificate cannot be
// read fails before it binds or writes anything.
func TestBadCertificateWritesNothing(t *testing.T) {
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.DataDir = filepath.Join(t.TempDir(), "data")
	cfg.TLS.CertFile = filepath.Join(t.TempDir(), "missing.pem")
	cfg.TLS.KeyFile = cfg.TLS.CertFile
	_, err := Start(context.Background(), cfg, Deps{})
	if err == nil || !strings.Contains(err.Error(), "tls") {
		t.Fatalf("Start with a missing certificate = %v, want a tls error", err)
	}
	if _, err := os.Stat(cfg.DataDir); !os.IsNotExist(err) {
		t.Fatalf("data_dir exists after the failed start (stat: %v)", err)
	}
	cfg.TLS.KeyFile = ""
	if _, err := Start(context.Background(), cfg, Deps{}); err == nil || !strings.Contains(err.Error(), "tls.key_file") {
		t.Fatalf("Start with a certificate and no key = %v, want a tls.key_file problem", err)
	}
}
