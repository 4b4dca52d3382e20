package server

import (
	"strings"
	"testing"

	"github.com/parley-im/parley/internal/attach"
)

// TestPageCSPBlobOrigin: with attachments on S3 the page may reach that one
// origin (parts PUT there, images and audio load from presigned URLs);
// otherwise, and with attachments on disk or off, only its own.
func TestPageCSPBlobOrigin(t *testing.T) {
	directives := func(csp string) map[string]string {
		out := map[string]string{}
		for _, d := range strings.Split(csp, ";") {
			name, value, _ := strings.Cut(strings.TrimSpace(d), " ")
			out[name] = value
		}
		return out
	}
	disk := attach.DefaultConfig()
	off := attach.DefaultConfig()
	off.MaxFileBytes = 0
	s3 := attach.DefaultConfig()
	s3.Engine = attach.EngineS3
	s3.S3.Endpoint = "files.example.com:9000"
	s3tls := s3
	s3tls.S3.Secure = true
	offS3 := s3
	offS3.MaxFileBytes = 0
	for _, tc := range []struct {
		name                string
		cfg                 attach.Config
		connect, img, media string
	}{
		{"disk", disk, "'self'", "'self' data: blob:", "'self' blob:"},
		{"off", off, "'self'", "'self' data: blob:", "'self' blob:"},
		{"s3 off", offS3, "'self'", "'self' data: blob:", "'self' blob:"},
		{"s3", s3, "'self' http://files.example.com:9000", "'self' data: blob: http://files.example.com:9000", "'self' blob: http://files.example.com:9000"},
		{"s3 tls", s3tls, "'self' https://files.example.com:9000", "'self' data: blob: https://files.example.com:9000", "'self' blob: https://files.example.com:9000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := directives(pageCSP(tc.cfg))
			if d["connect-src"] != tc.connect || d["img-src"] != tc.img || d["media-src"] != tc.media {
				t.Errorf("connect-src %q img-src %q media-src %q, want %q %q %q", d["connect-src"], d["img-src"], d["media-src"], tc.connect, tc.img, tc.media)
			}
			if d["default-src"] != "'self'" || d["frame-ancestors"] != "'none'" || d["script-src"] != "" {
				t.Errorf("CSP %v: the rest must stay the page's own", d)
			}
		})
	}
}
