package client

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/internal/testcert"
)

// servedName is the common name of the certificate a new TLS handshake
// with addr gets.
func servedName(t *testing.T, addr string, roots *x509.CertPool) string {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots})
	if err != nil {
		t.Fatalf("tls dial: %v", err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName
}

// TestE2ETLS: a node with tls.cert_file serves the WebSocket, the HTTP
// API and attachments over TLS; reloading picks up a renewed certificate
// for new handshakes while connections already open carry on, and a bad
// renewal leaves the served certificate in place.
func TestE2ETLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	first := testcert.Write(t, certFile, keyFile, "first")
	srv := servertest.Start(t, servertest.WithConfig(func(c *config.Config) {
		c.TLS.CertFile, c.TLS.KeyFile = certFile, keyFile
		c.Attach.PartBytes = testPart
	}))
	if !srv.TLS() || srv.URL[:6] != "wss://" {
		t.Fatalf("TLS() = %v, URL %q", srv.TLS(), srv.URL)
	}
	roots := x509.NewCertPool()
	roots.AddCert(first)
	tlsCfg := &tls.Config{RootCAs: roots}
	withTLS := func(c *Config) { c.TLSConfig = tlsCfg }
	alice := startE2E(t, srv.URL, srv.Token("alice"), "phone", withTLS)
	bob := startE2E(t, srv.URL, srv.Token("bob"), "phone", withTLS)
	ctx := ctxT(t)
	conv, err := alice.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	ack, err := alice.Send(ctx, conv.ConvID, "over tls")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "bob has the message", func() bool { return bob.rec.hasSeq(conv.ConvID, ack.Seq) })

	// Attachments: the part PUTs and the download go over HTTPS.
	data := randomFile(7, testPart+100)
	info, err := alice.Upload(ctx, conv.ConvID, bytes.NewReader(data), int64(len(data)), UploadOptions{Name: "a.bin", MediaType: "application/octet-stream"})
	if err != nil {
		t.Fatalf("upload over https: %v", err)
	}
	fack, err := alice.SendFile(ctx, conv.ConvID, info.AttachmentID, FileMessage{})
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	if _, _, err := bob.Download(ctx, conv.ConvID, fack.Seq, &got, DownloadOptions{}); err != nil || !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("download over https: %d bytes, %v", got.Len(), err)
	}

	// Plain HTTP on the TLS port is not served.
	resp, err := http.Get("http://" + srv.Addr() + "/healthz")
	if err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatalf("plain HTTP on the TLS port answered 200 %q", body)
		}
	}

	// Renewal: new handshakes get the new certificate.
	if got := servedName(t, srv.Addr(), roots); got != "first" {
		t.Fatalf("served %q before the reload", got)
	}
	second := testcert.Write(t, certFile, keyFile, "second")
	roots.AddCert(second)
	if got := servedName(t, srv.Addr(), roots); got != "first" {
		t.Fatalf("served %q before ReloadTLS: files are read only on reload", got)
	}
	if err := srv.ReloadTLS(); err != nil {
		t.Fatal(err)
	}
	if got := servedName(t, srv.Addr(), roots); got != "second" {
		t.Fatalf("served %q after the reload, want second", got)
	}
	// The connections opened under the first certificate carry on.
	ack2, err := alice.Send(ctx, conv.ConvID, "after the renewal")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "bob has the second message", func() bool { return bob.rec.hasSeq(conv.ConvID, ack2.Seq) })

	// A bad renewal (a key that is not the certificate's) is refused and
	// the node keeps serving the second certificate.
	testcert.Write(t, filepath.Join(dir, "other.pem"), keyFile, "third")
	if err := srv.ReloadTLS(); err == nil {
		t.Fatal("ReloadTLS with a mismatched key succeeded")
	}
	if got := servedName(t, srv.Addr(), roots); got != "second" {
		t.Fatalf("served %q after a failed reload, want second", got)
	}
}
