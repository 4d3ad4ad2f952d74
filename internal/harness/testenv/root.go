package testenv

import (
	"os"
	"testing"
)

// RequireRoot skips the test unless it runs as root (effective uid 0).
// Real-node tests attach loop devices, make file systems and mount them,
// which only root may do; skipping keeps `go test ./...` usable as a normal
// user, while `make test` and CI run as root and so run them.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if euid := os.Geteuid(); euid != 0 {
		tb.Skipf("needs root (running as euid %d): this test uses real loop devices, mkfs and mounts; run it as root, e.g. `sudo -E go test ./...` or `make test`", euid)
	}
}

// RequireLoopDevices is [RequireRoot] plus a loop driver to ask for devices:
// without /dev/loop-control (no loop module, or a container that hides it)
// every losetup would fail for reasons the test is not about.
func RequireLoopDevices(tb testing.TB) {
	tb.Helper()
	RequireRoot(tb)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		tb.Skipf("needs /dev/loop-control for real loop devices (%v): load the loop module (modprobe loop) or run where /dev is the host's", err)
	}
}
