package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"time"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/internal/config"
)

const tokenUsage = "parley token -user ID [-device ID] [-ttl 24h] [--config FILE] [--<setting> VALUE ...]"

// tokenSettings are the settings token reads: where the server's key is.
var tokenSettings = []string{"data_dir", "auth.hs256_key", "auth.hs256_key_file", "auth.ed25519_public_key_file"}

// runToken mints a token signed with the HS256 key the server would use,
// read from the same configuration as `parley serve` (--config,
// PARLEY_CONFIG, PARLEY_* variables, setting flags): auth.hs256_key,
// auth.hs256_key_file, or else the development key in data_dir. Unlike the
// server it never creates the development key: a token signed with a key
// no server holds would only fail later with unauthorized.
func runToken(args []string, out io.Writer) error {
	flags := config.NewFlagSet("parley token")
	user := flags.String("user", "", "user id (sub claim), required")
	device := flags.String("device", "", "bind the token to this device id (optional)")
	ttl := flags.Duration("ttl", 24*time.Hour, "token lifetime")
	cfg, err := loadConfigOf(flags, tokenUsage, args, tokenSettings)
	if err != nil {
		return err
	}
	if *user == "" {
		return fmt.Errorf("token: -user is required")
	}
	var key []byte
	switch {
	case cfg.Auth.HS256Key != "":
		var keys [][]byte
		if keys, err = auth.ParseHS256Keys(cfg.Auth.HS256Key); err == nil {
			key = keys[0] // the signing key of a rotation's pair
		}
	case cfg.Auth.HS256KeyFile != "":
		key, err = auth.LoadHS256KeyFile(cfg.Auth.HS256KeyFile)
	case cfg.Auth.Ed25519PublicKeyFile != "":
		return errors.New("token: the server verifies Ed25519 tokens (auth.ed25519_public_key_file); mint them with the private key in your auth service")
	default:
		path := filepath.Join(cfg.DataDir, auth.DevKeyFile)
		key, err = auth.LoadHS256KeyFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("token: no development key at %s: start `parley serve` with this data directory first, or point --data-dir, PARLEY_DATA_DIR or --config at the server's", path)
		}
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
