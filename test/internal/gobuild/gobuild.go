// Package gobuild builds a command of this module into a temporary directory
// once per test binary, so that tests always run the code they were built
// with, never a stale bin/ binary.
package gobuild

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sync"
	"testing"
)

type build struct {
	once sync.Once
	path string
	err  error
}

var (
	mu     sync.Mutex
	builds = map[string]*build{}
	dirs   []string
)

// Binary builds the main package pkg (an import path) once and returns the
// binary's path; a failed build fails tb.
func Binary(tb testing.TB, pkg string) string {
	tb.Helper()
	mu.Lock()
	b, ok := builds[pkg]
	if !ok {
		b = &build{}
		builds[pkg] = b
	}
	mu.Unlock()
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "loopvol-"+path.Base(pkg)+"-bin-")
		if err != nil {
			b.err = err
			return
		}
		mu.Lock()
		dirs = append(dirs, dir)
		mu.Unlock()
		b.path = filepath.Join(dir, path.Base(pkg))
		if out, err := exec.Command("go", "build", "-o", b.path, pkg).CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	})
	if b.err != nil {
		tb.Fatal(b.err)
	}
	return b.path
}

// Cleanup removes every binary built; call it from TestMain after m.Run.
func Cleanup() {
	mu.Lock()
	defer mu.Unlock()
	for _, dir := range dirs {
		os.RemoveAll(dir)
	}
	dirs = nil
}
