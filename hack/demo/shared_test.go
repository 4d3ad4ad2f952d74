package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// TestSharedOverlay: the repository's overlays/shared with its NFS pool
// replaced by the base's host directory in both workloads, and
// overlays/local's settings (images never pulled, the host network, the
// API on loopback) on top; a kustomization with patch files is refused.
func TestSharedOverlay(t *testing.T) {
	overlays := filepath.Join("..", "..", "deploy", "kubernetes", "overlays")
	dir, err := sharedOverlay(filepath.Join(overlays, "local"), filepath.Join(overlays, "shared"), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range res.Resources() {
		if r.GetKind() != "DaemonSet" && r.GetKind() != "StatefulSet" {
			continue
		}
		y, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		var ds appsv1.DaemonSet // a StatefulSet's template is at the same path
		if err := yaml.Unmarshal(y, &ds); err != nil {
			t.Fatal(err)
		}
		spec := ds.Spec.Template.Spec
		seen[r.GetKind()] = true
		for _, v := range spec.Volumes {
			if v.Name == "pool-default" && (v.NFS != nil || v.HostPath == nil || v.HostPath.Path != basePoolPath) {
				t.Errorf("%s: pool volume %+v, want only the host path %s", r.GetKind(), v.VolumeSource, basePoolPath)
			}
		}
		if !spec.HostNetwork {
			t.Errorf("%s: not on the host network (overlays/local's patch missing)", r.GetKind())
		}
		for _, c := range spec.Containers {
			if c.ImagePullPolicy != "Never" {
				t.Errorf("%s: container %s pull policy %q, want Never", r.GetKind(), c.Name, c.ImagePullPolicy)
			}
			if strings.Contains(c.Image, "registry.k8s.io") {
				t.Errorf("%s: container %s image %s, want the local one", r.GetKind(), c.Name, c.Image)
			}
		}
	}
	if !seen["DaemonSet"] || !seen["StatefulSet"] {
		t.Errorf("workloads rendered: %v, want a DaemonSet and a StatefulSet", seen)
	}

	t.Run("a patch file in local → refused", func(t *testing.T) {
		local := t.TempDir()
		if err := os.WriteFile(filepath.Join(local, "kustomization.yaml"), []byte("patches:\n  - path: node.yaml\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := sharedOverlay(local, filepath.Join(overlays, "shared"), t.TempDir()); err == nil || !strings.Contains(err.Error(), "node.yaml") {
			t.Errorf("got %v, want an error naming the patch file", err)
		}
	})
}
