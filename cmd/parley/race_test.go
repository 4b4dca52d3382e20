//go:build race

package main

// raceEnabled: the race detector slows the key transparency audit test's
// log building about twentyfold, so it audits a smaller log there.
const raceEnabled = true
