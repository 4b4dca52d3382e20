package gateway

import (
	"runtime/debug"
	"time"
)

// executor runs the event loop's request handlers (nbhttp's
// ServerExecutor). nbio's default pool starts a goroutine per task when
// none is busy draining its queue, and that goroutine ends as soon as the
// queue is empty: nearly every frame ran on a new goroutine whose 8 KiB
// stack then grew, by copying, to the depth of the store and JSON code
// (5% of the node's CPU with one 1:1 message in flight per pair). Here a
// worker waits up to workerIdle for the next task before it ends, so busy
// periods reuse goroutines whose stacks have already grown. A task never
// waits for a worker: when none is idle a new one starts, so handlers
// that block (a send waiting for its fsync) hold up nothing else, as with
// nbio's pool.
type executor struct {
	work chan func() // unbuffered: a send succeeds only into an idle worker
	log  func(msg string, args ...any)
}

// workerIdle is how long a worker with nothing to do stays.
const workerIdle = 2 * time.Second

func newExecutor(log func(msg string, args ...any)) *executor {
	return &executor{work: make(chan func()), log: log}
}

// Go runs f on an idle worker or a new one.
func (e *executor) Go(f func()) {
	select {
	case e.work <- f:
	default:
		go e.worker(f)
	}
}

func (e *executor) worker(f func()) {
	e.run(f)
	t := time.NewTimer(workerIdle)
	defer t.Stop()
	for {
		select {
		case f := <-e.work:
			e.run(f)
			t.Reset(workerIdle)
		case <-t.C:
			return
		}
	}
}

// run calls f; a panic is logged with its stack and the worker goes on,
// as nbio's pool does.
func (e *executor) run(f func()) {
	defer func() {
		if err := recover(); err != nil {
			e.log("request handler panicked", "panic", err, "stack", string(debug.Stack()))
		}
	}()
	f()
}
