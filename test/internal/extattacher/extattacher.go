// Package extattacher builds the upstream external-attacher
// (github.com/kubernetes-csi/external-attacher/v4, cmd/csi-attacher) from the
// Go module proxy, so that benchmarks can run it side by side with loopvol's
// attacher against the same control plane.
//
// Nothing of it enters this repository: the build runs in a temporary
// wrapper module that requires the upstream module at the asked version
// (`go install module@version` refuses modules whose go.mod has replace
// directives, and external-attacher's has eight), and the binary goes to
// the user's cache directory, where later runs reuse it.
package extattacher

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Module is the upstream module path.
const Module = "github.com/kubernetes-csi/external-attacher/v4"

// Path returns where the binary of version lives:
// ${XDG_CACHE_HOME:-~/.cache}/loopvol/bench/external-attacher-<version>/csi-attacher.
func Path(version string) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory for the external-attacher binary: %w", err)
	}
	return filepath.Join(cache, "loopvol", "bench", "external-attacher-"+version, "csi-attacher"), nil
}

// Build returns the path of external-attacher's csi-attacher at version
// (e.g. "v4.13.0"), building it first unless the cache has it. The first
// build downloads the module and its dependencies through the module proxy
// (GOPROXY) and takes minutes; progress names what is going on.
func Build(ctx context.Context, version string, progress io.Writer) (string, error) {
	bin, err := Path(version)
	if err != nil {
		return "", err
	}
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return bin, nil
	}
	fmt.Fprintf(progress, "building %s/cmd/csi-attacher@%s from the Go module proxy into %s (the first build takes minutes)\n", Module, version, bin)
	work, err := os.MkdirTemp("", "loopvol-extattacher-build-")
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

	out, err := run("mod", "download", "-json", Module+"@"+version)
	if err != nil {
		return "", err
	}
	var info struct{ GoMod, Error string }
	if err := json.Unmarshal(out, &info); err != nil {
		return "", fmt.Errorf("go mod download %s@%s: %w", Module, version, err)
	}
	if info.Error != "" || info.GoMod == "" {
		return "", fmt.Errorf("go mod download %s@%s: %s", Module, version, info.Error)
	}
	upstreamMod, err := os.ReadFile(info.GoMod)
	if err != nil {
		return "", err
	}
	goVersion, replaces := directives(upstreamMod)
	if goVersion == "" {
		goVersion = "1.26.0"
	}
	gomod := fmt.Sprintf("module loopvol.invalid/extattacher-build\n\ngo %s\n\nrequire %s %s\n\n%s", goVersion, Module, version, strings.Join(replaces, "\n"))
	if err := os.WriteFile(filepath.Join(work, "go.mod"), []byte(gomod+"\n"), 0o644); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", err
	}
	tmp := bin + ".tmp"
	if _, err := run("build", "-trimpath", "-ldflags", "-X main.version="+version, "-o", tmp, Module+"/cmd/csi-attacher"); err != nil {
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
