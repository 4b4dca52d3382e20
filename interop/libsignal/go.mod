// An interoperability test against go.mau.fi/libsignal (GPL-3.0). It is a
// module of its own so that the GPL code is never a dependency of Parley's
// main module nor linked into its binary; scripts/test.sh runs it.
module github.com/parley-im/parley/interop/libsignal

go 1.26.8

require (
	github.com/parley-im/parley v0.0.0
	go.mau.fi/libsignal v0.2.1
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/gofrs/flock v0.13.2 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/parley-im/parley => ../..
