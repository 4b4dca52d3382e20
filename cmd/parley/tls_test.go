package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/testcert"
)

// TestServeReloadsCertificateOnSIGHUP: serve with tls.cert_file answers
// TLS handshakes with the certificate's files, reads them again on SIGHUP
// (new handshakes get the renewed certificate) and keeps running.
func TestServeReloadsCertificateOnSIGHUP(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	roots := x509.NewCertPool()
	roots.AddCert(testcert.Write(t, certFile, keyFile, "first"))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runServe(ctx, []string{"--listen", addr, "--data-dir", filepath.Join(dir, "data"), "--node-id", "n1",
			"--tls.cert-file", certFile, "--tls.key-file", keyFile, "--log.level", "error"})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	served := func() string {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{RootCAs: roots})
		if err != nil {
			return "error: " + err.Error()
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	waitFor(t, "the first certificate", func() bool { return served() == "first" }, done)

	roots.AddCert(testcert.Write(t, certFile, keyFile, "second"))
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the renewed certificate after SIGHUP", func() bool { return served() == "second" }, done)
}

func waitFor(t *testing.T, what string, cond func() bool, done <-chan error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		select {
		case err := <-done:
			t.Fatalf("serve ended waiting for %s: %v", what, err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
