package main

import (
	"archive/tar"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/parley-im/parley/internal/admin"
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/server"
)

const backupUsage = "parley backup -out FILE [--config FILE] [--<setting> VALUE ...]"

// backupSettings are the settings backup reads: where the node's server
// API listens and its key.
var backupSettings = []string{"admin.listen", "admin.key", "admin.key_file"}

// runBackup asks a running embedded node, through its server API
// (admin.listen and the admin key, from the same configuration as `parley
// serve`), for a consistent archive of its data directory and writes it to
// -out: under a temporary name, fsynced, renamed only once the archive's
// end marker has arrived, so a failed or interrupted backup leaves no
// file that looks whole. -out - writes to standard output.
func runBackup(ctx context.Context, args []string, stderr io.Writer) error {
	flags := config.NewFlagSet("parley backup")
	out := flags.String("out", "", "file to write the archive to (- for standard output), required")
	cfg, err := loadConfigOf(flags, backupUsage, args, backupSettings)
	if err != nil {
		return err
	}
	if *out == "" {
		return errors.New("backup: -out is required")
	}
	resp, err := adminPost(ctx, cfg, admin.BackupRoute, nil)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer resp.Body.Close()
	var w io.Writer = os.Stdout
	var f *os.File
	if *out != "-" {
		if f, err = os.CreateTemp(filepath.Dir(*out), "."+filepath.Base(*out)+".tmp-*"); err != nil {
			return fmt.Errorf("backup: %w", err)
		}
		defer func() {
			if f != nil {
				f.Close()
				os.Remove(f.Name())
			}
		}()
		w = f
	}
	tot, err := checkArchive(io.TeeReader(resp.Body, w), nil)
	if err != nil {
		return fmt.Errorf("backup: the archive is incomplete (%w); nothing written", err)
	}
	if f != nil {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("backup: %w", err)
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("backup: %w", err)
		}
		name := f.Name()
		f = nil
		if err := os.Rename(name, *out); err != nil {
			os.Remove(name)
			return fmt.Errorf("backup: %w", err)
		}
		syncDir(filepath.Dir(*out))
	}
	fmt.Fprintf(stderr, "parley: backup of %d files (%d bytes) written to %s\n", tot.Files, tot.Bytes, *out)
	return nil
}

// adminPost calls route ("POST /path") of the running node's server API
// (admin.listen and the admin key of cfg) with body (nil: none); an answer
// other than 200 is an error naming its code.
func adminPost(ctx context.Context, cfg config.Config, route string, body io.Reader) (*http.Response, error) {
	key, err := cfg.ResolveAdminKey()
	if err != nil {
		return nil, err
	}
	if key == nil {
		return nil, errors.New("the server API is off: set admin.listen and admin.key_file (the node's and this command's configuration)")
	}
	host, port, err := net.SplitHostPort(cfg.Admin.Listen)
	if err != nil {
		return nil, fmt.Errorf("admin.listen: %w", err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+net.JoinHostPort(host, port)+strings.TrimPrefix(route, "POST "), body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+hex.EncodeToString(key))
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		var e struct{ Code, Error string }
		_ = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&e)
		return nil, fmt.Errorf("the node answered %d %s: %s", resp.StatusCode, e.Code, e.Error)
	}
	return resp, nil
}

// checkArchive reads a backup archive to its end and checks its shape:
// the manifest first (of a format this build reads), safe relative names,
// regular files and directories only, the end marker last with the count
// of what came before. With each non-nil, every file and directory is
// handed to it as it is read.
func checkArchive(r io.Reader, each func(h *tar.Header, body io.Reader) error) (server.BackupTotals, error) {
	tr := tar.NewReader(r)
	var got, end server.BackupTotals
	first, ended := true, false
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return got, err
		}
		if ended {
			return got, fmt.Errorf("%s after the end marker", h.Name)
		}
		switch {
		case first:
			if h.Name != server.BackupManifest {
				return got, fmt.Errorf("first entry %q is not %s: not a Parley backup", h.Name, server.BackupManifest)
			}
			var m server.BackupInfo
			if err := json.NewDecoder(io.LimitReader(tr, 64<<10)).Decode(&m); err != nil {
				return got, fmt.Errorf("manifest: %w", err)
			}
			if m.Format != server.BackupFormat {
				return got, fmt.Errorf("archive format %d; this build reads %d", m.Format, server.BackupFormat)
			}
			first = false
			continue
		case h.Name == server.BackupEnd:
			if err := json.NewDecoder(io.LimitReader(tr, 64<<10)).Decode(&end); err != nil {
				return got, fmt.Errorf("end marker: %w", err)
			}
			ended = true
			continue
		}
		clean := path.Clean(h.Name)
		if path.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, "../") || strings.Contains(h.Name, "\\") {
			return got, fmt.Errorf("unsafe name %q", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
		case tar.TypeReg:
			got.Files++
			got.Bytes += h.Size
		default:
			return got, fmt.Errorf("%s: entry type %q is neither a file nor a directory", h.Name, h.Typeflag)
		}
		if each != nil {
			if err := each(h, tr); err != nil {
				return got, err
			}
		} else if _, err := io.Copy(io.Discard, tr); err != nil {
			return got, err
		}
	}
	if first {
		return got, errors.New("empty archive")
	}
	if !ended {
		return got, errors.New("no end marker: the archive was cut short")
	}
	if got != end {
		return got, fmt.Errorf("holds %d files and %d bytes, the end marker says %d and %d", got.Files, got.Bytes, end.Files, end.Bytes)
	}
	return got, nil
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

const restoreUsage = "parley restore -from FILE -data-dir DIR"

// runRestore unpacks a backup archive into a new data directory: into a
// temporary sibling first, every file fsynced, renamed to DIR only when
// the whole archive has been checked, so DIR either does not exist or is
// a complete copy. DIR must not exist, or be empty.
func runRestore(args []string, stderr io.Writer) error {
	flags := config.NewFlagSet("parley restore")
	from := flags.String("from", "", "the archive `parley backup` wrote (- for standard input), required")
	dataDir := flags.String("data-dir", "", "the data directory to create, required; it must not exist or be empty")
	flags.Usage = func() { fmt.Fprintf(stdout, "usage: %s\n", restoreUsage); flags.PrintDefaults() }
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *from == "" || *dataDir == "" {
		return errors.New("restore: -from and -data-dir are required")
	}
	if entries, err := os.ReadDir(*dataDir); err == nil && len(entries) > 0 {
		return fmt.Errorf("restore: %s is not empty; restore into a new directory", *dataDir)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("restore: %w", err)
	}
	var in io.Reader = os.Stdin
	if *from != "-" {
		f, err := os.Open(*from)
		if err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		defer f.Close()
		in = f
	}
	target := filepath.Clean(*dataDir)
	if err := os.MkdirAll(filepath.Dir(target), 0o700); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(target), "."+filepath.Base(target)+".restore-*")
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()
	var dirs []string
	tot, err := checkArchive(in, func(h *tar.Header, body io.Reader) error {
		p := filepath.Join(tmp, filepath.FromSlash(path.Clean(h.Name)))
		if h.Typeflag == tar.TypeDir {
			dirs = append(dirs, p)
			return os.MkdirAll(p, 0o700)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return err
		}
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.CopyN(f, body, h.Size); err != nil {
			f.Close()
			return err
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	})
	if err != nil {
		return fmt.Errorf("restore: %w; %s left as it was", err, *dataDir)
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		syncDir(dirs[i])
	}
	syncDir(tmp)
	_ = os.Remove(target) // empty, or absent
	if err := os.Rename(tmp, target); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	done = true
	syncDir(filepath.Dir(target))
	fmt.Fprintf(stderr, "parley: restored %d files (%d bytes) into %s; start it with parley serve --data-dir %s\n", tot.Files, tot.Bytes, target, target)
	return nil
}
