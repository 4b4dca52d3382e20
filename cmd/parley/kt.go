package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/mod/sumdb/note"

	"github.com/parley-im/parley/protocol"
	pkt "github.com/parley-im/parley/protocol/kt"
)

const ktUsage = `parley kt audit -server URL [-state FILE]

Verifies a Parley server's key transparency log from outside, over its
public GETs (/v1/kt/keys, /v1/kt/checkpoint, /v1/kt/leaves,
/v1/kt/consistency): every leaf decodes, each label's versions chain by
hash, times never go back, the leaves give the signed checkpoint's root,
and — with -state — the checkpoint extends the one the last audit
accepted, under the same keys. The state file then holds this audit's
checkpoint. Exit status 1 on any failure.
`

// runKT runs `parley kt …`.
func runKT(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 || args[0] != "audit" {
		fmt.Fprint(os.Stderr, ktUsage)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			return flag.ErrHelp
		}
		return errors.New("kt: the only command is audit")
	}
	flags := flag.NewFlagSet("parley kt audit", flag.ContinueOnError)
	flags.Usage = func() { fmt.Fprint(flags.Output(), ktUsage+"\nflags:\n"); flags.PrintDefaults() }
	server := flags.String("server", "", "the server's HTTP base URL, e.g. https://chat.example.org (required)")
	state := flags.String("state", "", "file keeping the last audited checkpoint and the log's keys (created if missing)")
	timeout := flags.Duration("timeout", 30*time.Second, "timeout of each request")
	if err := flags.Parse(args[1:]); err != nil {
		return err
	}
	if *server == "" || flags.NArg() != 0 {
		flags.Usage()
		return errors.New("kt audit: -server URL is required")
	}
	res, err := ktAudit(ctx, &http.Client{Timeout: *timeout}, *server, *state)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "kt audit: %s: %d entries (%d users), size %d, root %x…, consistent with %s; %v\n",
		res.Origin, res.Entries, res.Labels, res.Size, res.Root[:8], res.Since, res.Elapsed.Round(time.Millisecond))
	return nil
}

// ktState is the audit's state file.
type ktState struct {
	Origin     string `json:"origin"`
	NoteKey    string `json:"note_key"`
	VRFKey     []byte `json:"vrf_key"`
	Checkpoint string `json:"checkpoint"` // the last audited, signed
}

// ktAuditResult is what an audit found.
type ktAuditResult struct {
	Origin        string
	Entries, Size uint64
	Labels        int
	Root          [32]byte
	Since         string // what the checkpoint was checked against
	Elapsed       time.Duration
	NewCheckpoint string
}

// ktAudit audits the log of the server at base and, with statePath,
// checks it against and then records the last audited checkpoint.
func ktAudit(ctx context.Context, hc *http.Client, base, statePath string) (ktAuditResult, error) {
	start := time.Now()
	var res ktAuditResult
	base = strings.TrimRight(base, "/")
	var prev *ktState
	if statePath != "" {
		b, err := os.ReadFile(statePath)
		switch {
		case err == nil:
			prev = new(ktState)
			if err := json.Unmarshal(b, prev); err != nil {
				return res, fmt.Errorf("kt audit: state %s: %w", statePath, err)
			}
		case !errors.Is(err, os.ErrNotExist):
			return res, fmt.Errorf("kt audit: %w", err)
		}
	}
	var keys protocol.KTKeys
	if err := ktGet(ctx, hc, base+"/v1/kt/keys", &keys); err != nil {
		return res, err
	}
	if prev != nil && (keys.NoteKey != prev.NoteKey || !bytes.Equal(keys.VRFKey, prev.VRFKey) || keys.Origin != prev.Origin) {
		return res, fmt.Errorf("kt audit: the server's log keys changed since the last audit (origin %q, key %q; was %q, %q): a new log, not an extension of the audited one",
			keys.Origin, keys.NoteKey, prev.Origin, prev.NoteKey)
	}
	v, err := note.NewVerifier(keys.NoteKey)
	if err != nil || v.Name() != keys.Origin || len(keys.VRFKey) != pkt.VRFPublicSize {
		return res, fmt.Errorf("kt audit: the server's log keys are malformed: %v", err)
	}
	var head protocol.KTProof
	if err := ktGet(ctx, hc, base+"/v1/kt/checkpoint", &head); err != nil {
		return res, err
	}
	cp, err := pkt.OpenCheckpoint(v, []byte(head.Checkpoint))
	if err != nil {
		return res, fmt.Errorf("kt audit: checkpoint: %w", err)
	}
	a := pkt.NewAuditor()
	res.Since = "nothing (first audit)"
	var last pkt.Checkpoint
	if prev != nil {
		if last, err = pkt.OpenCheckpoint(v, []byte(prev.Checkpoint)); err != nil {
			return res, fmt.Errorf("kt audit: state %s: checkpoint: %w", statePath, err)
		}
		if cp.Size < last.Size {
			return res, fmt.Errorf("kt audit: %w: the server's checkpoint has %d leaves, the last audit's %d", pkt.ErrRollback, cp.Size, last.Size)
		}
		a.Resume(last)
		res.Since = fmt.Sprintf("the last audit's checkpoint of %d", last.Size)
	}
	for a.Size() < cp.Size {
		var page protocol.KTProof
		if err := ktGet(ctx, hc, fmt.Sprintf("%s/v1/kt/leaves?from=%d&limit=%d", base, a.Size(), protocol.MaxKTLeaves), &page); err != nil {
			return res, err
		}
		pc, err := pkt.OpenCheckpoint(v, []byte(page.Checkpoint))
		if err != nil {
			return res, fmt.Errorf("kt audit: leaves from %d: checkpoint: %w", a.Size(), err)
		}
		if pc.Size < cp.Size {
			return res, fmt.Errorf("kt audit: %w: a page came with a checkpoint of %d leaves after one of %d", pkt.ErrRollback, pc.Size, cp.Size)
		}
		if page.From != a.Size() || len(page.Entries) == 0 {
			return res, fmt.Errorf("kt audit: leaves from %d: the server answered %d leaves from %d", a.Size(), len(page.Entries), page.From)
		}
		entries := page.Entries
		if n := cp.Size - a.Size(); uint64(len(entries)) > n {
			entries = entries[:n]
		}
		if err := a.Feed(entries); err != nil {
			return res, fmt.Errorf("kt audit: %w", err)
		}
	}
	if err := a.Check(cp); err != nil {
		return res, fmt.Errorf("kt audit: %w", err)
	}
	if prev != nil && last.Size > 0 {
		// The leaves already prove it; the server's own proof must agree.
		var cons protocol.KTProof
		if err := ktGet(ctx, hc, fmt.Sprintf("%s/v1/kt/consistency?from=%d&to=%d", base, last.Size, cp.Size), &cons); err != nil {
			return res, err
		}
		if err := pkt.VerifyConsistency(last, cp, cons.Proof); err != nil {
			return res, fmt.Errorf("kt audit: the server's consistency proof: %w", err)
		}
	}
	if statePath != "" {
		b, _ := json.MarshalIndent(ktState{Origin: keys.Origin, NoteKey: keys.NoteKey, VRFKey: keys.VRFKey, Checkpoint: head.Checkpoint}, "", "  ")
		if err := writeFileAtomic(statePath, append(b, '\n')); err != nil {
			return res, fmt.Errorf("kt audit: state: %w", err)
		}
	}
	res.Origin, res.Entries, res.Size, res.Labels, res.Root = cp.Origin, a.Size(), cp.Size, a.Labels(), cp.Root
	res.NewCheckpoint, res.Elapsed = head.Checkpoint, time.Since(start)
	return res, nil
}

// ktGet GETs a JSON answer into into, waiting out 429s (Retry-After).
func ktGet(ctx context.Context, hc *http.Client, u string, into any) error {
	for attempt := 0; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return fmt.Errorf("kt audit: %w", err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return fmt.Errorf("kt audit: %w", err)
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		_ = resp.Body.Close()
		if err != nil {
			return fmt.Errorf("kt audit: %s: %w", pathOf(u), err)
		}
		if resp.StatusCode == http.StatusTooManyRequests && attempt < 20 {
			wait, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Duration(max(wait, 1)) * time.Second):
			}
			continue
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("kt audit: %s: %s: %.200s", pathOf(u), resp.Status, body)
		}
		if err := json.Unmarshal(body, into); err != nil {
			return fmt.Errorf("kt audit: %s: %w", pathOf(u), err)
		}
		return nil
	}
}

// pathOf is u without scheme and host, for error messages.
func pathOf(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return u
	}
	return p.Path + "?" + p.RawQuery
}

// writeFileAtomic writes name through a temporary file and a rename, so a
// crash leaves the old state or the new one (mode 0600).
func writeFileAtomic(name string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(name), filepath.Base(name)+".*")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o600)
	}
	if err == nil {
		err = os.Rename(f.Name(), name)
	}
	if err != nil {
		_ = os.Remove(f.Name())
	}
	return err
}
