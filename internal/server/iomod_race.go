//go:build race

package server

import "github.com/lesismal/nbio/nbhttp"

// ioMod under the race detector is nbio's blocking mode (a goroutine per
// connection). nbio hands connections from its accept goroutine to its
// epoll loop through the kernel, a happens-before the race detector cannot
// see, so it reports races inside nbio itself (which marks that code
// //go:norace). Blocking mode runs our gateway code unchanged with
// synchronisation the detector understands; scripts/test.sh also runs the
// end-to-end tests without -race on the event loop.
const ioMod = nbhttp.IOModBlocking
