//go:build !race

package server

// stdServer is false: connections run on nbio's non-blocking event loop,
// with no goroutine per idle connection.
const stdServer = false
