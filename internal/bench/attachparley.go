package bench

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/jpeg"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parley-im/parley/internal/auth"
	blobs3 "github.com/parley-im/parley/internal/blob/s3"
	"github.com/parley-im/parley/protocol"
)

// parleyNode is a `parley serve` child with attachments on one engine and
// the two users of the benchmark's direct conversation.
type parleyNode struct {
	srv    *Server
	base   string // http://host:port
	tokens map[string]string
	conv   uint64
	http   *http.Client
	rid    atomic.Uint64
	cmid   atomic.Uint64
	// firstRSSErr is the first error of the RSS run's uploads.
	firstRSSErr string
}

// startParley starts a node whose attachments live on engine.
func startParley(ctx context.Context, engine string, cfg AttachConfig, dir string) (*parleyNode, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := auth.LoadOrCreateDevKey(dir)
	if err != nil {
		return nil, err
	}
	maxFile := max(cfg.BigBytes, cfg.SmallBytes, 8<<20)
	env := []string{
		"PARLEY_ATTACH_ENGINE=" + engine,
		"PARLEY_ATTACH_MAX_FILE_BYTES=" + strconv.FormatInt(maxFile, 10),
		"PARLEY_ATTACH_PART_BYTES=" + strconv.FormatInt(cfg.PartBytes, 10),
		// One user sends every file: no quota or in-flight limit of a
		// person's may stop the benchmark.
		"PARLEY_ATTACH_USER_QUOTA_BYTES=" + strconv.FormatInt(1<<50, 10),
		"PARLEY_ATTACH_UPLOADS_IN_FLIGHT=100000",
	}
	if engine == "s3" {
		c, err := blobs3.ParseURL(cfg.S3)
		if err != nil {
			return nil, err
		}
		env = append(env, "PARLEY_ATTACH_S3_ENDPOINT="+c.Endpoint, "PARLEY_ATTACH_S3_BUCKET="+c.Bucket,
			"PARLEY_ATTACH_S3_ACCESS_KEY="+c.AccessKey, "PARLEY_ATTACH_S3_SECRET_KEY="+c.SecretKey,
			"PARLEY_ATTACH_S3_SECURE="+strconv.FormatBool(c.Secure))
	}
	var logs io.Writer = io.Discard
	if cfg.ServerLog != nil {
		logs = cfg.ServerLog
	}
	srv, err := StartServer(ctx, ServerConfig{Binary: cfg.ServerBinary, DataDir: dir, Env: env, Stderr: logs})
	if err != nil {
		return nil, err
	}
	n := &parleyNode{srv: srv, base: "http://" + srv.Addr, tokens: map[string]string{},
		// An idle connection is dropped well before the node's keep-alive
		// (gateway.header_timeout, 10 s) closes it: a request sent on a
		// connection the node is closing at that moment fails (EOF, or a
		// reset for a PUT, whose body cannot be sent again).
		http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1000, MaxConnsPerHost: 0, IdleConnTimeout: 5 * time.Second}}}
	now := time.Now()
	for _, u := range []string{"alice", "bob"} {
		tok, err := auth.MintHS256(key, auth.Claims{User: u, IssuedAt: now, Expires: now.Add(24 * time.Hour)})
		if err != nil {
			n.stop()
			return nil, err
		}
		n.tokens[u] = tok
	}
	f, err := n.rpc(ctx, "alice", protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "bob"})
	if err != nil {
		n.stop()
		return nil, err
	}
	if f.Conv == nil {
		n.stop()
		return nil, fmt.Errorf("open_direct answered %+v", f)
	}
	n.conv = f.Conv.ConvID
	return n, nil
}

func (n *parleyNode) stop() error {
	n.http.CloseIdleConnections()
	return n.srv.Stop()
}

// rpc sends one frame as user over POST /v1/rpc and returns the answer;
// an error frame is an error.
func (n *parleyNode) rpc(ctx context.Context, user string, f protocol.Frame) (*protocol.Frame, error) {
	f.RID = strconv.FormatUint(n.rid.Add(1), 10)
	body, err := json.Marshal(f)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.base+"/v1/rpc?device=bench", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+n.tokens[user])
	// Replayable: the client sends it again on another connection when the
	// server closed an idle one before reading anything of it.
	req.Header.Set("Idempotency-Key", f.RID)
	resp, err := n.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.Type, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.Type, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s %s", f.Type, resp.Status, b)
	}
	var out protocol.Frame
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("%s: %w in %s", f.Type, err, b)
	}
	if out.Type == "error" {
		return &out, fmt.Errorf("%s: %s: %s", f.Type, out.Code, out.Error)
	}
	return &out, nil
}

// upload sends size bytes of the pattern from seed as alice's file, the
// way a client does: upload_create, then per part upload_part and a PUT to
// the URL it names, then upload_complete. It returns the attachment id.
func (n *parleyNode) upload(ctx context.Context, seed, size int64, mediaType string, body func(off, size int64) io.Reader, sum [32]byte) (uint64, error) {
	f, err := n.rpc(ctx, "alice", protocol.Frame{Type: protocol.TypeUploadCreate, ConvID: n.conv, Size: size,
		SHA256: hex.EncodeToString(sum[:]), MediaType: mediaType, Name: "bench-" + strconv.FormatInt(seed, 10)})
	if err != nil {
		return 0, err
	}
	up := f.Upload
	for p := 1; p <= up.Parts; p++ {
		f, err := n.rpc(ctx, "alice", protocol.Frame{Type: protocol.TypeUploadPart, AttachmentID: up.AttachmentID, Part: p})
		if err != nil {
			return 0, err
		}
		u := f.Upload.URL
		if strings.HasPrefix(u, "/") {
			u = n.base + u
		}
		off := int64(p-1) * up.PartSize
		psize := min(up.PartSize, size-off)
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, body(off, psize))
		if err != nil {
			return 0, err
		}
		req.ContentLength = psize
		resp, err := n.http.Do(req)
		if err != nil {
			return 0, fmt.Errorf("PUT part %d: %w", p, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("PUT part %d: %s %s", p, resp.Status, b)
		}
	}
	if err := n.complete(ctx, up.AttachmentID); err != nil {
		return 0, err
	}
	return up.AttachmentID, nil
}

// complete sends upload_complete until it answers the upload: not_ready
// (an S3 read back still running) is sent again after its
// retry_after_ms, as the SDKs do.
func (n *parleyNode) complete(ctx context.Context, id uint64) error {
	for {
		f, err := n.rpc(ctx, "alice", protocol.Frame{Type: protocol.TypeUploadComplete, AttachmentID: id})
		if err == nil || f == nil || f.Code != protocol.CodeNotReady {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(max(f.RetryAfter, 100)) * time.Millisecond):
		}
	}
}

// send makes a file message of the attachment and returns its seq.
func (n *parleyNode) send(ctx context.Context, id uint64) (uint64, error) {
	f, err := n.rpc(ctx, "alice", protocol.Frame{Type: protocol.TypeSend, ConvID: n.conv, Kind: protocol.KindFile,
		AttachmentID: id, ClientMsgID: "bench-" + strconv.FormatUint(n.cmid.Add(1), 10)})
	if err != nil {
		return 0, err
	}
	return f.Seq, nil
}

// download reads the file (or thumbnail) of message seq as bob:
// attachment_url, then a GET of its URL. It returns the bytes read.
func (n *parleyNode) download(ctx context.Context, seq uint64, thumbnail bool) (int64, error) {
	f, err := n.rpc(ctx, "bob", protocol.Frame{Type: protocol.TypeAttachmentURL, ConvID: n.conv, Seq: seq, Thumbnail: thumbnail})
	if err != nil {
		return 0, err
	}
	u := f.Attachment.URL
	if strings.HasPrefix(u, "/") {
		u = n.base + u
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	resp, err := n.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return 0, fmt.Errorf("GET %s: %s %s", u, resp.Status, b)
	}
	return io.Copy(io.Discard, resp.Body)
}

// parleyRuns measures uploads and downloads through a node: the big file,
// then Concurrency small ones at once; with RSSUploads, the node's RSS
// during that many concurrent big uploads; and the time from a JPEG's
// upload_complete to its first thumbnail served.
func parleyRuns(ctx context.Context, engine string, cfg AttachConfig, layer, big, small string, add func(engine, layer, op string, bytes int64, d time.Duration), rep *AttachReport) error {
	n, err := startParley(ctx, engine, cfg, filepath.Join(cfg.Dir, "node-"+engine+"-"+strconv.FormatInt(time.Now().UnixNano(), 36)))
	if err != nil {
		return fmt.Errorf("parley on %s: %w", engine, err)
	}
	err = parleyMeasure(ctx, n, engine, cfg, layer, big, small, add, rep)
	if serr := n.stop(); err == nil {
		err = serr
	}
	return err
}

func parleyMeasure(ctx context.Context, n *parleyNode, engine string, cfg AttachConfig, layer, big, small string, add func(engine, layer, op string, bytes int64, d time.Duration), rep *AttachReport) error {
	key := engine // of the report's maps
	if layer != "parley" {
		key = engine + strings.TrimPrefix(layer, "parley")
	}
	body := func(seed int64) func(off, size int64) io.Reader {
		return func(off, size int64) io.Reader { return newPayload(seed+off, size) }
	}
	const octets = "application/octet-stream"
	t0 := time.Now()
	id, err := n.upload(ctx, 0, cfg.BigBytes, octets, body(0), payloadSum(0, cfg.BigBytes))
	if err != nil {
		return err
	}
	add(engine, layer, "up "+big, cfg.BigBytes, time.Since(t0))
	seq, err := n.send(ctx, id)
	if err != nil {
		return err
	}
	t0 = time.Now()
	if got, err := n.download(ctx, seq, false); err != nil || got != cfg.BigBytes {
		return fmt.Errorf("download: %d bytes, %v", got, err)
	}
	add(engine, layer, "down "+big, cfg.BigBytes, time.Since(t0))

	sums := make([][32]byte, cfg.Concurrency)
	for i := range sums {
		sums[i] = payloadSum(int64(i), cfg.SmallBytes)
	}
	ids := make([]uint64, cfg.Concurrency)
	d, err := parallel(cfg.Concurrency, func(i int) error {
		var err error
		ids[i], err = n.upload(ctx, int64(i), cfg.SmallBytes, octets, body(int64(i)), sums[i])
		return err
	})
	if err != nil {
		return err
	}
	add(engine, layer, "up "+small, cfg.SmallBytes*int64(cfg.Concurrency), d)
	seqs := make([]uint64, cfg.Concurrency)
	for i, id := range ids {
		if seqs[i], err = n.send(ctx, id); err != nil {
			return err
		}
	}
	d, err = parallel(cfg.Concurrency, func(i int) error {
		got, err := n.download(ctx, seqs[i], false)
		if err == nil && got != cfg.SmallBytes {
			err = fmt.Errorf("download: %d bytes, want %d", got, cfg.SmallBytes)
		}
		return err
	})
	if err != nil {
		return err
	}
	add(engine, layer, "down "+small, cfg.SmallBytes*int64(cfg.Concurrency), d)

	if cfg.Thumbnail {
		d, err := firstThumbnail(ctx, n)
		if err != nil {
			return fmt.Errorf("thumbnail: %w", err)
		}
		if rep.Thumbnail == nil {
			rep.Thumbnail = map[string]time.Duration{}
		}
		rep.Thumbnail[key] = d
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, "%-5s %-11s first thumbnail   %8.3f s after upload_complete (a %dx%d JPEG)\n", engine, layer, d.Seconds(), thumbW, thumbH)
		}
	}
	if cfg.RSSUploads > 0 {
		idle, peak, failed, err := parleyRSS(ctx, n, cfg, body(0))
		if err != nil {
			return err
		}
		if failed > 0 && cfg.Log != nil {
			fmt.Fprintf(cfg.Log, "%-5s %-11s %d of the %d concurrent uploads failed (the RSS was sampled all the same): %v\n", engine, layer, failed, cfg.RSSUploads, n.firstRSSErr)
		}
		if rep.ServerRSSIdle == nil {
			rep.ServerRSSIdle, rep.ServerRSSPeak, rep.ServerRSSFailed = map[string]int64{}, map[string]int64{}, map[string]int{}
		}
		rep.ServerRSSIdle[key], rep.ServerRSSPeak[key], rep.ServerRSSFailed[key] = idle, peak, failed
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, "%-5s %-11s server RSS during %d concurrent %s uploads: idle %.1f MiB, peak %.1f MiB (+%.1f)\n",
				engine, layer, cfg.RSSUploads, sizeName(cfg.BigBytes), float64(idle)/(1<<20), float64(peak)/(1<<20), float64(peak-idle)/(1<<20))
		}
	}
	return nil
}

// parleyRSS samples the node's RSS every 50 ms while RSSUploads uploads
// of BigBytes run at once, and counts the uploads that failed.
func parleyRSS(ctx context.Context, n *parleyNode, cfg AttachConfig, body func(off, size int64) io.Reader) (idle, peak int64, failed int, err error) {
	sum := payloadSum(0, cfg.BigBytes)
	if idle, err = ReadVmRSS(n.srv.PID()); err != nil {
		return 0, 0, 0, err
	}
	var mu sync.Mutex
	peak = idle
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if v, err := ReadVmRSS(n.srv.PID()); err == nil {
					mu.Lock()
					peak = max(peak, v)
					mu.Unlock()
				}
			}
		}
	})
	var nfailed atomic.Int64
	var firstErr atomic.Value
	_, _ = parallel(cfg.RSSUploads, func(i int) error {
		if _, err := n.upload(ctx, int64(1000+i), cfg.BigBytes, "application/octet-stream", body, sum); err != nil {
			nfailed.Add(1)
			firstErr.CompareAndSwap(nil, err.Error())
			if cfg.Log != nil {
				fmt.Fprintf(cfg.Log, "upload %d failed: %v\n", i, err)
			}
		}
		return nil
	})
	close(stop)
	wg.Wait()
	if e, ok := firstErr.Load().(string); ok {
		n.firstRSSErr = e
	}
	return idle, peak, int(nfailed.Load()), ctx.Err()
}

const thumbW, thumbH = 4000, 3000

// firstThumbnail uploads a JPEG photo-sized image and returns the time
// from the upload_complete answer to the first thumbnail served: the
// thumbnail is made off the request path, and attachment_url answers
// not_ready until it is.
func firstThumbnail(ctx context.Context, n *parleyNode) (time.Duration, error) {
	img := image.NewRGBA(image.Rect(0, 0, thumbW, thumbH))
	for y := range thumbH {
		for x := range thumbW {
			img.Set(x, y, color.RGBA{uint8(x), uint8(y), uint8(x ^ y), 255})
		}
	}
	var buf bytes.Buffer
	if err := jpeg.Encode(&buf, img, &jpeg.Options{Quality: 85}); err != nil {
		return 0, err
	}
	b := buf.Bytes()
	sum := sha256Sum(b)
	f, err := n.rpc(ctx, "alice", protocol.Frame{Type: protocol.TypeUploadCreate, ConvID: n.conv, Size: int64(len(b)),
		SHA256: hex.EncodeToString(sum[:]), MediaType: "image/jpeg", Name: "photo.jpg"})
	if err != nil {
		return 0, err
	}
	up := f.Upload
	for p := 1; p <= up.Parts; p++ {
		f, err := n.rpc(ctx, "alice", protocol.Frame{Type: protocol.TypeUploadPart, AttachmentID: up.AttachmentID, Part: p})
		if err != nil {
			return 0, err
		}
		u := f.Upload.URL
		if strings.HasPrefix(u, "/") {
			u = n.base + u
		}
		off := int64(p-1) * up.PartSize
		end := min(off+up.PartSize, int64(len(b)))
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, bytes.NewReader(b[off:end]))
		if err != nil {
			return 0, err
		}
		resp, err := n.http.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("PUT part %d: %s", p, resp.Status)
		}
	}
	done, err := n.rpc(ctx, "alice", protocol.Frame{Type: protocol.TypeUploadComplete, AttachmentID: up.AttachmentID})
	if err != nil {
		return 0, err
	}
	if th := done.Upload.Thumbnail; th != protocol.ThumbPending && th != protocol.ThumbReady {
		return 0, fmt.Errorf("upload_complete of a %dx%d JPEG: thumbnail %q (width %d, height %d)", thumbW, thumbH, th, done.Upload.Width, done.Upload.Height)
	}
	t0 := time.Now()
	seq, err := n.send(ctx, up.AttachmentID)
	if err != nil {
		return 0, err
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		got, err := n.download(ctx, seq, true)
		if err == nil && got > 0 {
			return time.Since(t0), nil
		}
		if err != nil && !strings.Contains(err.Error(), string(protocol.CodeNotReady)) {
			return 0, err
		}
		time.Sleep(10 * time.Millisecond)
	}
	return 0, errors.New("no thumbnail within a minute")
}
