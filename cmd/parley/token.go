package main

import (
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/internal/config"
)

// runToken mints a development token signed with the node's HS256 key (the
// development key in the data directory unless one is configured).
func runToken(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	user := fs.String("user", "", "user id (sub claim), required")
	device := fs.String("device", "", "bind the token to this device id (optional)")
	ttl := fs.Duration("ttl", 24*time.Hour, "token lifetime")
	dataDir := fs.String("data-dir", config.Default().DataDir, "data directory holding the development key")
	keyFile := fs.String("key-file", "", "HS256 key file (hex) instead of the development key")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *user == "" {
		return fmt.Errorf("token: -user is required")
	}
	var (
		key []byte
		err error
	)
	if *keyFile != "" {
		key, err = auth.LoadHS256KeyFile(*keyFile)
	} else {
		key, err = auth.LoadOrCreateDevKey(*dataDir)
	}
	if err != nil {
		return fmt.Errorf("token: %w", err)
	}
	now := time.Now()
	tok, err := auth.MintHS256(key, auth.Claims{User: *user, Device: *device, IssuedAt: now, Expires: now.Add(*ttl)})
	if err != nil {
		return fmt.Errorf("token: %w", err)
	}
	_, err = fmt.Fprintln(out, tok)
	return err
}
