package admin

import (
	"errors"
	"net/http"
	"time"

	"github.com/parley-im/parley/protocol"
)

// ErrBackupBusy is what Deps.Backup returns while another backup runs; the
// endpoint answers it 409 conflict.
var ErrBackupBusy = errors.New("a backup is already running")

// backup streams Deps.Backup's archive. Once the first byte is written the
// status is 200 whatever follows, so a failure after it shows as an
// archive without its end marker (the client checks for it).
func (s *Server) backup(w http.ResponseWriter, r *http.Request) {
	if s.d.Backup == nil {
		writeError(w, protocol.Errorf(protocol.CodeInvalidArgument, "this node has nothing of its own to back up (cluster mode: back up its engines)"))
		return
	}
	// The archive may take longer than the API's write timeout.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
	s.d.Logger.Info("admin API call", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
	sw := &startedWriter{w: w}
	err := s.d.Backup(r.Context(), sw)
	switch {
	case err == nil:
	case !sw.started && errors.Is(err, ErrBackupBusy):
		writeError(w, protocol.Errorf(protocol.CodeConflict, "%v", err))
	case !sw.started:
		s.d.Logger.Error("admin API: backup failed", "err", err)
		writeError(w, protocol.Errorf(protocol.CodeInternal, "backup failed: %v", err))
	default:
		s.d.Logger.Error("admin API: backup failed mid-stream; the archive has no end marker", "err", err)
		// Abort the response so the client sees a broken stream.
		panic(http.ErrAbortHandler)
	}
}

// startedWriter sets the archive's headers before its first byte.
type startedWriter struct {
	w       http.ResponseWriter
	started bool
}

func (s *startedWriter) Write(p []byte) (int, error) {
	if !s.started {
		s.started = true
		s.w.Header().Set("Content-Type", "application/x-tar")
		s.w.Header().Set("Content-Disposition", `attachment; filename="parley-backup.tar"`)
		s.w.WriteHeader(http.StatusOK)
	}
	return s.w.Write(p)
}
