// Package admin is the server API: HTTP+JSON on a listener of its own
// (admin.listen), for back offices and integrations, authenticated with
// the admin key (never a user token). Every call goes through the chat
// service's own code (chat/admin.go), so permissions and seqs are the
// client path's; users are banned, revoked and disconnected through the
// access list (internal/access) and the gateways. docs/admin.md is the
// contract; protocol/schema/admin-openapi.json its machine-readable form.
//
// Concurrency: a Server is safe for concurrent use; Start runs one
// net/http server, stopped by Shutdown.
package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/parley-im/parley/internal/access"
	"github.com/parley-im/parley/internal/attach"
	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/search"
	"github.com/parley-im/parley/protocol"
)

// MaxBodyBytes bounds a request body (413 too_large beyond it).
const MaxBodyBytes = 1 << 20

// MinKeyBytes is the shortest accepted admin key.
const MinKeyBytes = 32

// DefaultActor is the actor id of the admin's events and messages.
const DefaultActor = "admin"

// Chat is the chat service's server API (chat/admin.go): *chat.Service
// itself, or in cluster mode a router that runs each conversation write on
// the chat process owning the conversation's partition (route.Admin),
// with the same code, permissions and seqs.
type Chat interface {
	AdminOpenDirect(ctx context.Context, a, b string, e2e bool) (*protocol.ConvInfo, *protocol.Error)
	AdminCreateGroup(ctx context.Context, owner, name string, members []string, e2e bool) (*protocol.ConvInfo, *protocol.Error)
	AdminConv(ctx context.Context, convID uint64) (*protocol.ConvInfo, *protocol.Error)
	AdminUserConversations(ctx context.Context, user string, after uint64, limit int) ([]protocol.ConvSummary, bool, *protocol.Error)
	AdminFrame(ctx context.Context, actor string, f *protocol.Frame) (*protocol.ConvInfo, *protocol.Error)
	AdminSend(ctx context.Context, c chat.Caller, f *protocol.Frame) (*protocol.Frame, *protocol.Error)
	AdminModerate(ctx context.Context, actor string, f *protocol.Frame) (*protocol.Frame, *protocol.Error)
	AdminNotice(ctx context.Context, actor string, convID uint64, clientMsgID, text string) (*protocol.Frame, *protocol.Error)
	AdminSearch(ctx context.Context, user string, q protocol.SearchQuery) (*protocol.SearchResult, *protocol.Error)
}

var _ Chat = (*chat.Service)(nil)

// Attachments is the attachment service's server API (attach/admin.go):
// the records are read and deleted in the store and the blob engine, by
// whichever chat process serves the call.
type Attachments interface {
	AdminAttachments(ctx context.Context, conv, after uint64, limit int) ([]attach.AdminAttachment, bool, *protocol.Error)
	AdminDeleteAttachment(ctx context.Context, id uint64) *protocol.Error
}

var _ Attachments = (*attach.Service)(nil)

// Deps are what the API acts through.
type Deps struct {
	Chat   Chat
	Access *access.Manager
	// Attachments serves the attachment endpoints (nil: attachments are
	// off, and they answer invalid_argument).
	Attachments Attachments
	// Disconnect closes user's sessions (of device, if set) on every
	// gateway, with protocol.CloseDisconnected, and reports how many it
	// found.
	Disconnect func(ctx context.Context, user, device string) (int, error)
	// Backup writes an archive of the node's data to w (nil: the node
	// cannot back itself up, and the endpoint answers invalid_argument).
	// While another backup runs it returns an error wrapping ErrBackupBusy.
	Backup func(ctx context.Context, w io.Writer) error
	// Reindex rebuilds the search index of one conversation (conv ≠ 0)
	// or of every plain one, calling progress after each (nil: the node
	// has no index of its own, and the endpoint answers
	// search_unavailable).
	Reindex func(ctx context.Context, conv uint64, progress func(search.ReindexProgress)) (search.ReindexProgress, error)
	Limits  protocol.Limits
	Logger  *slog.Logger
	Now     func() time.Time
}

// Config configures the API.
type Config struct {
	Listen string
	Key    []byte // the admin key (at least MinKeyBytes); the bearer is its hex
	Actor  string // actor id of the admin's events (DefaultActor)
	// RequestTimeout bounds one call (default 10 s).
	RequestTimeout time.Duration
}

// Server is the admin API.
type Server struct {
	cfg    Config
	d      Deps
	keySum [32]byte
	mux    *http.ServeMux
	ln     net.Listener
	srv    *http.Server
}

// New builds the API; Start serves it.
func New(cfg Config, d Deps) (*Server, error) {
	if len(cfg.Key) < MinKeyBytes {
		return nil, fmt.Errorf("admin: the key is %d bytes, need at least %d", len(cfg.Key), MinKeyBytes)
	}
	if d.Chat == nil || d.Access == nil || d.Disconnect == nil {
		return nil, errors.New("admin: chat, access and disconnect are required")
	}
	if cfg.Actor == "" {
		cfg.Actor = DefaultActor
	}
	if !protocol.ValidID(cfg.Actor) {
		return nil, fmt.Errorf("admin: actor %q is not a valid id", cfg.Actor)
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 10 * time.Second
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	// Operators handle the key as the hex they configured: that string is
	// the bearer.
	s := &Server{cfg: cfg, d: d, keySum: sha256.Sum256([]byte(hex.EncodeToString(cfg.Key))), mux: http.NewServeMux()}
	s.routes()
	return s, nil
}

// Start listens on cfg.Listen and serves until Shutdown.
func (s *Server) Start() error {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("admin: listen: %w", err)
	}
	s.ln = ln
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 120 * time.Second, MaxHeaderBytes: 16 << 10}
	go func() { _ = s.srv.Serve(ln) }()
	return nil
}

// Addr is the listener's address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Shutdown stops the listener and waits for calls in progress (bounded by
// ctx).
func (s *Server) Shutdown(ctx context.Context) error {
	if s.srv == nil {
		return nil
	}
	return s.srv.Shutdown(ctx)
}

// ServeHTTP authenticates the admin key, then routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(r) {
		s.d.Logger.Warn("admin API: request refused: missing or wrong admin key", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
		writeError(w, protocol.Errorf(protocol.CodeUnauthorized, "send the admin key as Authorization: Bearer <key>"))
		return
	}
	s.mux.ServeHTTP(w, r)
}

// authorized compares the bearer (the key's hex, any case) with the admin
// key in constant time (over their SHA-256, so the length does not leak
// either).
func (s *Server) authorized(r *http.Request) bool {
	h := r.Header.Get("Authorization")
	if len(h) < 7 || !strings.EqualFold(h[:7], "bearer ") {
		return false
	}
	sum := sha256.Sum256([]byte(strings.ToLower(strings.TrimSpace(h[7:]))))
	return subtle.ConstantTimeCompare(sum[:], s.keySum[:]) == 1
}

// handler is one endpoint: it answers a value (encoded as JSON with 200)
// or an error.
type handler func(ctx context.Context, r *http.Request, body []byte) (any, *protocol.Error)

func (s *Server) handle(pattern string, h handler) {
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		body, perr := readBody(r)
		if perr != nil {
			writeError(w, perr)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
		defer cancel()
		out, perr := h(ctx, r, body)
		if perr == nil && out == nil {
			// A deletion that has nothing to say: 204, no body.
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if r.Method != http.MethodGet {
			// An audit line for every call that may change something.
			code := protocol.Code("")
			if perr != nil {
				code = perr.Code
			}
			s.d.Logger.Info("admin API call", "method", r.Method, "path", r.URL.Path, "ok", perr == nil, "code", code, "remote", r.RemoteAddr)
		}
		if perr != nil {
			writeError(w, perr)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	})
}

func readBody(r *http.Request) ([]byte, *protocol.Error) {
	if r.ContentLength > MaxBodyBytes {
		return nil, protocol.Errorf(protocol.CodeTooLarge, "body of %d bytes is over %d", r.ContentLength, MaxBodyBytes)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeBadFrame, "cannot read the body")
	}
	if len(body) > MaxBodyBytes {
		return nil, protocol.Errorf(protocol.CodeTooLarge, "body over %d bytes", MaxBodyBytes)
	}
	return body, nil
}

func writeError(w http.ResponseWriter, e *protocol.Error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(protocol.HTTPStatus(e.Code))
	_ = json.NewEncoder(w).Encode(map[string]any{"code": e.Code, "error": e.Msg})
}

// pathConv reads the {conv_id} path value: a decimal, non-zero uint64.
func pathConv(r *http.Request) (uint64, *protocol.Error) {
	v := r.PathValue("conv_id")
	id, err := strconv.ParseUint(v, 10, 64)
	if err != nil || id == 0 {
		return 0, protocol.Errorf(protocol.CodeInvalidArgument, "conv_id %q is not a decimal conversation id", truncate(v))
	}
	return id, nil
}

// pathUser reads the {user_id} path value.
func pathUser(r *http.Request) (string, *protocol.Error) {
	v := r.PathValue("user_id")
	if !protocol.ValidID(v) {
		return "", protocol.Errorf(protocol.CodeInvalidArgument, "user_id %q is not 1-64 bytes of [A-Za-z0-9._@-]", truncate(v))
	}
	return v, nil
}

// pathMember reads the {conv_id} and {user_id} path values of a member's
// endpoint.
func pathMember(r *http.Request) (uint64, string, *protocol.Error) {
	conv, perr := pathConv(r)
	if perr != nil {
		return 0, "", perr
	}
	user, perr := pathUser(r)
	return conv, user, perr
}

// pathSeq reads the {seq} path value: a positive integer.
func pathSeq(r *http.Request) (uint64, *protocol.Error) {
	v := r.PathValue("seq")
	seq, err := strconv.ParseUint(v, 10, 64)
	if err != nil || seq == 0 {
		return 0, protocol.Errorf(protocol.CodeInvalidArgument, "seq %q is not a positive integer", truncate(v))
	}
	return seq, nil
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
