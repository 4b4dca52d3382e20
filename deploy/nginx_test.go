package deploy

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/internal/testcert"
	"github.com/parley-im/parley/protocol"
)

// TestNginxExample runs deploy/nginx/parley.conf, as shipped but for the
// three lines marked "deployment:", in a real nginx in front of a node:
// two SDK clients chat over wss:// through it (WebSocket upgrade, Host kept
// for the origin check), an upload of two parts and its download pass, the
// long poll answers through it, and the web page loads. Without nginx the
// test skips; under CI=true it fails.
func TestNginxExample(t *testing.T) {
	bin, err := exec.LookPath("nginx")
	if err != nil {
		if _, statErr := os.Stat("/usr/sbin/nginx"); statErr == nil {
			bin = "/usr/sbin/nginx"
		} else if os.Getenv("CI") == "true" {
			t.Fatal("CI requires nginx (apt-get install nginx-light)")
		} else {
			t.Skip("nginx not installed (apt-get install nginx-light)")
		}
	}
	const part = 5 << 20
	srv := servertest.Start(t, servertest.WithConfig(func(c *config.Config) {
		c.Web.Page = true
		c.Attach.PartBytes = part
	}))

	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	cert := testcert.Write(t, certFile, keyFile, "parley proxy test")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	proxyAddr := ln.Addr().String()
	ln.Close()

	example, err := os.ReadFile("nginx/parley.conf")
	if err != nil {
		t.Fatal(err)
	}
	conf := string(example)
	for _, r := range []struct{ old, new string }{
		{"server 127.0.0.1:7480;", "server " + srv.Addr() + ";"},
		{"listen 443 ssl;", "listen " + proxyAddr + " ssl;"},
		{"/etc/ssl/parley/fullchain.pem", certFile},
		{"/etc/ssl/parley/privkey.pem", keyFile},
	} {
		if !strings.Contains(conf, r.old) {
			t.Fatalf("deploy/nginx/parley.conf no longer contains %q", r.old)
		}
		conf = strings.Replace(conf, r.old, r.new, 1)
	}
	if err := os.WriteFile(filepath.Join(dir, "parley.conf"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	// A minimal nginx.conf around the example, everything under dir.
	main := fmt.Sprintf(`pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 256; }
http {
    access_log %[1]s/access.log;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    include %[1]s/parley.conf;
}
`, dir)
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(main), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-p", dir, "-c", filepath.Join(dir, "nginx.conf"), "-g", "daemon off; master_process off;")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Logf("nginx output:\n%s\nerror.log:\n%s", stderr.String(), log)
		}
	})

	roots := x509.NewCertPool()
	roots.AddCert(cert)
	tlsCfg := &tls.Config{RootCAs: roots}
	httpc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}, Timeout: 30 * time.Second}
	base := "https://" + proxyAddr
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := httpc.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("nginx never answered /healthz: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	open := func(user string) (*client.Client, <-chan client.Event) {
		c, err := client.New(client.Config{URL: "wss://" + proxyAddr, Token: srv.Token(user), Device: "phone", TLSConfig: tlsCfg})
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = c.Run(ctx) }()
		t.Cleanup(func() { _ = c.Close() })
		return c, c.Events()
	}
	alice, _ := open("alice")
	bob, bobEvents := open("bob")
	conv, err := alice.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatalf("OpenDirect through nginx: %v", err)
	}
	ack, err := alice.Send(ctx, conv.ConvID, "through the proxy")
	if err != nil {
		t.Fatalf("Send through nginx: %v", err)
	}
	waitMessage(t, ctx, bobEvents, conv.ConvID, ack.Seq)

	// Two parts up, the file down, through the proxy.
	data := make([]byte, part+1234)
	_, _ = rand.Read(data)
	info, err := alice.Upload(ctx, conv.ConvID, bytes.NewReader(data), int64(len(data)), client.UploadOptions{Name: "f.bin", MediaType: "application/octet-stream"})
	if err != nil {
		t.Fatalf("upload through nginx: %v", err)
	}
	fack, err := alice.SendFile(ctx, conv.ConvID, info.AttachmentID, client.FileMessage{})
	if err != nil {
		t.Fatal(err)
	}
	waitMessage(t, ctx, bobEvents, conv.ConvID, fack.Seq)
	var got bytes.Buffer
	if _, _, err := bob.Download(ctx, conv.ConvID, fack.Seq, &got, client.DownloadOptions{}); err != nil || !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("download through nginx: %d of %d bytes, %v", got.Len(), len(data), err)
	}

	// The long poll opens a session through the proxy.
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/poll?device=web", nil)
	req.Header.Set("Authorization", "Bearer "+srv.Token("carol"))
	resp, err := httpc.Do(req)
	if err != nil {
		t.Fatalf("poll through nginx: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var frames struct {
		Frames []protocol.Frame `json:"frames"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &frames) != nil || len(frames.Frames) == 0 || frames.Frames[0].Type != protocol.TypeHello {
		t.Fatalf("poll through nginx: %d %s", resp.StatusCode, body)
	}

	// The page, with its headers.
	resp, err = httpc.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Contains(page, []byte("<html")) || resp.Header.Get("Content-Security-Policy") == "" {
		t.Fatalf("page through nginx: %d, CSP %q", resp.StatusCode, resp.Header.Get("Content-Security-Policy"))
	}
}

func waitMessage(t *testing.T, ctx context.Context, events <-chan client.Event, conv, seq uint64) {
	t.Helper()
	for {
		select {
		case ev := <-events:
			if ev.Kind == client.EventMessage && ev.Message.ConvID == conv && ev.Message.Seq == seq {
				return
			}
		case <-ctx.Done():
			t.Fatalf("message %d/%d never arrived through nginx", conv, seq)
		}
	}
}
