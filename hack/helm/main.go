// Command helm keeps deploy/helm/loopvol's templates/generated equal to the
// kustomize sources they are made from. `go -C hack/helm run . -write`
// writes them; without -write it lists what is out of date and fails.
// `go -C hack/helm test ./...` checks the same and renders the chart
// against every overlay (docs/helm.md).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

func main() {
	write := flag.Bool("write", false, "write templates/generated instead of only checking it")
	repo := flag.String("repo", "../..", "the repository's root")
	flag.Parse()
	if err := run(*repo, *write); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(repo string, write bool) error {
	want, err := generate(repo)
	if err != nil {
		return err
	}
	dir := filepath.Join(repo, chartDir, generatedDir)
	stale, err := staleFiles(dir, want)
	if err != nil {
		return err
	}
	if len(stale) == 0 {
		return nil
	}
	if !write {
		return fmt.Errorf("%s is out of date (%v): run go -C hack/helm run . -write", dir, stale)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, name := range stale {
		p := filepath.Join(dir, name)
		data, ok := want[name]
		if !ok {
			if err := os.Remove(p); err != nil {
				return err
			}
			continue
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return err
		}
	}
	fmt.Printf("wrote %s: %v\n", dir, stale)
	return nil
}

// chartDir is the chart, relative to the repository's root.
const chartDir = "deploy/helm/loopvol"

// staleFiles lists the files of dir that differ from want, are missing
// or are no longer generated.
func staleFiles(dir string, want map[string][]byte) ([]string, error) {
	var stale []string
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	have := map[string]bool{}
	for _, e := range entries {
		have[e.Name()] = true
		if _, ok := want[e.Name()]; !ok {
			stale = append(stale, e.Name())
		}
	}
	for name, data := range want {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil && !os.IsNotExist(err) {
			return nil, err
		}
		if !have[name] || !bytes.Equal(got, data) {
			stale = append(stale, name)
		}
	}
	slices.Sort(stale)
	return stale, nil
}
