package s3_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/parley-im/parley/internal/blob"
	"github.com/parley-im/parley/internal/blob/blobtest"
	blobs3 "github.com/parley-im/parley/internal/blob/s3"
	"github.com/parley-im/parley/internal/enginetest"
)

func open(t *testing.T, cfg blobs3.Config) *blobs3.Store {
	t.Helper()
	s, err := blobs3.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	blobtest.Run(t, blobtest.Harness{
		Open: func(t *testing.T) blob.Store { return open(t, enginetest.S3(t)) },
	})
}

// TestServerChecksPayloadHash checks the second guard of Put on the real
// server: a PUT with Put's options whose body does not have the declared
// SHA-256 is refused and stores nothing, even sent whole.
func TestServerChecksPayloadHash(t *testing.T) {
	cfg := enginetest.S3(t)
	s := open(t, cfg)
	defer s.Close()
	ctx := context.Background()
	cl, err := minio.New(cfg.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""), Secure: cfg.Secure, Region: cfg.Region})
	if err != nil {
		t.Fatal(err)
	}
	body := []byte("the bytes that were sent")
	other := sha256.Sum256([]byte("the bytes that were declared"))
	_, err = minio.Core{Client: cl}.PutObject(ctx, cfg.Bucket, cfg.Prefix+"f/lie", bytes.NewReader(body), int64(len(body)), "", hex.EncodeToString(other[:]), blobs3.PutOptions(other))
	if err == nil {
		t.Fatal("the server stored a body whose SHA-256 is not the signed one")
	}
	if _, err := s.Stat(ctx, "f/lie"); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("Stat after the refused PUT = %v, want ErrNotFound", err)
	}
}
