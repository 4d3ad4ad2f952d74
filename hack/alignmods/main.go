// Command alignmods keeps the Go modules that make test builds side by side
// at one version of every module they share, so that the Go build cache
// compiles each shared package once for all of them.
//
// Why: a package's build cache key covers its dependencies' compiled
// output, so client-go at v0.37.2 built over golang.org/x/net v0.57.0 (the
// Kubernetes tools' pin) and the same client-go over x/net v0.60.0 (this
// repository's) are two compilations, and so is everything above them. On a
// cold machine make test compiled the Kubernetes client stack (api,
// apimachinery, client-go, gRPC, OpenTelemetry, Prometheus' client…) once
// per module: for the Kubernetes binaries, the kubernetes-csi sidecars, this
// repository, the Helm chart's tests and the monitoring tests. With one
// version of each shared module, and the same build settings (CGO_ENABLED=0
// and -trimpath, as hack/tools/build.sh and the images build), the copies
// are one.
//
// The versions chosen are the highest any of the modules asks for, as Go's
// minimal version selection would choose in one module: alignmods only
// raises, never lowers, so each module still gets at least what its own
// dependencies were released with. A shared module that a go.mod replaces
// (the Kubernetes staging modules, pinned by replace directives as upstream
// does) has its replacement raised instead of its requirement.
//
// Usage (from the repository root):
//
//	go run ./hack/alignmods          # report what differs; exit 1 if anything does
//	go run ./hack/alignmods -w       # raise the go.mod files until nothing differs, go mod tidy each
//
// etcd, containerd, runc and hello-populator (hack/tools/*) are left out on
// purpose: etcd and containerd are sensitive to their gRPC pin, runc is a
// cgo build (its packages are compiled apart anyway) and hello-populator's
// client-go does not build against today's.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/semver"
)

// modules are the module folders kept aligned, relative to the repository
// root.
var modules = []string{".", "hack/tools", "hack/tools/csi", "hack/helm", "hack/monitoring"}

// versions lists the modules whose packages dir's build compiles (its
// packages, their tests and everything they import; the tools tag brings in
// hack/tools' pins), each at the version the build uses: a module replaced
// by another version of itself counts at the replacement's version, one
// replaced by a folder or another module is not shared and left out. A
// module of the module graph that provides no compiled package does not
// matter to the build cache and is not listed.
//
// -e lets the listing go past hack/tools' blank imports of commands (the
// ginkgo CLI is "a program, not an importable package", which go mod tidy
// accepts); any other package error fails it.
func versions(dir string) (map[string]string, error) {
	const format = `{{with .Error}}error {{.Err}}{{"\n"}}{{end}}` +
		`{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}}{{with .Replace}} {{.Path}} {{.Version}}{{end}}{{end}}{{end}}`
	cmd := exec.Command("go", "list", "-e", "-deps", "-test", "-tags", "tools", "-f", format, "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -deps in %s: %w: %s", dir, err, strings.TrimSpace(stderr.String()))
	}
	vs := map[string]string{}
	for line := range strings.Lines(string(out)) {
		if msg, ok := strings.CutPrefix(line, "error "); ok {
			if !strings.Contains(msg, "is a program, not an importable package") {
				return nil, fmt.Errorf("go list -deps in %s: %s", dir, strings.TrimSpace(msg))
			}
			continue
		}
		f := strings.Fields(line)
		switch {
		case len(f) == 2:
			vs[f[0]] = f[1]
		case len(f) == 4 && f[2] == f[0] && f[3] != "":
			vs[f[0]] = f[3]
		}
	}
	return vs, nil
}

// change is one module to raise in one folder.
type change struct {
	dir, path, from, to string
}

// plan returns every shared module a folder has below the highest version
// any folder has, in a stable order.
func plan(all map[string]map[string]string) []change {
	highest := map[string]string{}
	count := map[string]int{}
	for _, vs := range all {
		for p, v := range vs {
			count[p]++
			if h, ok := highest[p]; !ok || semver.Compare(v, h) > 0 {
				highest[p] = v
			}
		}
	}
	var changes []change
	for _, dir := range modules {
		for p, v := range all[dir] {
			if count[p] > 1 && semver.Compare(v, highest[p]) < 0 {
				changes = append(changes, change{dir: dir, path: p, from: v, to: highest[p]})
			}
		}
	}
	slices.SortFunc(changes, func(a, b change) int {
		return strings.Compare(a.dir+" "+a.path, b.dir+" "+b.path)
	})
	return changes
}

// apply raises every change of dir in dir's go.mod, by one go mod edit:
// the replacement when the go.mod replaces the module by a version of
// itself, the requirement otherwise.
func apply(dir string, changes []change) error {
	gomod := filepath.Join(dir, "go.mod")
	data, err := os.ReadFile(gomod)
	if err != nil {
		return err
	}
	f, err := modfile.Parse(gomod, data, nil)
	if err != nil {
		return err
	}
	replaced := map[string]bool{}
	for _, r := range f.Replace {
		if r.New.Path == r.Old.Path && r.New.Version != "" {
			replaced[r.Old.Path] = true
		}
	}
	args := []string{"mod", "edit"}
	for _, c := range changes {
		if replaced[c.path] {
			args = append(args, "-replace="+c.path+"="+c.path+"@"+c.to)
		} else {
			args = append(args, "-require="+c.path+"@"+c.to)
		}
	}
	return gocmd(dir, args...)
}

func gocmd(dir string, args ...string) error {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s in %s: %w: %s", strings.Join(args, " "), dir, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func run(write bool, out io.Writer) error {
	// Raising one module can raise another's requirements in turn (its
	// go.mod asks for more), so the plan is made again until it is empty.
	for round := 1; ; round++ {
		all := map[string]map[string]string{}
		for _, dir := range modules {
			vs, err := versions(dir)
			if err != nil {
				return err
			}
			all[dir] = vs
		}
		changes := plan(all)
		if len(changes) == 0 {
			fmt.Fprintf(out, "alignmods: %s share every common module at one version\n", strings.Join(modules, ", "))
			return nil
		}
		for _, c := range changes {
			fmt.Fprintf(out, "%s: %s %s -> %s\n", c.dir, c.path, c.from, c.to)
		}
		if !write {
			return fmt.Errorf("%d module versions differ between %s: run go run ./hack/alignmods -w", len(changes), strings.Join(modules, ", "))
		}
		if round > 5 {
			return errors.New("still not aligned after 5 rounds")
		}
		byDir := map[string][]change{}
		for _, c := range changes {
			byDir[c.dir] = append(byDir[c.dir], c)
		}
		for _, dir := range modules {
			if len(byDir[dir]) == 0 {
				continue
			}
			if err := apply(dir, byDir[dir]); err != nil {
				return err
			}
			if err := gocmd(dir, "mod", "tidy"); err != nil {
				return err
			}
		}
	}
}

func main() {
	write := flag.Bool("w", false, "raise the go.mod files (and go mod tidy them) instead of only reporting what differs")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: go run ./hack/alignmods [-w]\n\nKeeps %s at one version of every module they share.\n\n", strings.Join(modules, ", "))
		flag.PrintDefaults()
	}
	flag.Parse()
	if err := run(*write, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "alignmods:", err)
		os.Exit(1)
	}
}
