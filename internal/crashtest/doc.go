// Package crashtest holds black-box tests that run the real parley binary
// as a child process and kill it with SIGKILL mid-traffic, to prove that
// every acknowledged message survives a crash exactly once with dense seq.
package crashtest
