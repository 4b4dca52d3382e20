// Package s3 is the blob engine on any S3-compatible server (AWS S3,
// SeaweedFS, Ceph RGW, Garage, ...), through minio-go's Core API, so that
// each blob.Store call is one S3 request (two for Complete and for a read
// beyond the end). It implements blob.Presigner: clients PUT parts and GET
// objects on the server itself, with URLs signed for one part or one
// object and a short lifetime.
//
// Put never leaves a wrong object: the bytes are counted and hashed on
// their way to the server, and the request's last bytes are held back
// until the reader is known to end there with the declared SHA-256, so a
// lying reader breaks the request before the server has a whole body; the
// request also carries the SHA-256 (as its signed payload hash and as
// x-amz-checksum-sha256), which the server checks before it stores.
//
// A Store is safe for concurrent use; it holds only the client.
package s3

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/parley-im/parley/internal/blob"
)

// Config locates the S3 server and bucket.
type Config struct {
	// Endpoint is host[:port] of the S3 API, as clients also reach it
	// (presigned URLs name it).
	Endpoint string
	Bucket   string
	// Region is the bucket's region (us-east-1 when empty); presigning
	// needs it to sign without asking the server.
	Region    string
	AccessKey string
	SecretKey string
	// Secure selects https.
	Secure bool
	// Prefix, if set, is put before every key, so that several stores
	// (test runs, deployments) share one bucket without seeing each
	// other's objects. It is 1–100 bytes of key characters ending in "/".
	Prefix string
}

// DefaultRegion is the region of a Config that names none.
const DefaultRegion = "us-east-1"

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.Endpoint == "" || strings.ContainsAny(c.Endpoint, "/?#@ "):
		return fmt.Errorf("blob/s3: endpoint %q: want host[:port]", c.Endpoint)
	case c.Bucket == "":
		return errors.New("blob/s3: bucket is required")
	case c.AccessKey == "" || c.SecretKey == "":
		return errors.New("blob/s3: access key and secret key are required")
	case c.Prefix != "" && (len(c.Prefix) > 100 || !strings.HasSuffix(c.Prefix, "/") || !blob.ValidKey(c.Prefix+"x")):
		return fmt.Errorf("blob/s3: prefix %q: want 1-100 key characters ending in /", c.Prefix)
	}
	return nil
}

// ParseURL reads a Config from
// http[s]://ACCESS:SECRET@HOST[:PORT]/BUCKET[/PREFIX/][?region=REGION],
// the form of $PARLEY_TEST_S3. Access and secret key are URL-escaped.
func ParseURL(s string) (Config, error) {
	u, err := url.Parse(s)
	if err != nil {
		return Config{}, fmt.Errorf("blob/s3: %w", err)
	}
	var c Config
	switch u.Scheme {
	case "http":
	case "https":
		c.Secure = true
	default:
		return Config{}, fmt.Errorf("blob/s3: %q: scheme must be http or https", s)
	}
	if u.User == nil {
		return Config{}, fmt.Errorf("blob/s3: %q: no ACCESS:SECRET@", s)
	}
	c.AccessKey = u.User.Username()
	c.SecretKey, _ = u.User.Password()
	c.Endpoint = u.Host
	path := strings.TrimPrefix(u.Path, "/")
	c.Bucket, c.Prefix, _ = strings.Cut(path, "/")
	for k, v := range u.Query() {
		if k != "region" || len(v) != 1 {
			return Config{}, fmt.Errorf("blob/s3: %q: unknown parameter %q", s, k)
		}
		c.Region = v[0]
	}
	if u.Fragment != "" || u.Opaque != "" {
		return Config{}, fmt.Errorf("blob/s3: %q: not a URL of the form http://ACCESS:SECRET@HOST/BUCKET", s)
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Store is a blob.Store on one bucket.
type Store struct {
	cfg       Config
	core      minio.Core
	transport *http.Transport
	closed    atomic.Bool
}

var (
	_ blob.Store     = (*Store)(nil)
	_ blob.Presigner = (*Store)(nil)
)

// Open connects to the server and creates the bucket if it is missing.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Region == "" {
		cfg.Region = DefaultRegion
	}
	tr, err := minio.DefaultTransport(cfg.Secure)
	if err != nil {
		return nil, fmt.Errorf("blob/s3: %w", err)
	}
	cl, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:     credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure:    cfg.Secure,
		Region:    cfg.Region,
		Transport: tr,
	})
	if err != nil {
		return nil, fmt.Errorf("blob/s3: %w", err)
	}
	s := &Store{cfg: cfg, core: minio.Core{Client: cl}, transport: tr}
	ok, err := cl.BucketExists(ctx, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("blob/s3: bucket %s at %s: %w", cfg.Bucket, cfg.Endpoint, err)
	}
	if !ok {
		err := cl.MakeBucket(ctx, cfg.Bucket, minio.MakeBucketOptions{Region: cfg.Region})
		if err != nil && !isCode(err, "BucketAlreadyOwnedByYou", "BucketAlreadyExists") {
			return nil, fmt.Errorf("blob/s3: create bucket %s: %w", cfg.Bucket, err)
		}
	}
	return s, nil
}

// Close stops the store; idle connections are closed.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.transport.CloseIdleConnections()
	return nil
}

// check is the common entry check of every call on key.
func (s *Store) check(op, key string) error {
	if s.closed.Load() {
		return fmt.Errorf("blob/s3: %s: %w", op, blob.ErrClosed)
	}
	if !blob.ValidKey(key) {
		return fmt.Errorf("blob/s3: %s %q: %w", op, key, blob.ErrBadKey)
	}
	return nil
}

func (s *Store) name(key string) string { return s.cfg.Prefix + key }

// isCode reports whether err is an S3 error answer with one of codes.
func isCode(err error, codes ...string) bool {
	code := minio.ToErrorResponse(err).Code
	for _, c := range codes {
		if code == c {
			return true
		}
	}
	return false
}

// wrap turns an S3 error into the seam's: the conditions callers branch
// on become the sentinels, the rest keeps the server's words.
func wrap(op, key string, err error) error {
	r := minio.ToErrorResponse(err)
	switch {
	case r.Code == "NoSuchKey" || r.Code == "NoSuchUpload" || (r.Code == "" && r.StatusCode == http.StatusNotFound):
		return fmt.Errorf("blob/s3: %s %q: %w", op, key, blob.ErrNotFound)
	case r.Code == "InvalidPart" || r.Code == "InvalidPartOrder" || r.Code == "EntityTooSmall":
		return fmt.Errorf("blob/s3: %s %q: %w (%s)", op, key, blob.ErrBadParts, r.Code)
	case r.Code == "XAmzContentSHA256Mismatch" || r.Code == "BadDigest":
		return fmt.Errorf("blob/s3: %s %q: %w (%s)", op, key, blob.ErrHash, r.Code)
	case r.Code == "IncompleteBody":
		return fmt.Errorf("blob/s3: %s %q: %w (%s)", op, key, blob.ErrSize, r.Code)
	}
	return fmt.Errorf("blob/s3: %s %q: %w", op, key, err)
}

// checkReader passes size bytes of r on, hashing them when h is set, and
// holds back the bytes of the read that would complete the body until r
// is known to end there (and the hash is want): a reader with more bytes
// or other bytes fails the request before the server has all of it.
type checkReader struct {
	r    io.Reader
	left int64
	h    hash.Hash
	want [32]byte
	err  error // the reason the body was refused, once it was
}

func (c *checkReader) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if c.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	if c.h != nil {
		c.h.Write(p[:n])
	}
	c.left -= int64(n)
	if c.left == 0 {
		if c.err = c.finish(); c.err != nil {
			return 0, c.err
		}
		return n, io.EOF
	}
	switch {
	case err == io.EOF:
		c.err = fmt.Errorf("%w: the reader ended %d bytes early", blob.ErrSize, c.left)
		return 0, c.err
	case err != nil:
		c.err = err
		return 0, err
	}
	return n, nil
}

// finish checks, once size bytes were read, that r has no more and that
// their hash is the declared one.
func (c *checkReader) finish() error {
	var one [1]byte
	for {
		n, err := c.r.Read(one[:])
		if n > 0 {
			return fmt.Errorf("%w: the reader holds more bytes than declared", blob.ErrSize)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	if c.h != nil {
		var got [32]byte
		c.h.Sum(got[:0])
		if got != c.want {
			return blob.ErrHash
		}
	}
	return nil
}

// body returns the reader to send for size bytes of r: the checkReader,
// or for an empty body (which the client sends without reading it) the
// result of checking r at once.
func body(r io.Reader, size int64, h hash.Hash, want [32]byte) (*checkReader, io.Reader, error) {
	c := &checkReader{r: r, left: size, h: h, want: want}
	if size > 0 {
		return c, c, nil
	}
	if err := c.finish(); err != nil {
		return nil, nil, err
	}
	return c, bytes.NewReader(nil), nil
}

// Put stores exactly size bytes of r under key (one PUT).
func (s *Store) Put(ctx context.Context, key string, r io.Reader, size int64, sum [32]byte) error {
	if err := s.check("put", key); err != nil {
		return err
	}
	if size < 0 {
		return fmt.Errorf("blob/s3: put %q: size %d: %w", key, size, blob.ErrSize)
	}
	c, rd, err := body(r, size, sha256.New(), sum)
	if err != nil {
		return fmt.Errorf("blob/s3: put %q: %w", key, err)
	}
	_, err = s.core.PutObject(ctx, s.cfg.Bucket, s.name(key), rd, size, "", hex.EncodeToString(sum[:]), putOptions(sum))
	if c.err != nil {
		return fmt.Errorf("blob/s3: put %q: %w", key, c.err)
	}
	if err != nil {
		return wrap("put", key, err)
	}
	return nil
}

// putOptions are the options of a Put of bytes whose SHA-256 is sum. The
// request's signed payload hash is sum (instead of the per-chunk streaming
// signature), which AWS S3 checks; the x-amz-checksum-sha256 header is
// sum too, which SeaweedFS (ignoring the payload hash) and AWS S3 check.
func putOptions(sum [32]byte) minio.PutObjectOptions {
	return minio.PutObjectOptions{
		ContentType:          "application/octet-stream",
		DisableContentSha256: true,
		UserMetadata:         map[string]string{"X-Amz-Checksum-Sha256": base64.StdEncoding.EncodeToString(sum[:])},
	}
}

// emptyBody reads nothing.
var emptyBody = io.NopCloser(bytes.NewReader(nil))

// Open reads the bytes [off, off+n) of key.
func (s *Store) Open(ctx context.Context, key string, off, n int64) (io.ReadCloser, blob.Info, error) {
	if err := s.check("open", key); err != nil {
		return nil, blob.Info{}, err
	}
	if off < 0 {
		return nil, blob.Info{}, fmt.Errorf("blob/s3: open %q: negative offset %d", key, off)
	}
	if n == 0 {
		info, err := s.Stat(ctx, key)
		if err != nil {
			return nil, blob.Info{}, err
		}
		return emptyBody, info, nil
	}
	var opts minio.GetObjectOptions
	ranged := off > 0 || n > 0
	if ranged {
		end := int64(0) // to the end
		if n > 0 {
			end = off + n - 1
		}
		if err := opts.SetRange(off, end); err != nil {
			return nil, blob.Info{}, fmt.Errorf("blob/s3: open %q: %w", key, err)
		}
	}
	rc, oi, h, err := s.core.GetObject(ctx, s.cfg.Bucket, s.name(key), opts)
	if err != nil {
		if isCode(err, "InvalidRange") {
			// Nothing at off: the object is shorter (or empty).
			info, err := s.Stat(ctx, key)
			if err != nil {
				return nil, blob.Info{}, err
			}
			return emptyBody, info, nil
		}
		return nil, blob.Info{}, wrap("open", key, err)
	}
	info := blob.Info{Size: oi.Size}
	if cr := h.Get("Content-Range"); cr != "" {
		total, err := rangeTotal(cr)
		if err != nil {
			rc.Close()
			return nil, blob.Info{}, fmt.Errorf("blob/s3: open %q: %w", key, err)
		}
		info.Size = total
	}
	return rc, info, nil
}

// rangeTotal returns the object size of a Content-Range "bytes a-b/total".
func rangeTotal(cr string) (int64, error) {
	_, total, ok := strings.Cut(cr, "/")
	if !ok || !strings.HasPrefix(cr, "bytes ") {
		return 0, fmt.Errorf("Content-Range %q", cr)
	}
	v, err := strconv.ParseInt(total, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("Content-Range %q", cr)
	}
	return v, nil
}

// Stat returns key's size.
func (s *Store) Stat(ctx context.Context, key string) (blob.Info, error) {
	if err := s.check("stat", key); err != nil {
		return blob.Info{}, err
	}
	oi, err := s.core.StatObject(ctx, s.cfg.Bucket, s.name(key), minio.StatObjectOptions{})
	if err != nil {
		return blob.Info{}, wrap("stat", key, err)
	}
	return blob.Info{Size: oi.Size}, nil
}

// Delete removes key; S3 answers an absent key like a present one.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := s.check("delete", key); err != nil {
		return err
	}
	if err := s.core.RemoveObject(ctx, s.cfg.Bucket, s.name(key), minio.RemoveObjectOptions{}); err != nil {
		if isCode(err, "NoSuchKey") {
			return nil
		}
		return wrap("delete", key, err)
	}
	return nil
}

// Create starts a multipart upload.
func (s *Store) Create(ctx context.Context, key string) (string, error) {
	if err := s.check("create", key); err != nil {
		return "", err
	}
	id, err := s.core.NewMultipartUpload(ctx, s.cfg.Bucket, s.name(key), minio.PutObjectOptions{ContentType: "application/octet-stream"})
	if err != nil {
		return "", wrap("create", key, err)
	}
	return id, nil
}

// checkUpload is the entry check of the calls on an upload. An empty
// upload id is refused here: S3 reads "?uploadId=" on a PUT or DELETE as
// no upload id at all, that is as a PutObject or DeleteObject.
func (s *Store) checkUpload(op, key, upload string) error {
	if err := s.check(op, key); err != nil {
		return err
	}
	if upload == "" {
		return fmt.Errorf("blob/s3: %s %q: empty upload id: %w", op, key, blob.ErrNotFound)
	}
	return nil
}

// PutPart stores part n of an upload (one PUT).
func (s *Store) PutPart(ctx context.Context, key, upload string, n int, r io.Reader, size int64) (blob.Part, error) {
	if err := s.checkUpload("put part", key, upload); err != nil {
		return blob.Part{}, err
	}
	if n < 1 || n > blob.MaxParts {
		return blob.Part{}, fmt.Errorf("blob/s3: put part %q: part %d: %w", key, n, blob.ErrBadParts)
	}
	if size < 0 {
		return blob.Part{}, fmt.Errorf("blob/s3: put part %q: size %d: %w", key, size, blob.ErrSize)
	}
	c, rd, err := body(r, size, nil, [32]byte{})
	if err != nil {
		return blob.Part{}, fmt.Errorf("blob/s3: put part %q: %w", key, err)
	}
	// Over http the part goes with the streaming signature, whose signed
	// last chunk a cut body lacks: SeaweedFS stores a part whose body
	// ended before its Content-Length as a shorter part.
	p, err := s.core.PutObjectPart(ctx, s.cfg.Bucket, s.name(key), upload, n, rd, size, minio.PutObjectPartOptions{})
	if c.err != nil {
		return blob.Part{}, fmt.Errorf("blob/s3: put part %q: %w", key, c.err)
	}
	if err != nil {
		return blob.Part{}, wrap("put part", key, err)
	}
	return blob.Part{N: n, Size: size, ETag: strings.Trim(p.ETag, `"`)}, nil
}

// Parts lists the parts the server holds.
func (s *Store) Parts(ctx context.Context, key, upload string) ([]blob.Part, error) {
	if err := s.checkUpload("parts", key, upload); err != nil {
		return nil, err
	}
	var parts []blob.Part
	var seen []time.Time
	marker := 0
	for {
		res, err := s.core.ListObjectParts(ctx, s.cfg.Bucket, s.name(key), upload, marker, 1000)
		if err != nil {
			return nil, wrap("parts", key, err)
		}
		for _, p := range res.ObjectParts {
			parts = append(parts, blob.Part{N: p.PartNumber, Size: p.Size, ETag: strings.Trim(p.ETag, `"`)})
			seen = append(seen, p.LastModified)
		}
		if !res.IsTruncated || res.NextPartNumberMarker <= marker {
			return latest(parts, seen), nil
		}
		marker = res.NextPartNumberMarker
	}
}

// latest keeps, of parts listed more than once under one number, the one
// the server received last (its time is seen[i]), and sorts by number.
// AWS S3 lists only the last copy of a part sent again; SeaweedFS lists
// every copy, with times in whole seconds, in no order, so of copies of
// the same second the largest is kept: a part sent again at once is most
// often the retry of one cut short.
func latest(parts []blob.Part, seen []time.Time) []blob.Part {
	at := make(map[int]int, len(parts)) // part number → index in out
	var out []blob.Part
	var when []time.Time
	for i, p := range parts {
		j, ok := at[p.N]
		switch {
		case !ok:
			at[p.N] = len(out)
			out = append(out, p)
			when = append(when, seen[i])
		case seen[i].After(when[j]), seen[i].Equal(when[j]) && p.Size > out[j].Size:
			out[j], when[j] = p, seen[i]
		}
	}
	slices.SortFunc(out, func(a, b blob.Part) int { return a.N - b.N })
	return out
}

// Complete checks parts against the server's list (numbers 1..k, sizes,
// tags, MinPartSize: not every S3 server checks all of them), then joins
// them.
func (s *Store) Complete(ctx context.Context, key, upload string, parts []blob.Part) error {
	if err := s.checkUpload("complete", key, upload); err != nil {
		return err
	}
	have, err := s.Parts(ctx, key, upload)
	if err != nil {
		return err
	}
	if err := blob.CheckParts(parts, have); err != nil {
		return fmt.Errorf("blob/s3: complete %q: %w", key, err)
	}
	cp := make([]minio.CompletePart, len(parts))
	for i, p := range parts {
		cp[i] = minio.CompletePart{PartNumber: p.N, ETag: p.ETag}
	}
	if _, err := s.core.CompleteMultipartUpload(ctx, s.cfg.Bucket, s.name(key), upload, cp, minio.PutObjectOptions{}); err != nil {
		return wrap("complete", key, err)
	}
	return nil
}

// Abort forgets an upload.
func (s *Store) Abort(ctx context.Context, key, upload string) error {
	if err := s.check("abort", key); err != nil {
		return err
	}
	if upload == "" {
		return nil
	}
	if err := s.core.AbortMultipartUpload(ctx, s.cfg.Bucket, s.name(key), upload); err != nil {
		if isCode(err, "NoSuchUpload") {
			return nil
		}
		return wrap("abort", key, err)
	}
	return nil
}

// checkTTL keeps ttl within what S3 signs: 1 s to 7 days.
func checkTTL(ttl time.Duration) error {
	if ttl < time.Second || ttl > 7*24*time.Hour {
		return fmt.Errorf("blob/s3: presign: ttl %v outside 1s..7d", ttl)
	}
	return nil
}

// PresignPart returns a URL that PUTs part n of the upload.
func (s *Store) PresignPart(ctx context.Context, key, upload string, n int, ttl time.Duration) (string, error) {
	if err := s.checkUpload("presign part", key, upload); err != nil {
		return "", err
	}
	if n < 1 || n > blob.MaxParts {
		return "", fmt.Errorf("blob/s3: presign part %q: part %d: %w", key, n, blob.ErrBadParts)
	}
	if err := checkTTL(ttl); err != nil {
		return "", err
	}
	q := url.Values{"partNumber": {strconv.Itoa(n)}, "uploadId": {upload}}
	u, err := s.core.Presign(ctx, http.MethodPut, s.cfg.Bucket, s.name(key), ttl, q)
	if err != nil {
		return "", wrap("presign part", key, err)
	}
	return u.String(), nil
}

// PresignGet returns a URL that GETs key (Range requests included) with
// the response headers of o.
func (s *Store) PresignGet(ctx context.Context, key string, ttl time.Duration, o blob.GetOptions) (string, error) {
	if err := s.check("presign get", key); err != nil {
		return "", err
	}
	if err := checkTTL(ttl); err != nil {
		return "", err
	}
	q := url.Values{}
	if o.ContentType != "" {
		q.Set("response-content-type", o.ContentType)
	}
	if o.ContentDisposition != "" {
		q.Set("response-content-disposition", o.ContentDisposition)
	}
	u, err := s.core.PresignedGetObject(ctx, s.cfg.Bucket, s.name(key), ttl, q)
	if err != nil {
		return "", wrap("presign get", key, err)
	}
	return u.String(), nil
}
