// Package modbuild builds a command of an upstream Go module at a release
// from the Go module proxy into the user's cache directory, so that
// benchmarks can run upstream sidecars (external-attacher,
// external-provisioner) side by side with loopvol's against the same
// control plane.
//
// Nothing of them enters this repository: the build runs in a temporary
// wrapper module that requires the upstream module at the asked version
// and repeats its replace directives (`go install module@version` refuses
// modules whose go.mod has any, and the sidecars pin their Kubernetes
// dependencies with them). Later runs reuse the cached binary.
package modbuild

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// Command is one command of an upstream module at a version.
type Command struct {
	// Module is the module path, e.g. github.com/kubernetes-csi/external-attacher/v4.
	Module string
	// Version is the module version, e.g. v4.13.0.
	Version string
	// Dir is the command's package directory in the module, e.g. cmd/csi-attacher.
	Dir string
	// CacheName names the cache directory, e.g. external-attacher.
	CacheName string
}

// Path returns where the binary lives:
// ${XDG_CACHE_HOME:-~/.cache}/loopvol/bench/<CacheName>-<Version>/<base of Dir>.
func (c Command) Path() (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory for the %s binary: %w", c.CacheName, err)
	}
	return filepath.Join(cache, "loopvol", "bench", c.CacheName+"-"+c.Version, path.Base(c.Dir)), nil
}

// Build returns the path of the command's binary, building it first unless
// the cache has it. The first build downloads the module and its
// dependencies through the module proxy (GOPROXY) and takes minutes;
// progress names what is going on.
func (c Command) Build(ctx context.Context, progress io.Writer) (string, error) {
	bin, err := c.Path()
	if err != nil {
		return "", err
	}
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return bin, nil
	}
	pkg := c.Module + "/" + c.Dir
	fmt.Fprintf(progress, "building %s@%s from the Go module proxy into %s (the first build takes minutes)\n", pkg, c.Version, bin)
	work, err := os.MkdirTemp("", "loopvol-modbuild-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)

	run := func(args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = work
		// -mod=mod lets the go command fill in the wrapper's go.sum (checked
		// against the checksum database as usual); GOWORK=off keeps any
		// go.work around out of it; GOTOOLCHAIN=local builds with this Go.
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off", "GOTOOLCHAIN=local", "GO111MODULE=on")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, tailOf(stderr.String(), 4096))
		}
		return out, nil
	}

	out, err := run("mod", "download", "-json", c.Module+"@"+c.Version)
	if err != nil {
		return "", err
	}
	var info struct{ GoMod, Error string }
	if err := json.Unmarshal(out, &info); err != nil {
		return "", fmt.Errorf("go mod download %s@%s: %w", c.Module, c.Version, err)
	}
	if info.Error != "" || info.GoMod == "" {
		return "", fmt.Errorf("go mod download %s@%s: %s", c.Module, c.Version, info.Error)
	}
	upstreamMod, err := os.ReadFile(info.GoMod)
	if err != nil {
		return "", err
	}
	goVersion, replaces := directives(upstreamMod)
	if goVersion == "" {
		goVersion = "1.26.0"
	}
	gomod := fmt.Sprintf("module loopvol.invalid/modbuild\n\ngo %s\n\nrequire %s %s\n\n%s", goVersion, c.Module, c.Version, strings.Join(replaces, "\n"))
	if err := os.WriteFile(filepath.Join(work, "go.mod"), []byte(gomod+"\n"), 0o644); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", err
	}
	tmp := bin + ".tmp"
	if _, err := run("build", "-trimpath", "-ldflags", "-X main.version="+c.Version, "-o", tmp, pkg); err != nil {
		os.Remove(tmp)
		return "", err
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	return bin, nil
}

// directives returns the go version and the replace directives (each as a
// one-line "replace old => new" statement) of a go.mod file: the upstream
// module's replaces pin its Kubernetes dependencies, and only the main
// module's replaces count, so the wrapper repeats them.
func directives(gomod []byte) (goVersion string, replaces []string) {
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	inBlock := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if i := strings.Index(line, "//"); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		switch {
		case inBlock && line == ")":
			inBlock = false
		case inBlock && line != "":
			replaces = append(replaces, "replace "+line)
		case line == "replace (":
			inBlock = true
		case strings.HasPrefix(line, "replace "):
			replaces = append(replaces, line)
		case strings.HasPrefix(line, "go "):
			goVersion = strings.TrimSpace(strings.TrimPrefix(line, "go "))
		}
	}
	return goVersion, replaces
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
