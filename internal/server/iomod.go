//go:build !race

package server

import "github.com/lesismal/nbio/nbhttp"

// ioMod is nbio's non-blocking event loop: no goroutine per idle connection.
const ioMod = nbhttp.IOModNonBlocking
