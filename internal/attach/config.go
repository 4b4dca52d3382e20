package attach

import (
	"time"

	"github.com/parley-im/parley/internal/blob"
	"github.com/parley-im/parley/internal/settings"
)

// Blob engines.
const (
	EngineDisk = "disk" // files under data_dir/blobs (the embedded default)
	EngineS3   = "s3"   // an S3-compatible server (cluster mode)
)

// Config tunes attachments. Each field with a yaml tag is a server setting
// under attach. (package settings): its key, help and, from DefaultConfig,
// its default are declared here and nowhere else.
type Config struct {
	Engine string `yaml:"engine" help:"where attachment bytes live: disk (under data_dir/blobs; embedded node only) or s3"`
	// MaxFileBytes is the largest file an upload may declare; 0 turns
	// attachments off (the upload frames answer invalid_argument, hello
	// announces max_file_bytes 0).
	MaxFileBytes int64 `yaml:"max_file_bytes" help:"largest file an upload may declare, in bytes (too_large over it); 0 turns attachments off"`
	// PartBytes is the size of every part of an upload but the last.
	PartBytes int64 `yaml:"part_bytes" help:"size of every part of an upload but the last, in bytes (at least 5 MiB)"`
	// UserQuotaBytes bounds the bytes of every file one user has stored
	// or is uploading; UploadsInFlight the uploads one user has not
	// completed.
	UserQuotaBytes  int64 `yaml:"user_quota_bytes" help:"bytes of all the files one user has stored or is uploading (quota_exceeded over it)"`
	UploadsInFlight int   `yaml:"uploads_in_flight" help:"uploads one user may have not completed at once (too_many_uploads over it)"`
	// UnattachedTTL: an upload not completed, or completed and named by no
	// message, is deleted this long after it was created (or completed).
	UnattachedTTL time.Duration `yaml:"unattached_ttl" help:"an upload not completed, or completed and named by no message, is deleted after this long"`
	// URLTTL is the lifetime of the upload and download URLs the server
	// hands out.
	URLTTL time.Duration `yaml:"url_ttl" help:"lifetime of the upload and download URLs"`
	// MaxImagePixels: an image whose header declares more pixels gets no
	// thumbnail (it is never decoded); ThumbnailPx is the longest side of
	// a thumbnail.
	MaxImagePixels int64         `yaml:"max_image_pixels" help:"images with more pixels (width × height, from the header) get no thumbnail"`
	ThumbnailPx    int           `yaml:"thumbnail_px" help:"longest side of a thumbnail, in pixels"`
	GCInterval     time.Duration `yaml:"gc_interval" help:"how often expired uploads, unattached files and deleted attachments are cleaned up"`
	// S3 is the server of engine s3.
	S3 S3 `yaml:"s3"`

	// Key signs Parley's own upload and download URLs (the server reads
	// it from data_dir/attach.key, made at first start); 32 bytes.
	Key []byte `yaml:"-"`
}

// S3 names the S3-compatible server of engine s3.
type S3 struct {
	Endpoint      string `yaml:"endpoint" help:"S3 endpoint, host:port (engine s3)"`
	Bucket        string `yaml:"bucket" help:"S3 bucket of the attachments (created if missing)"`
	Region        string `yaml:"region" help:"S3 region"`
	AccessKey     string `yaml:"access_key" help:"S3 access key id"`
	SecretKey     string `yaml:"secret_key" help:"S3 secret key (or secret_key_file)"`
	SecretKeyFile string `yaml:"secret_key_file" help:"file holding the S3 secret key"`
	Secure        bool   `yaml:"secure" help:"use HTTPS to reach the S3 endpoint (and in presigned URLs)"`
}

// DefaultConfig returns the defaults: files up to 100 MiB in 8 MiB parts,
// 2 GiB and 8 uploads in flight per user, unattached files kept a day.
func DefaultConfig() Config {
	return Config{
		Engine:          EngineDisk,
		S3:              S3{Bucket: "parley", Region: "us-east-1"},
		MaxFileBytes:    100 << 20,
		PartBytes:       8 << 20,
		UserQuotaBytes:  2 << 30,
		UploadsInFlight: 8,
		UnattachedTTL:   24 * time.Hour,
		URLTTL:          5 * time.Minute,
		MaxImagePixels:  50_000_000,
		ThumbnailPx:     320,
		GCInterval:      time.Minute,
	}
}

// Enabled reports whether attachments are on.
func (c Config) Enabled() bool { return c.MaxFileBytes > 0 }

// maxURLTTL is the longest lifetime of an S3 presigned URL (SigV4).
const maxURLTTL = 7 * 24 * time.Hour

// Validate reports every setting attachments cannot run with, by key (a
// *settings.Error). The key is not checked here (the server provides it).
func (c Config) Validate() error {
	var p settings.Problems
	p.Check(c.Engine == EngineDisk || c.Engine == EngineS3, "engine", "%q is not %s or %s", c.Engine, EngineDisk, EngineS3)
	p.Check(c.MaxFileBytes >= 0, "max_file_bytes", "must not be negative (0: attachments off), got %d", c.MaxFileBytes)
	if !c.Enabled() {
		return p.Err("attach")
	}
	p.Check(c.PartBytes >= blob.MinPartSize, "part_bytes", "must be at least %d (5 MiB, S3's smallest part), got %d", blob.MinPartSize, c.PartBytes)
	if c.Engine == EngineS3 {
		p.Check(c.S3.Endpoint != "", "s3.endpoint", "engine s3 needs an endpoint (host:port)")
		p.Check(c.S3.Bucket != "", "s3.bucket", "must not be empty")
		p.Check(c.S3.SecretKey == "" || c.S3.SecretKeyFile == "", "s3.secret_key_file", "set either s3.secret_key or s3.secret_key_file, not both")
	}
	if c.PartBytes >= 1 {
		parts := (c.MaxFileBytes + c.PartBytes - 1) / c.PartBytes
		p.Check(parts <= blob.MaxParts, "part_bytes", "max_file_bytes (%d) needs %d parts of %d bytes, over the %d an upload may have", c.MaxFileBytes, parts, c.PartBytes, blob.MaxParts)
	}
	p.Check(c.UserQuotaBytes >= 1, "user_quota_bytes", "must be positive, got %d", c.UserQuotaBytes)
	p.Check(c.UploadsInFlight >= 1, "uploads_in_flight", "must be at least 1, got %d", c.UploadsInFlight)
	p.Check(c.UnattachedTTL >= time.Second, "unattached_ttl", "must be at least 1s, got %v", c.UnattachedTTL)
	p.Check(c.URLTTL >= time.Second && c.URLTTL <= maxURLTTL, "url_ttl", "must be within 1s-168h (S3's presigned URLs last at most 7 days), got %v", c.URLTTL)
	p.Check(c.MaxImagePixels >= 1, "max_image_pixels", "must be positive, got %d", c.MaxImagePixels)
	p.Check(c.ThumbnailPx >= 16 && c.ThumbnailPx <= 4096, "thumbnail_px", "must be in 16-4096, got %d", c.ThumbnailPx)
	p.Check(c.GCInterval >= 10*time.Millisecond, "gc_interval", "must be at least 10ms, got %v", c.GCInterval)
	return p.Err("attach")
}

// parts is the number of parts of a file of size bytes (1 for an empty
// file).
func (c Config) parts(size int64) int {
	if size <= 0 {
		return 1
	}
	return int((size + c.PartBytes - 1) / c.PartBytes)
}
