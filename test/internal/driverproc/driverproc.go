// Package driverproc builds bin/driver once per test binary and runs it as a
// real process (as kubelet and the sidecars see it), each under the test's
// own temporary directories, stopping it and cleaning up in t.Cleanup.
package driverproc

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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

// Driver is a running driver process.
type Driver struct {
	Endpoint string
	Socket   string
	Conn     *grpc.ClientConn
	LogPath  string
	cmd      *exec.Cmd
	done     chan struct{}
}

// Start runs the driver with args (add --endpoint yourself or let Start pick
// a socket in dir) and waits until it answers Probe. The process is stopped
// with SIGTERM in t.Cleanup (SIGKILL if it does not stop), and its log is
// printed when the test failed.
func Start(tb testing.TB, dir string, args ...string) *Driver {
	tb.Helper()
	d := &Driver{Socket: filepath.Join(dir, "csi.sock"), LogPath: filepath.Join(dir, "driver.log"), done: make(chan struct{})}
	d.Endpoint = "unix://" + d.Socket
	logFile, err := os.Create(d.LogPath)
	if err != nil {
		tb.Fatal(err)
	}
	d.cmd = exec.Command(Binary(tb), append([]string{"--endpoint=" + d.Endpoint, "--v=4"}, args...)...)
	d.cmd.Stdout, d.cmd.Stderr = logFile, logFile
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		logFile.Close()
		tb.Fatal(err)
	}
	go func() { d.cmd.Wait(); logFile.Close(); close(d.done) }()
	tb.Cleanup(func() {
		d.Stop()
		if tb.Failed() {
			data, _ := os.ReadFile(d.LogPath)
			tb.Logf("driver log %s (last 4 KiB):\n%s", d.LogPath, tail(data, 4096))
		}
	})
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
		select {
		case <-d.done:
			data, _ := os.ReadFile(d.LogPath)
			tb.Fatalf("driver exited before it was ready: %s", tail(data, 4096))
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("driver not ready after 30s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop sends SIGTERM and waits up to 30 s, then kills.
func (d *Driver) Stop() {
	select {
	case <-d.done:
		return
	default:
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
	}
}

// Kill stops the driver at once, as a crash would.
func (d *Driver) Kill() {
	d.cmd.Process.Kill()
	<-d.done
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(bytes.ToValidUTF8(b, []byte("?")))
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
