package unixsock

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestParseEndpoint(t *testing.T) {
	tests := []struct {
		in   string
		want string
		ok   bool
	}{
		{in: "unix:///run/csi/csi.sock", want: "/run/csi/csi.sock", ok: true},
		{in: "unix:///run/csi/../csi.sock", want: "/run/csi.sock", ok: true},
		{in: "unix://relative.sock"},
		{in: "tcp://127.0.0.1:10000"},
		{in: "/run/csi.sock"},
		{in: "unix:///a\x00b"},
		{in: ""},
	}
	for _, tc := range tests {
		got, err := ParseEndpoint(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseEndpoint(%q) = %q, %v; want %q, ok=%t", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// listen is Listen that fails the test on an error and closes the listener
// at the end.
func listen(t *testing.T, path string, perm fs.FileMode) *Listener {
	t.Helper()
	l, err := Listen(path, perm)
	if err != nil {
		t.Fatalf("Listen(%s): %v", path, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// staleSocketAt leaves a socket file at path with nothing listening, as a
// process killed with SIGKILL does.
func staleSocketAt(t *testing.T, path string) {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	_ = l.Close()
}

// serves checks that a client can connect to path and reach l.
func serves(t *testing.T, l *Listener) {
	t.Helper()
	accepted := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			_, err = c.Write([]byte("hi"))
			c.Close()
		}
		accepted <- err
	}()
	c, err := net.Dial("unix", l.Path())
	if err != nil {
		t.Fatalf("dial %s: %v", l.Path(), err)
	}
	defer c.Close()
	buf := make([]byte, 2)
	if _, err := c.Read(buf); err != nil || string(buf) != "hi" {
		t.Fatalf("read from %s: %q, %v", l.Path(), buf, err)
	}
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
}

// entries lists dir, to show that no temporary directory was left behind.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

func TestListenCreatesAnOwnerOnlySocket(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new", "dir")
	path := filepath.Join(dir, "csi.sock")
	for _, perm := range []fs.FileMode{0o600, 0o660} {
		l := listen(t, path, perm)
		st, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Type() != fs.ModeSocket || st.Mode().Perm() != perm {
			t.Errorf("socket mode %v, want a socket with %v", st.Mode(), perm)
		}
		if got := entries(t, dir); len(got) != 1 || got[0] != "csi.sock" {
			t.Errorf("directory holds %q, want only csi.sock", got)
		}
		if got := l.Addr().String(); got != path {
			t.Errorf("Addr() = %q, want %q", got, path)
		}
		serves(t, l)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestListenReplacesAStaleSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "csi.sock")
	staleSocketAt(t, path)
	l := listen(t, path, 0o600)
	if ok, err := l.InPlace(); err != nil || !ok {
		t.Fatalf("InPlace() = %t, %v after replacing a stale socket", ok, err)
	}
	serves(t, l)
}

// helperEnv makes the test binary, run again as a child process, serve the
// socket named in the variable (see TestMain).
const helperEnv = "UNIXSOCK_TEST_SERVE"

func TestMain(m *testing.M) {
	if path := os.Getenv(helperEnv); path != "" {
		serveForever(path)
	}
	os.Exit(m.Run())
}

// serveForever listens on path, says "ready" on stdout and accepts
// connections until it is killed.
func serveForever(path string) {
	l, err := net.Listen("unix", path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Println("ready")
	for {
		c, err := l.Accept()
		if err != nil {
			os.Exit(3)
		}
		c.Close()
	}
}

// TestListenRefusesALiveSocket: a socket another process serves is not
// taken over, by Listen or by anything it does on the way; once that
// process is killed (leaving its socket file behind, as SIGKILL does), the
// same Listen replaces the stale socket.
func TestListenRefusesALiveSocket(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "csi.sock")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("helper said %q, %v; want ready", line, err)
	}
	var before unix.Stat_t
	if err := unix.Lstat(path, &before); err != nil {
		t.Fatal(err)
	}

	for range 3 {
		l, err := Listen(path, 0o600)
		if err == nil {
			l.Close()
			t.Fatal("Listen took over a socket another process serves")
		}
		if !errors.Is(err, ErrInUse) {
			t.Errorf("Listen = %v, want an error wrapping ErrInUse", err)
		}
	}
	var after unix.Stat_t
	if err := unix.Lstat(path, &after); err != nil || after.Ino != before.Ino {
		t.Fatalf("the live socket was replaced or removed (inode %d → %d, %v)", before.Ino, after.Ino, err)
	}
	if got := entries(t, dir); len(got) != 1 {
		t.Errorf("directory holds %q, want only the live socket", got)
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("the other process no longer serves its socket: %v", err)
	}
	c.Close()

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("the killed process's socket file is gone (%v); the test wants it stale", err)
	}
	l := listen(t, path, 0o600)
	serves(t, l)
}

func TestListenRefusesOtherFiles(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "data")
	if err := os.WriteFile(file, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	subdir := filepath.Join(dir, "subdir")
	if err := os.Mkdir(subdir, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{file, subdir, link} {
		if l, err := Listen(path, 0o600); err == nil {
			l.Close()
			t.Errorf("Listen over %s succeeded", path)
		}
	}
	if data, _ := os.ReadFile(file); string(data) != "precious" {
		t.Error("the file was changed")
	}
	if st, err := os.Lstat(link); err != nil || st.Mode().Type() != fs.ModeSymlink {
		t.Errorf("the symlink was changed: %v, %v", st, err)
	}
	if got := entries(t, dir); strings.Join(got, " ") != "data link subdir" {
		t.Errorf("directory holds %q, want only what the test made", got)
	}
}

func TestListenRefusesBadPaths(t *testing.T) {
	long := "/" + strings.Repeat("d", MaxPathLen)
	for _, path := range []string{"relative.sock", long} {
		if l, err := Listen(path, 0o600); err == nil {
			l.Close()
			t.Errorf("Listen(%q) succeeded", path)
		}
	}
	if l, err := Listen(filepath.Join(t.TempDir(), "s"), fs.ModeSetuid|0o600); err == nil {
		l.Close()
		t.Error("Listen with a setuid mode succeeded")
	}
}

// A final path close to the limit has a temporary path beyond it; the
// socket is bound through /proc/self/fd instead.
func TestListenNearThePathLimit(t *testing.T) {
	base := t.TempDir()
	name := strings.Repeat("x", MaxPathLen-len(base)-1)
	path := filepath.Join(base, name)
	if len(path) != MaxPathLen {
		t.Fatalf("test path is %d bytes, want %d", len(path), MaxPathLen)
	}
	l := listen(t, path, 0o600)
	serves(t, l)
	if got := entries(t, base); len(got) != 1 || got[0] != name {
		t.Errorf("directory holds %q, want only the socket", got)
	}
}

func TestCloseRemovesOnlyItsOwnSocket(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "reg.sock")

	l := listen(t, path, 0o600)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket left after Close: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}

	// Someone removed the socket and a newer process put its own in place:
	// the old one's Close leaves the new one alone.
	old := listen(t, path, 0o600)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	newer := listen(t, path, 0o600)
	if ok, _ := old.InPlace(); ok {
		t.Error("the replaced listener says it is in place")
	}
	if ok, _ := newer.InPlace(); !ok {
		t.Error("the newer listener says it is not in place")
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	serves(t, newer)

	// Deleted by someone else: InPlace says so, Close does not fail.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if ok, err := newer.InPlace(); ok || err != nil {
		t.Errorf("InPlace() = %t, %v after the socket was deleted", ok, err)
	}
	if err := newer.Close(); err != nil {
		t.Errorf("Close after the socket was deleted: %v", err)
	}
}

// procUmask reads the process's umask from /proc/self/status, which, unlike
// syscall.Umask, does not change it.
func procUmask(t *testing.T) string {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	s := bufio.NewScanner(bytes.NewReader(data))
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "Umask:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Skip("this kernel does not report Umask in /proc/self/status")
	return ""
}

// TestListenLeavesTheUmaskAlone: files created by other goroutines while
// sockets are made keep the umask's mode, and the umask never moves.
func TestListenLeavesTheUmaskAlone(t *testing.T) {
	old := syscall.Umask(0o022)
	t.Cleanup(func() { syscall.Umask(old) })
	want := procUmask(t)
	if want != "0022" {
		t.Fatalf("umask reads %s after setting 0022", want)
	}

	dir := t.TempDir()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var seen atomic.Value
	var wrongModes atomic.Int64
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if got := procUmask(t); got != want {
				seen.Store(got)
			}
		}
	})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			f := filepath.Join(dir, "file")
			if err := os.WriteFile(f, nil, 0o666); err != nil {
				t.Error(err)
				return
			}
			if st, err := os.Stat(f); err != nil || st.Mode().Perm() != 0o644 {
				wrongModes.Add(1)
			}
			os.Remove(f)
		}
	})
	deadline := time.Now().Add(500 * time.Millisecond)
	n := 0
	for ; n < 50 || time.Now().Before(deadline); n++ {
		l, err := Listen(filepath.Join(dir, "csi.sock"), 0o600)
		if err != nil {
			t.Fatal(err)
		}
		l.Close()
	}
	close(stop)
	wg.Wait()
	if v := seen.Load(); v != nil {
		t.Errorf("the umask was %s at some point while %d sockets were created; want %s throughout", v, n, want)
	}
	if c := wrongModes.Load(); c > 0 {
		t.Errorf("%d files created meanwhile got a mode other than 0644", c)
	}
	if got := syscall.Umask(0o022); got != 0o022 {
		t.Errorf("umask %#o after Listen, want 0022", got)
	}
}

// A umask that takes the owner's bits cannot stop the socket from being
// made or give it another mode.
func TestListenUnderAStrictUmask(t *testing.T) {
	old := syscall.Umask(0o277)
	t.Cleanup(func() { syscall.Umask(old) })
	path := filepath.Join(t.TempDir(), "csi.sock")
	l := listen(t, path, 0o600)
	if st, err := os.Lstat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v; want 0600", st.Mode(), err)
	}
	serves(t, l)
}
