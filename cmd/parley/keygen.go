package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/parley-im/parley/token"
)

const keygenUsage = `usage: parley keygen -type hs256|ed25519 -out PATH

Makes a token key (docs/deploy.md, "Token keys"):
  -type hs256    a random 32-byte HS256 key, hex, in PATH (0600): the file
                 for auth.hs256_key_file, and for your auth service, which
                 signs with it
  -type ed25519  an Ed25519 key pair: the private key in PATH (PKCS #8 PEM,
                 0600) for your auth service, and the public key in
                 PATH.pub (PKIX PEM) for auth.ed25519_public_key_file
Existing files are never overwritten. To rotate, make a new key and list it
in the key file after the current one (one hex key per line, or one PEM
block after another): both verify; then sign with the new one and, once the
tokens of the old have expired, remove it.
`

// runKeygen is `parley keygen`.
func runKeygen(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("parley keygen", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	typ := fs.String("type", "", "hs256 or ed25519")
	path := fs.String("out", "", "the file to write (ed25519: and PATH.pub)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, keygenUsage)
			return err
		}
		return fmt.Errorf("keygen: %w\n%s", err, keygenUsage)
	}
	if *path == "" || fs.NArg() > 0 {
		return fmt.Errorf("keygen: -out PATH is required\n%s", keygenUsage)
	}
	switch *typ {
	case "hs256":
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return fmt.Errorf("keygen: %w", err)
		}
		if err := writeNew(*path, []byte(hex.EncodeToString(key)+"\n"), 0o600); err != nil {
			return err
		}
		_, err := fmt.Fprintf(out, "parley: wrote an HS256 key (%d bytes, hex) to %s: set auth.hs256_key_file to it\n", len(key), *path)
		return err
	case "ed25519":
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return fmt.Errorf("keygen: %w", err)
		}
		privDER, err := x509.MarshalPKCS8PrivateKey(priv)
		if err != nil {
			return fmt.Errorf("keygen: %w", err)
		}
		pubDER, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			return fmt.Errorf("keygen: %w", err)
		}
		pubPath := *path + ".pub"
		if _, err := os.Stat(pubPath); err == nil {
			return fmt.Errorf("keygen: %s exists; not overwritten", pubPath)
		}
		if err := writeNew(*path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: privDER}), 0o600); err != nil {
			return err
		}
		if err := writeNew(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644); err != nil {
			return err
		}
		// What the server and token.ParseEd25519PrivateKey read back.
		if _, err := token.LoadEd25519PublicKeyFile(pubPath); err != nil {
			return fmt.Errorf("keygen: %w", err)
		}
		_, err = fmt.Fprintf(out, "parley: wrote an Ed25519 private key to %s (for your auth service) and its public key to %s: set auth.ed25519_public_key_file to it\n", *path, pubPath)
		return err
	case "":
		return fmt.Errorf("keygen: -type is required\n%s", keygenUsage)
	}
	return fmt.Errorf("keygen: -type %q: want hs256 or ed25519", *typ)
}

// writeNew writes a file that must not exist yet, durably.
func writeNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("keygen: %s exists; not overwritten", path)
	}
	if err != nil {
		return fmt.Errorf("keygen: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("keygen: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("keygen: %w", err)
	}
	return f.Close()
}
