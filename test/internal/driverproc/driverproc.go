// Package driverproc builds cmd/driver once per test binary and runs it as a
// real process (internal/harness/proc), as kubelet and the sidecars see it,
// each under the test's own temporary directories.
package driverproc

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/loopvol/loopvol/internal/harness/proc"

	"github.com/loopvol/loopvol/test/internal/gobuild"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Binary builds cmd/driver once per test binary and returns its path.
func Binary(tb testing.TB) string {
	tb.Helper()
	return gobuild.Binary(tb, "github.com/loopvol/loopvol/cmd/driver")
}

// Cleanup removes the built binaries; call it from TestMain after m.Run.
func Cleanup() { gobuild.Cleanup() }

// Driver is a running driver process and a connection to its socket.
type Driver struct {
	*proc.Process
	Endpoint string
	Socket   string
	Conn     *grpc.ClientConn
}

// Start runs the driver with args (Start picks the socket, dir/csi.sock) and
// waits until it answers Probe. The process is run by internal/harness/proc:
// log in dir/driver.log, stopped with SIGTERM in t.Cleanup (SIGKILL if it
// does not stop), log printed when the test failed.
func Start(tb testing.TB, dir string, args ...string) *Driver {
	tb.Helper()
	d := &Driver{Socket: filepath.Join(dir, "csi.sock")}
	d.Endpoint = "unix://" + d.Socket
	d.Process = proc.Start(tb, Binary(tb), dir, "driver", append([]string{"--endpoint=" + d.Endpoint, "--v=4"}, args...)...)
	conn, err := grpc.NewClient(d.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	d.Conn = conn
	tb.Cleanup(func() { conn.Close() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{})
		cancel()
		if err == nil && resp.GetReady().GetValue() {
			return d
		}
		if !d.Running() {
			tb.Fatalf("driver exited before it was ready: %s", d.Tail(4096))
		}
		if time.Now().After(deadline) {
			tb.Fatalf("driver not ready after 30s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// RequireRoot skips unless the test runs as root: loop devices and mounts
// need it.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root for loop devices and mounts; run `sudo make test`")
	}
}

// Mounts returns the mountinfo lines that mention dir, for leak checks.
func Mounts(dir string) []string {
	data, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if strings.Contains(line, dir) {
			out = append(out, line)
		}
	}
	return out
}

// LoopDevicesOf returns the loop devices whose backing file lies under dir.
func LoopDevicesOf(dir string) []string {
	var out []string
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(data)), dir) {
			out = append(out, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(f))))
		}
	}
	return out
}
