package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/attach"
)

// TestAttachSettings: the attach. tree has the documented defaults, takes
// its keys from the file, PARLEY_ATTACH_* variables and --attach.* flags
// (the S3 server's one level deeper), and hello announces its sizes.
func TestAttachSettings(t *testing.T) {
	c, err := Load(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := c.Attach
	if a.Engine != attach.EngineDisk || a.MaxFileBytes != 100<<20 || a.PartBytes != 8<<20 || a.UserQuotaBytes != 2<<30 ||
		a.UploadsInFlight != 8 || a.UnattachedTTL != 24*time.Hour || a.URLTTL != 5*time.Minute || a.MaxImagePixels != 50_000_000 ||
		a.ThumbnailPx != 320 || a.GCInterval != time.Minute || a.S3.Bucket != "parley" || a.S3.Region != "us-east-1" || a.S3.Secure {
		t.Fatalf("defaults %+v", a)
	}
	if g := c.GatewayConfig(); g.MaxFileBytes != 100<<20 || g.PartBytes != 8<<20 {
		t.Fatalf("hello sizes %d %d, want the attach defaults", g.MaxFileBytes, g.PartBytes)
	}
	file := writeFile(t, "parley.yaml", `
attach:
  engine: s3
  unattached_ttl: 2h
  s3:
    endpoint: "127.0.0.1:8333"
    bucket: files
`)
	c, err = Load([]string{"--config", file, "--attach.part-bytes", "6291456", "--attach.s3.secure"},
		[]string{"PARLEY_ATTACH_S3_ACCESS_KEY=ak", "PARLEY_ATTACH_MAX_FILE_BYTES=1000000"})
	if err != nil {
		t.Fatal(err)
	}
	a = c.Attach
	if a.Engine != attach.EngineS3 || a.UnattachedTTL != 2*time.Hour || a.S3.Endpoint != "127.0.0.1:8333" || a.S3.Bucket != "files" ||
		a.PartBytes != 6<<20 || !a.S3.Secure || a.S3.AccessKey != "ak" || a.MaxFileBytes != 1000000 {
		t.Fatalf("loaded %+v", a)
	}
	c, err = Load([]string{"--attach.max-file-bytes", "0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if g := c.GatewayConfig(); c.Attach.Enabled() || g.MaxFileBytes != 0 || g.PartBytes != 0 {
		t.Fatalf("off: enabled %v, hello sizes %d %d; want 0 0", c.Attach.Enabled(), g.MaxFileBytes, g.PartBytes)
	}
}

// TestAttachValidate: bad attach settings are refused by key; disk in
// cluster mode is refused, s3 or attachments off are not.
func TestAttachValidate(t *testing.T) {
	cluster := []string{"--cluster.redis", "r:1", "--cluster.nats", "nats://n:1", "--cluster.cassandra-hosts", "h"}
	s3 := []string{"--attach.engine", "s3", "--attach.s3.endpoint", "127.0.0.1:8333"}
	for _, tc := range []struct {
		name string
		args []string
		want string // "": valid
	}{
		{"engine", []string{"--attach.engine", "ftp"}, "attach.engine"},
		{"negative size", []string{"--attach.max-file-bytes", "-1"}, "attach.max_file_bytes"},
		{"zero part", []string{"--attach.part-bytes", "0"}, "attach.part_bytes"},
		{"small part", []string{"--attach.part-bytes", "1048576"}, "at least 5242880"},
		{"too many parts", []string{"--attach.part-bytes", "5242880", "--attach.max-file-bytes", "60000000000"}, "attach.part_bytes: max_file_bytes"},
		{"s3 no endpoint", []string{"--attach.engine", "s3"}, "attach.s3.endpoint"},
		{"s3 both secrets", append([]string{"--attach.s3.secret-key", "x", "--attach.s3.secret-key-file", "f"}, s3...), "attach.s3.secret_key_file"},
		{"quota", []string{"--attach.user-quota-bytes", "0"}, "attach.user_quota_bytes"},
		{"in flight", []string{"--attach.uploads-in-flight", "0"}, "attach.uploads_in_flight"},
		{"ttl", []string{"--attach.unattached-ttl", "0s"}, "attach.unattached_ttl"},
		{"url ttl", []string{"--attach.url-ttl", "200h"}, "attach.url_ttl"},
		{"thumbnail", []string{"--attach.thumbnail-px", "5"}, "attach.thumbnail_px"},
		{"pixels", []string{"--attach.max-image-pixels", "0"}, "attach.max_image_pixels"},
		{"gc", []string{"--attach.gc-interval", "1ms"}, "attach.gc_interval"},
		{"off skips the rest", []string{"--attach.max-file-bytes", "0", "--attach.part-bytes", "0"}, ""},
		{"cluster disk", cluster, "attach.engine: disk keeps each file on the disk of the one chat process"},
		{"cluster s3", append(cluster, s3...), ""},
		{"cluster off", append(cluster, "--attach.max-file-bytes", "0"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.args, nil)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Load = %v, want valid", err)
			case tc.want != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Load = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
