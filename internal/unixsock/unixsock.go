package unixsock

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// MaxPathLen is the longest socket path a client can connect to: sun_path
// holds 108 bytes, one of them the terminating NUL.
const MaxPathLen = 107

// ParseEndpoint returns the socket path of a "unix:///abs/path" endpoint.
// Other schemes are refused: the driver and the sidecar only ever talk to
// local processes (sidecars, kubelet).
func ParseEndpoint(endpoint string) (string, error) {
	path, ok := strings.CutPrefix(endpoint, "unix://")
	if !ok {
		return "", fmt.Errorf("endpoint %q must be unix:///absolute/path", endpoint)
	}
	if !filepath.IsAbs(path) || strings.ContainsRune(path, 0) {
		return "", fmt.Errorf("endpoint %q must name an absolute socket path", endpoint)
	}
	return filepath.Clean(path), nil
}

// Listener is a listening unix socket that Listen put in place. Its Addr is
// the final path. Close stops listening and removes the socket file, unless
// the path no longer holds this socket.
type Listener struct {
	*net.UnixListener
	path     string
	dev, ino uint64

	once     sync.Once
	closeErr error
}

// Listen creates a unix socket at path with the permission bits perm
// (0o600: only the owner may connect), listens on it and returns the
// listener. The directory of path is created (0750) when missing. A stale
// socket already at path, left by an earlier run, is replaced; a socket that
// another process still serves is refused with an error wrapping ErrInUse,
// and any other kind of file there is an error too; both are left as they
// were. Listen never changes the process's umask.
//
// The socket is bound in a new temporary directory next to path that only
// the owner can enter, given its mode there and hard-linked to path, which
// fails if anything appeared at path in between; the temporary directory is
// removed before Listen returns.
func Listen(path string, perm fs.FileMode) (*Listener, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("socket path %q is not absolute", path)
	}
	if len(path) > MaxPathLen {
		return nil, fmt.Errorf("socket path %q is %d bytes long; clients cannot connect to one longer than %d", path, len(path), MaxPathLen)
	}
	if perm&^fs.ModePerm != 0 {
		return nil, fmt.Errorf("socket mode %v has bits other than permissions", perm)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create socket directory: %w", err)
	}
	// Refuse early, before anything is created.
	if _, err := staleSocket(path); err != nil {
		return nil, err
	}

	tmp, err := os.MkdirTemp(dir, ".unixsock-")
	if err != nil {
		return nil, fmt.Errorf("create a temporary directory for the socket: %w", err)
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	// MkdirTemp asks for 0700, which a umask may have narrowed further;
	// the owner must be able to create the socket in it.
	if err := os.Chmod(tmp, 0o700); err != nil {
		return nil, fmt.Errorf("make %s owner-only: %w", tmp, err)
	}
	tmpSock := filepath.Join(tmp, "s")
	ul, err := bind(tmp, tmpSock)
	if err != nil {
		return nil, err
	}
	l := &Listener{UnixListener: ul, path: path}
	// The bound name goes away with the temporary directory; Close removes
	// the final path instead.
	ul.SetUnlinkOnClose(false)
	ok := false
	defer func() {
		if !ok {
			_ = ul.Close()
		}
	}()
	if err := os.Chmod(tmpSock, perm); err != nil {
		return nil, fmt.Errorf("set the mode of the new socket: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(tmpSock, &st); err != nil {
		return nil, fmt.Errorf("stat the new socket: %w", err)
	}
	l.dev, l.ino = st.Dev, st.Ino

	stale, err := staleSocket(path)
	if err != nil {
		return nil, err
	}
	if stale {
		// A process that put its live socket at path between the check
		// and this removal would lose it here; the window is two system
		// calls wide, not the whole start of a process.
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
		}
	}
	if err := os.Link(tmpSock, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("%s appeared while the socket was being created; another process is starting there", path)
		}
		return nil, fmt.Errorf("put the socket in place at %s: %w", path, err)
	}
	ok = true
	return l, nil
}

// bind listens on sock in the directory tmp. When sock is too long for
// sun_path, it binds through /proc/self/fd/N/, N being a descriptor of tmp:
// the path is resolved by the kernel like any other, and the final path,
// which is short enough, is what clients use.
func bind(tmp, sock string) (*net.UnixListener, error) {
	name := sock
	if len(name) > MaxPathLen {
		fd, err := unix.Open(tmp, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", tmp, err)
		}
		defer func() { _ = unix.Close(fd) }()
		name = fmt.Sprintf("/proc/self/fd/%d/%s", fd, filepath.Base(sock))
	}
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on a new socket: %w", err)
	}
	return ul, nil
}

// ErrInUse is returned by Listen when another process still serves the
// socket at the path.
var ErrInUse = errors.New("socket is served by another process")

// staleSocket reports whether path holds a stale socket (true) or nothing
// (false). It fails when the path holds anything else, or a socket that
// still accepts connections: a second driver started on the same path by
// mistake must not cut the first one off from kubelet and the sidecars.
func staleSocket(path string) (bool, error) {
	st, err := os.Lstat(path)
	switch {
	case err == nil && st.Mode()&fs.ModeSocket != 0:
		return stale(path)
	case err == nil:
		return false, fmt.Errorf("%s exists and is not a socket (%s); refusing to replace it", path, st.Mode().Type())
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	default:
		return false, fmt.Errorf("stat %s: %w", path, err)
	}
}

// Path is the socket's path.
func (l *Listener) Path() string { return l.path }

// Addr is the socket's final path (not the temporary one it was bound at).
func (l *Listener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

// InPlace reports whether the path still holds this listener's socket. It is
// false, with no error, when the file is gone or another file (another
// process's socket) is there now.
func (l *Listener) InPlace() (bool, error) {
	var st unix.Stat_t
	err := unix.Lstat(l.path, &st)
	switch {
	case errors.Is(err, syscall.ENOENT):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("stat %s: %w", l.path, err)
	}
	return st.Dev == l.dev && st.Ino == l.ino, nil
}

// Close stops listening and removes the socket file if it is still this
// listener's. Calling it again does nothing and returns the first result.
func (l *Listener) Close() error {
	l.once.Do(func() {
		l.closeErr = l.UnixListener.Close()
		// Between this check and the removal another process could put
		// its socket there; the window is a few system calls, against the
		// whole shutdown of a listener that removes the path blindly.
		if mine, err := l.InPlace(); err == nil && mine {
			if err := os.Remove(l.path); err != nil && !errors.Is(err, fs.ErrNotExist) && l.closeErr == nil {
				l.closeErr = fmt.Errorf("remove socket %s: %w", l.path, err)
			}
		}
	})
	return l.closeErr
}

// stale tells a stale socket from a live one by connecting to it. A
// connection that is refused (ECONNREFUSED: nothing listens) or finds no
// file (ENOENT: removed in between) is stale; a connection that succeeds,
// also one queued by a process too busy to accept it, is live. Anything else
// (EACCES, say) leaves it unknown, and Listen refuses rather than guess.
func stale(path string) (bool, error) {
	c, err := net.DialTimeout("unix", path, dialTimeout)
	switch {
	case err == nil:
		_ = c.Close()
		return false, fmt.Errorf("%s: %w; stop it first, or give this process another endpoint", path, ErrInUse)
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ENOENT):
		return true, nil
	case errors.Is(err, syscall.EAGAIN):
		// The listener's backlog is full: it is alive, only busy.
		return false, fmt.Errorf("%s: %w (its backlog is full)", path, ErrInUse)
	default:
		return false, fmt.Errorf("cannot tell whether %s is still served, refusing to replace it: %w", path, err)
	}
}

// dialTimeout bounds the connection attempt of stale. A unix socket answers
// at once whether or not anyone listens, so the bound only matters for a
// process that stopped accepting with a full backlog.
const dialTimeout = time.Second
