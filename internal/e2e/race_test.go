//go:build race

package e2e

// raceBuild: under the race detector the server runs on net/http instead of
// nbio's event loop (internal/server/iomod_race.go).
const raceBuild = true
