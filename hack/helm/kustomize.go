package main

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// A variant is one installation the chart must reproduce: an overlay of
// deploy/kubernetes, optionally with components, and the chart's values
// for it in ci/<name>-values.yaml.
type variant struct {
	name       string
	overlay    string   // relative to deploy/kubernetes
	components []string // relative to deploy/kubernetes
}

// variants are what the equality test renders. The three overlays users
// pick (docs/deploy.md), dev for the log verbosity, and shared with both
// optional components, the one overlay where they make sense together.
var variants = []variant{
	{name: "local", overlay: "overlays/local"},
	{name: "dev", overlay: "overlays/dev"},
	{name: "shared", overlay: "overlays/shared"},
	{name: "distributed", overlay: "overlays/distributed"},
	{name: "shared-fencing-snapshots", overlay: "overlays/shared", components: []string{"components/fencing", "components/snapshotter"}},
	{name: "local-snapshots", overlay: "overlays/local", components: []string{"components/snapshotter"}},
}

// kustomizeRoot is where deploy/kubernetes sits in the in-memory file
// system the variants are built in.
const kustomizeRoot = "/deploy/kubernetes"

// loadKustomizeTree copies deploy/kubernetes into an in-memory file system,
// so that a variant with components can get a kustomization of its own
// without writing into the repository.
func loadKustomizeTree(repo string) (filesys.FileSystem, error) {
	mem := filesys.MakeFsInMemory()
	src := filepath.Join(repo, "deploy", "kubernetes")
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return mem.WriteFile(path.Join(kustomizeRoot, filepath.ToSlash(rel)), data)
	})
	return mem, err
}

// kustomizeBuild is `kustomize build` of the variant, as YAML.
func kustomizeBuild(mem filesys.FileSystem, v variant) ([]byte, error) {
	dir := path.Join(kustomizeRoot, v.overlay)
	if len(v.components) > 0 {
		dir = path.Join(kustomizeRoot, "variants", v.name)
		var b strings.Builder
		fmt.Fprintf(&b, "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../../%s\ncomponents:\n", v.overlay)
		for _, c := range v.components {
			fmt.Fprintf(&b, "  - ../../%s\n", c)
		}
		if err := mem.WriteFile(path.Join(dir, "kustomization.yaml"), []byte(b.String())); err != nil {
			return nil, err
		}
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(mem, dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build of %s: %w", v.name, err)
	}
	return m.AsYaml()
}
