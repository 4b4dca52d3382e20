package server

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/parley-im/parley/internal/admin"
	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/internal/buildinfo"
)

// The backup archive of an embedded node (docs/deploy.md, "Back up and
// restore"): a tar stream whose first entry is the manifest and whose last
// is the end marker, so a truncated archive is told from a whole one.
const (
	BackupManifest = "PARLEY-BACKUP.json"
	BackupEnd      = "PARLEY-BACKUP-END.json"
	BackupFormat   = 1
	backupTempGlob = ".backup-*"
)

// BackupInfo is the manifest's content.
type BackupInfo struct {
	Format  int       `json:"format"`
	Version string    `json:"version"`
	Node    string    `json:"node"`
	Created time.Time `json:"created"`
}

// BackupTotals is the end marker's content: what the archive holds besides
// the manifest and the marker.
type BackupTotals struct {
	Files int   `json:"files"`
	Bytes int64 `json:"bytes"`
}

// checkpointer is a Pebble database that copies itself while serving.
type checkpointer interface{ Checkpoint(dir string) error }

// ErrBackupBusy: another backup of the node is in progress.
var ErrBackupBusy = fmt.Errorf("server: %w", admin.ErrBackupBusy)

// Backup writes a consistent archive of the embedded node's data
// directory to w while the node serves: the store, the ledger and the
// webhook queue are Pebble checkpoints taken together while the fan-out
// is quiesced (sends go on; their fan-out waits for the checkpoints), then
// the attachment files, the access list and the development key are
// added. A cluster node has nothing of its own to back up (its state is in
// Cassandra, Redis, JetStream and S3).
func (s *Server) Backup(ctx context.Context, w io.Writer) error {
	if s.clustered() || s.embeddedStore == nil {
		return errors.New("server: backup is for an embedded node; in cluster mode back up the engines (docs/deploy.md)")
	}
	if !s.backupMu.TryLock() {
		return ErrBackupBusy
	}
	defer s.backupMu.Unlock()
	tmp, err := os.MkdirTemp(s.cfg.DataDir, backupTempGlob)
	if err != nil {
		return fmt.Errorf("server: backup: %w", err)
	}
	defer os.RemoveAll(tmp)

	dbs := []struct {
		name string
		db   any
	}{{"store", s.embeddedStore}, {"ledger", s.ledger}}
	if s.hookq != nil {
		dbs = append(dbs, struct {
			name string
			db   any
		}{"webhooks", s.hookq})
	}
	snap := func() error {
		for _, d := range dbs {
			c, ok := d.db.(checkpointer)
			if !ok {
				return fmt.Errorf("server: backup: the %s engine (%T) cannot checkpoint", d.name, d.db)
			}
			if err := c.Checkpoint(filepath.Join(tmp, d.name)); err != nil {
				return fmt.Errorf("server: backup: %w", err)
			}
		}
		return nil
	}
	began := time.Now()
	if s.fanout != nil {
		err = s.fanout.Quiesce(snap)
	} else {
		err = snap()
	}
	if err != nil {
		return err
	}
	s.log.Info("backup: checkpoints taken", "took", time.Since(began))

	tw := tar.NewWriter(w)
	manifest, _ := json.Marshal(BackupInfo{Format: BackupFormat, Version: buildinfo.Get().Version, Node: s.cfg.NodeID, Created: s.now().UTC()})
	if err := writeTarFile(tw, BackupManifest, manifest); err != nil {
		return err
	}
	var tot BackupTotals
	add := func(root, prefix string) error {
		return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil // removed while we walked (an attachment collected)
				}
				return err
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			rel, _ := filepath.Rel(root, path)
			name := filepath.ToSlash(filepath.Join(prefix, rel))
			if d.IsDir() {
				if rel == "." {
					return tw.WriteHeader(&tar.Header{Name: prefix + "/", Typeflag: tar.TypeDir, Mode: 0o700, ModTime: began})
				}
				return tw.WriteHeader(&tar.Header{Name: name + "/", Typeflag: tar.TypeDir, Mode: 0o700, ModTime: began})
			}
			if !d.Type().IsRegular() || strings.HasPrefix(d.Name(), ".tmp-") {
				return nil
			}
			n, err := copyTarFile(tw, path, name)
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if err != nil {
				return err
			}
			tot.Files++
			tot.Bytes += n
			return nil
		})
	}
	for _, d := range dbs {
		if err := add(filepath.Join(tmp, d.name), d.name); err != nil {
			return fmt.Errorf("server: backup: %w", err)
		}
	}
	// Attachment files: those completed before the checkpoint are all
	// there; a later one is unreferenced in the copy, and the restored
	// node's collector removes it.
	if blobs := filepath.Join(s.cfg.DataDir, "blobs"); dirExists(blobs) {
		if err := add(blobs, "blobs"); err != nil {
			return fmt.Errorf("server: backup: %w", err)
		}
	}
	for _, f := range []string{"access.json", auth.DevKeyFile} {
		n, err := copyTarFile(tw, filepath.Join(s.cfg.DataDir, f), f)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("server: backup: %w", err)
		}
		tot.Files++
		tot.Bytes += n
	}
	end, _ := json.Marshal(tot)
	if err := writeTarFile(tw, BackupEnd, end); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("server: backup: %w", err)
	}
	s.log.Info("backup: written", "files", tot.Files, "bytes", tot.Bytes, "took", time.Since(began))
	return nil
}

func writeTarFile(tw *tar.Writer, name string, b []byte) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o600, Size: int64(len(b)), ModTime: time.Now()}); err != nil {
		return fmt.Errorf("server: backup: %w", err)
	}
	if _, err := tw.Write(b); err != nil {
		return fmt.Errorf("server: backup: %w", err)
	}
	return nil
}

// copyTarFile adds the file at path as name. The size is the file's when
// opened: files under the data directory only grow by being replaced, so
// the open file stays whole.
func copyTarFile(tw *tar.Writer, path, name string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o600, Size: st.Size(), ModTime: st.ModTime()}); err != nil {
		return 0, err
	}
	n, err := io.CopyN(tw, f, st.Size())
	return n, err
}

func dirExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// removeBackupTemps deletes the checkpoints a backup that never finished
// (the node was killed) left in the data directory.
func removeBackupTemps(dataDir string) {
	left, _ := filepath.Glob(filepath.Join(dataDir, backupTempGlob))
	for _, d := range left {
		_ = os.RemoveAll(d)
	}
}
