//go:build race

package gateway_test

// raceBuild: the event loop's HTTP server is tested without -race only
// (its hand-off of connections to epoll is invisible to the detector;
// scripts/test.sh runs this package again without it).
const raceBuild = true
