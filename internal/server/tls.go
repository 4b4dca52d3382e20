package server

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"sync/atomic"
	"time"
)

// certSource holds the certificate a TLS listener presents. Reload reads
// the files again; a handshake always sees a whole certificate, the old one
// until the new one has loaded and parsed, so a bad renewal leaves the node
// serving the certificate it had.
type certSource struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate]
}

func newCertSource(certFile, keyFile string) (*certSource, error) {
	c := &certSource{certFile: certFile, keyFile: keyFile}
	if err := c.Reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// Reload loads the certificate and key files and, if they form a valid
// pair, serves them from the next handshake on.
func (c *certSource) Reload() error {
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("server: tls: %w", err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return fmt.Errorf("server: tls: %s: %w", c.certFile, err)
	}
	cert.Leaf = leaf
	c.cur.Store(&cert)
	return nil
}

// NotAfter is the expiry of the certificate being served.
func (c *certSource) NotAfter() time.Time { return c.cur.Load().Leaf.NotAfter }

func (c *certSource) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return c.cur.Load(), nil
}

// config is the listener's TLS configuration: TLS 1.2 and later, HTTP/1.1
// only (WebSocket upgrades are HTTP/1.1; the node speaks no HTTP/2).
func (c *certSource) config() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		NextProtos:     []string{"http/1.1"},
		GetCertificate: c.get,
	}
}
