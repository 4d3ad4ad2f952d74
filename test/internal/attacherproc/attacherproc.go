// Package attacherproc builds cmd/attacher once per test binary and runs it
// as a real process (internal/harness/proc).
package attacherproc

import (
	"net"
	"testing"

	"github.com/loopvol/loopvol/internal/harness/proc"
	"github.com/loopvol/loopvol/test/internal/gobuild"
)

// Binary builds cmd/attacher once per test binary and returns its path.
func Binary(tb testing.TB) string {
	tb.Helper()
	return gobuild.Binary(tb, "github.com/loopvol/loopvol/cmd/attacher")
}

// Cleanup removes the built binaries; call it from TestMain after m.Run.
func Cleanup() { gobuild.Cleanup() }

// Attacher is one running (or ended) attacher process.
type Attacher = proc.Process

// Start runs the attacher with args and returns at once: the tests wait for
// what the attacher does, not for a readiness signal. The log goes to
// dir/<name>.log. The process is stopped (SIGTERM, then SIGKILL) in
// t.Cleanup, and its log tail is printed when the test has failed. It also
// dies with the test binary (PR_SET_PDEATHSIG), so a test that panics
// leaves nothing running.
func Start(tb testing.TB, dir, name string, args ...string) *Attacher {
	tb.Helper()
	return proc.Start(tb, Binary(tb), dir, name, args...)
}

// FreeAddress returns 127.0.0.1:<port> with a port that was free a moment
// ago, for --http-endpoint. Another process could take it in between; on
// this test machine nothing else hands out ports that fast.
func FreeAddress(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
