package enginetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	blobs3 "github.com/parley-im/parley/internal/blob/s3"
)

// S3 returns the configuration of the S3 server at $PARLEY_TEST_S3
// (scripts/engines/seaweedfs.sh) with a key prefix of the test's own, and
// deletes the objects and uploads under that prefix when the test ends,
// so tests share one bucket without seeing each other. Without
// $PARLEY_TEST_S3 the test skips, under CI=true it fails.
func S3(t testing.TB) blobs3.Config {
	t.Helper()
	raw := os.Getenv("PARLEY_TEST_S3")
	if raw == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires S3: PARLEY_TEST_S3 is unset (scripts/engines/up.sh start)")
		}
		t.Skip("PARLEY_TEST_S3 is unset; run scripts/engines/up.sh start")
	}
	cfg, err := blobs3.ParseURL(raw)
	if err != nil {
		t.Fatalf("PARLEY_TEST_S3: %v", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	cfg.Prefix += "parleytest-" + hex.EncodeToString(b[:]) + "/"
	t.Cleanup(func() { removeS3Prefix(t, cfg) })
	return cfg
}

// removeS3Prefix deletes every object and upload under cfg.Prefix.
func removeS3Prefix(t testing.TB, cfg blobs3.Config) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:  credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure: cfg.Secure,
		Region: cfg.Region,
	})
	if err != nil {
		t.Logf("S3 cleanup: %v", err)
		return
	}
	for obj := range cl.ListObjects(ctx, cfg.Bucket, minio.ListObjectsOptions{Prefix: cfg.Prefix, Recursive: true}) {
		if obj.Err != nil {
			t.Logf("S3 cleanup: list: %v", obj.Err)
			break
		}
		_ = cl.RemoveObject(ctx, cfg.Bucket, obj.Key, minio.RemoveObjectOptions{})
	}
	for up := range cl.ListIncompleteUploads(ctx, cfg.Bucket, cfg.Prefix, true) {
		if up.Err != nil {
			t.Logf("S3 cleanup: list uploads: %v", up.Err)
			break
		}
		_ = cl.RemoveIncompleteUpload(ctx, cfg.Bucket, up.Key)
	}
}
