// Package servertest starts a real Parley node in-process for tests: real
// listener on 127.0.0.1, real Pebble store on disk under t.TempDir(), real
// WebSockets. Each Server is owned by its test and stopped by t.Cleanup.
package servertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/gateway"
	"github.com/parley-im/parley/internal/server"
)

// Server is a running test node.
type Server struct {
	*server.Server
	URL     string // ws://127.0.0.1:PORT
	HTTPURL string // http://127.0.0.1:PORT
	DataDir string
	// AdminURL (http://127.0.0.1:PORT) and AdminKey are the server API's,
	// with WithAdmin.
	AdminURL string
	AdminKey string
	key      []byte
	t        testing.TB
}

// Option adjusts the node's options before it starts.
type Option func(*server.Options)

// WithGateway changes the gateway configuration.
func WithGateway(f func(*gateway.Config)) Option {
	return func(o *server.Options) { f(&o.Gateway) }
}

// WithChat changes the chat configuration.
func WithChat(f func(*chat.Config)) Option {
	return func(o *server.Options) { f(&o.Chat) }
}

// WithNode names the node: the hello's node field and the snowflake node
// number derive from it. Two nodes of one test need different names.
func WithNode(name string) Option {
	return func(o *server.Options) { o.Node = name }
}

// WithDataDir runs the node on an existing data directory (restart tests).
func WithDataDir(dir string) Option {
	return func(o *server.Options) { o.DataDir = dir }
}

// WithKey signs and verifies tokens with key instead of a random one.
func WithKey(key []byte) Option {
	return func(o *server.Options) { o.Auth.HS256Key = key }
}

// WithAdmin serves the server API on a free port with a random key.
func WithAdmin() Option {
	return func(o *server.Options) {
		key := make([]byte, 32)
		_, _ = rand.Read(key)
		o.Admin = &server.Admin{Listen: "127.0.0.1:0", Key: key}
	}
}

// Options returns the options Start uses before applying opts.
func Options(t testing.TB) server.Options {
	return options(t.TempDir())
}

func options(dataDir string) server.Options {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	level := slog.LevelWarn
	if os.Getenv("PARLEY_TEST_LOG") != "" {
		level = slog.LevelDebug
	}
	gw := gateway.DefaultConfig()
	// Tests drive single users far harder than people do; the fair-sharing
	// limits have their own tests, which set them (internal/e2e).
	gw.UserSendRate, gw.UserSendBurst = 1e9, 1e9
	gw.ConnRequestRate, gw.ConnRequestBurst = 1e9, 1e9
	gw.MaxSessionsPerUser, gw.MaxPollSessionsPerUser = 1e6, 1e6
	gw.UserHandshakeRate, gw.UserHandshakeBurst = 1e9, 1e9
	gw.SourceAcceptRate = 0 // every test client is 127.0.0.1
	return server.Options{
		Listen:      "127.0.0.1:0",
		DataDir:     dataDir,
		Node:        "test1",
		Auth:        auth.Config{HS256Key: key, Leeway: 30 * time.Second},
		Gateway:     gw,
		Chat:        chat.DefaultConfig(),
		BucketWidth: 240 * time.Hour,
		Logger:      slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
	}
}

// Start starts a node and stops it when the test ends.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	o := Options(t)
	for _, f := range opts {
		f(&o)
	}
	srv, err := server.Start(context.Background(), o)
	if err != nil {
		t.Fatalf("servertest: start: %v", err)
	}
	s := &Server{Server: srv, URL: "ws://" + srv.Addr(), HTTPURL: "http://" + srv.Addr(), DataDir: o.DataDir, key: o.Auth.HS256Key, t: t}
	if o.Admin != nil {
		s.AdminURL, s.AdminKey = "http://"+srv.AdminAddr(), hex.EncodeToString(o.Admin.Key)
	}
	t.Cleanup(s.Close)
	return s
}

// Launch starts a node outside a test (runnable examples): its store lives
// in dataDir, and the caller stops it with Close.
func Launch(dataDir string, opts ...Option) (*Server, error) {
	o := options(dataDir)
	o.Logger = slog.New(slog.DiscardHandler)
	for _, f := range opts {
		f(&o)
	}
	srv, err := server.Start(context.Background(), o)
	if err != nil {
		return nil, err
	}
	return &Server{Server: srv, URL: "ws://" + srv.Addr(), HTTPURL: "http://" + srv.Addr(), DataDir: o.DataDir, key: o.Auth.HS256Key}, nil
}

// Key is the node's HS256 token key.
func (s *Server) Key() []byte { return s.key }

// Token mints a valid one-hour token for user.
func (s *Server) Token(user string) string {
	if s.t == nil { // Launch
		now := time.Now()
		tok, err := auth.MintHS256(s.key, auth.Claims{User: user, IssuedAt: now.Add(-time.Minute), Expires: now.Add(time.Hour)})
		if err != nil {
			panic("servertest: mint: " + err.Error())
		}
		return tok
	}
	return MintToken(s.t, s.key, user, time.Hour)
}

// MintToken mints a token for user valid for ttl (negative: expired).
func MintToken(t testing.TB, key []byte, user string, ttl time.Duration) string {
	t.Helper()
	now := time.Now()
	tok, err := auth.MintHS256(key, auth.Claims{User: user, IssuedAt: now.Add(-time.Minute), Expires: now.Add(ttl)})
	if err != nil {
		t.Fatalf("servertest: mint: %v", err)
	}
	return tok
}

// Close stops the node; it is safe to call more than once.
func (s *Server) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil && s.t != nil {
		s.t.Logf("servertest: shutdown: %v", err)
	}
}
