package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/parley-im/parley/internal/attach"
	"github.com/parley-im/parley/internal/blob"
	"github.com/parley-im/parley/internal/blob/disk"
	blobs3 "github.com/parley-im/parley/internal/blob/s3"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// openAttach builds the attachment service of the chat role (nil with
// attachments off): the blob engine attach.engine names, under
// data_dir/blobs or on the S3 server, and on the embedded engine the key
// of the node's signed URLs (data_dir/attach.key).
func (s *Server) openAttach(st store.Store, ids attach.IDs) (*attach.Service, error) {
	cfg := s.cfg.Attach
	if !cfg.Enabled() {
		return nil, nil
	}
	bs, err := s.openBlobs(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Engine == attach.EngineDisk {
		if cfg.Key, err = attach.LoadOrCreateKey(s.cfg.DataDir); err != nil {
			bs.Close()
			return nil, fmt.Errorf("server: %w", err)
		}
	}
	svc, err := attach.New(cfg, st, bs, ids, s.log, s.now)
	if err != nil {
		bs.Close()
		return nil, fmt.Errorf("server: %w", err)
	}
	s.onClose(bs.Close)
	return svc, nil
}

// openBlobs opens the blob engine of cfg.
func (s *Server) openBlobs(cfg attach.Config) (blob.Store, error) {
	if cfg.Engine == attach.EngineDisk {
		bs, err := disk.Open(filepath.Join(s.cfg.DataDir, "blobs"))
		if err != nil {
			return nil, fmt.Errorf("server: open blobs: %w", err)
		}
		return bs, nil
	}
	secret := cfg.S3.SecretKey
	if cfg.S3.SecretKeyFile != "" {
		b, err := os.ReadFile(cfg.S3.SecretKeyFile)
		if err != nil {
			return nil, fmt.Errorf("server: attach.s3.secret_key_file: %w", err)
		}
		secret = strings.TrimSpace(string(b))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bs, err := blobs3.Open(ctx, blobs3.Config{
		Endpoint: cfg.S3.Endpoint, Bucket: cfg.S3.Bucket, Region: cfg.S3.Region,
		AccessKey: cfg.S3.AccessKey, SecretKey: secret, Secure: cfg.S3.Secure,
	})
	if err != nil {
		return nil, fmt.Errorf("server: open S3 blobs: %w", err)
	}
	return bs, nil
}

// Attach returns the attachment service (nil without the chat role or
// with attachments off).
func (s *Server) Attach() *attach.Service { return s.attach }

// embeddedUploads reports whether this node serves Parley's own upload
// endpoint (the attachment service's target is the node itself).
func (s *Server) embeddedUploads() bool {
	return s.attach != nil && s.attach.Target() == protocol.TargetParley
}
