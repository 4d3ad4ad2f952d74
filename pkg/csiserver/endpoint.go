package csiserver

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// ParseEndpoint returns the socket path of a "unix:///abs/path" endpoint.
// Other schemes are refused: the driver only ever talks to local sidecars and
// kubelet.
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

// listen opens the unix socket at path. A socket file left by an earlier run
// is removed; any other kind of file at path is refused, so a typo cannot
// delete someone's data. The socket is created owner-only.
func listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("create socket directory: %w", err)
	}
	st, err := os.Lstat(path)
	switch {
	case err == nil && st.Mode()&fs.ModeSocket != 0:
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
		}
	case err == nil:
		return nil, fmt.Errorf("%s exists and is not a socket", path)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	old := syscall.Umask(0o077)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return l, nil
}
