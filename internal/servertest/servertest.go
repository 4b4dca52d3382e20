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
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/gateway"
	"github.com/parley-im/parley/internal/server"
)

// Server is a running test node.
type Server struct {
	*server.Server
	URL     string // ws://127.0.0.1:PORT (wss:// with TLS)
	HTTPURL string // http://127.0.0.1:PORT (https:// with TLS)
	DataDir string
	// AdminURL (http://127.0.0.1:PORT) and AdminKey are the server API's,
	// with WithAdmin.
	AdminURL string
	AdminKey string
	key      []byte
	t        testing.TB
}

// Setup is what a node starts from: its configuration, as `parley serve`
// would load it, and what is not configuration (the log, fault seams).
type Setup struct {
	Config config.Config
	Deps   server.Deps
}

// Option adjusts the node's setup before it starts.
type Option func(*Setup)

// WithConfig changes the node's configuration.
func WithConfig(f func(*config.Config)) Option {
	return func(s *Setup) { f(&s.Config) }
}

// WithDeps changes what the node takes besides its configuration (the
// log, the store and bus wrappers of fault tests).
func WithDeps(f func(*server.Deps)) Option {
	return func(s *Setup) { f(&s.Deps) }
}

// WithGateway changes the gateway configuration.
func WithGateway(f func(*gateway.Config)) Option {
	return func(s *Setup) { f(&s.Config.Gateway) }
}

// WithChat changes the chat configuration.
func WithChat(f func(*chat.Config)) Option {
	return func(s *Setup) { f(&s.Config.Chat) }
}

// WithNode names the node: the hello's node field and the snowflake node
// number derive from it. Two nodes of one test need different names.
func WithNode(name string) Option {
	return func(s *Setup) { s.Config.NodeID = name }
}

// WithDataDir runs the node on an existing data directory (restart tests).
func WithDataDir(dir string) Option {
	return func(s *Setup) { s.Config.DataDir = dir }
}

// WithKey signs and verifies tokens with key instead of a random one.
func WithKey(key []byte) Option {
	return func(s *Setup) { s.Config.Auth.HS256Key = hex.EncodeToString(key) }
}

// WithDevKey runs the node on the development key in its data directory,
// as `parley serve` does with no auth key configured: POST /v1/dev/token
// is served, and Key returns that key.
func WithDevKey() Option {
	return func(s *Setup) { s.Config.Auth.HS256Key = "" }
}

// WithLogger sends the node's log to log.
func WithLogger(log *slog.Logger) Option {
	return func(s *Setup) { s.Deps.Logger = log }
}

// WithAdmin serves the server API on a free port with a random key.
func WithAdmin() Option {
	return func(s *Setup) {
		key := make([]byte, 32)
		_, _ = rand.Read(key)
		s.Config.Admin.Listen, s.Config.Admin.Key = "127.0.0.1:0", hex.EncodeToString(key)
	}
}

// Defaults returns the setup Start uses before applying opts: the
// defaults of `parley serve` on a free port of 127.0.0.1, in a temporary
// data directory, with a random token key, no web page and the per-user
// limits lifted.
func Defaults(t testing.TB) Setup {
	return defaults(t.TempDir())
}

func defaults(dataDir string) Setup {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	level := slog.LevelWarn
	if os.Getenv("PARLEY_TEST_LOG") != "" {
		level = slog.LevelDebug
	}
	c := config.Default()
	c.Listen, c.DataDir, c.NodeID = "127.0.0.1:0", dataDir, "test1"
	c.Auth.HS256Key, c.Auth.Leeway = hex.EncodeToString(key), 30*time.Second
	c.Web.Page = false
	// Tests drive single users far harder than people do; the fair-sharing
	// limits have their own tests, which set them (internal/e2e).
	gw := &c.Gateway
	gw.UserSendRate, gw.UserSendBurst = 1e9, 1e9
	gw.ConnRequestRate, gw.ConnRequestBurst = 1e9, 1e9
	gw.MaxSessionsPerUser, gw.MaxPollSessionsPerUser = 1e6, 1e6
	gw.UserHandshakeRate, gw.UserHandshakeBurst = 1e9, 1e9
	gw.SourceAcceptRate = 0 // every test client is 127.0.0.1
	return Setup{
		Config: c,
		Deps:   server.Deps{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))},
	}
}

// Start starts a node and stops it when the test ends.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	su := Defaults(t)
	for _, f := range opts {
		f(&su)
	}
	s, err := start(su)
	if err != nil {
		t.Fatalf("servertest: start: %v", err)
	}
	s.t = t
	t.Cleanup(s.Close)
	return s
}

// Launch starts a node outside a test (runnable examples): its store lives
// in dataDir, and the caller stops it with Close.
func Launch(dataDir string, opts ...Option) (*Server, error) {
	su := defaults(dataDir)
	su.Deps.Logger = slog.New(slog.DiscardHandler)
	for _, f := range opts {
		f(&su)
	}
	return start(su)
}

func start(su Setup) (*Server, error) {
	c := su.Config
	srv, err := server.Start(context.Background(), c, su.Deps)
	if err != nil {
		return nil, err
	}
	s := &Server{Server: srv, URL: "ws://" + srv.Addr(), HTTPURL: "http://" + srv.Addr(), DataDir: c.DataDir}
	if srv.TLS() {
		s.URL, s.HTTPURL = "wss://"+srv.Addr(), "https://"+srv.Addr()
	}
	// The key the node verifies with, as it resolved it.
	if s.key, err = tokenKey(c); err != nil {
		s.Close()
		return nil, err
	}
	if a := srv.AdminAddr(); a != "" {
		s.AdminURL, s.AdminKey = "http://"+a, c.Admin.Key
	}
	return s, nil
}

// tokenKey is the HS256 key c configures: its hex key or, with none, the
// development key in the data directory (which Start created).
func tokenKey(c config.Config) ([]byte, error) {
	if c.UsesDevKey() {
		return auth.LoadOrCreateDevKey(c.DataDir)
	}
	a, err := c.ResolveAuth()
	if err != nil {
		return nil, err
	}
	return a.HS256Key, nil
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
