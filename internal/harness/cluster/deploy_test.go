package cluster

import (
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/loopvol/loopvol/internal/harness/testenv"
)

// localOverlay is the repository's deploy/kubernetes/overlays/local.
func localOverlay(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "deploy", "kubernetes", "overlays", "local")
}

// TestOverlay renders the generated overlay on top of the repository's
// overlays/local and checks that kubelet's directory and the pool moved
// under the cluster's directory everywhere, and the rest is overlays/local's.
func TestOverlay(t *testing.T) {
	local := localOverlay(t)
	for _, port := range []int{DefaultAPIPort, 16443} {
		dir := t.TempDir()
		c := &Cluster{cfg: Config{Dir: dir, APIPort: port}, KubeletDir: filepath.Join(dir, "kubelet")}
		overlay, err := c.Overlay(local)
		if err != nil {
			t.Fatal(err)
		}
		res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), overlay)
		if err != nil {
			t.Fatalf("kustomize build %s: %v", overlay, err)
		}
		var ds appsv1.DaemonSet
		var ss appsv1.StatefulSet
		for _, r := range res.Resources() {
			y, err := r.AsYAML()
			if err != nil {
				t.Fatal(err)
			}
			switch r.GetKind() {
			case "DaemonSet":
				err = yaml.Unmarshal(y, &ds)
			case "StatefulSet":
				err = yaml.Unmarshal(y, &ss)
			case "ConfigMap":
				if r.GetName() == "loopvol-node-settings" {
					var cm corev1.ConfigMap
					err = yaml.Unmarshal(y, &cm)
					if cm.Data["kubeletDir"] != c.KubeletDir {
						t.Errorf("kubeletDir %q, want %q", cm.Data["kubeletDir"], c.KubeletDir)
					}
				}
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		for _, spec := range []*corev1.PodSpec{&ds.Spec.Template.Spec, &ss.Spec.Template.Spec} {
			if !spec.HostNetwork {
				t.Errorf("hostNetwork off")
			}
			for _, v := range spec.Volumes {
				switch v.Name {
				case "pool-default":
					if v.HostPath.Path != c.PoolDir() {
						t.Errorf("pool host path %s, want %s", v.HostPath.Path, c.PoolDir())
					}
				case "kubelet-dir":
					if v.HostPath.Path != c.KubeletDir {
						t.Errorf("kubelet host path %s, want %s", v.HostPath.Path, c.KubeletDir)
					}
				}
			}
			for _, ctr := range spec.Containers {
				if ctr.ImagePullPolicy != corev1.PullNever {
					t.Errorf("container %s: imagePullPolicy %s", ctr.Name, ctr.ImagePullPolicy)
				}
				for _, m := range ctr.VolumeMounts {
					if m.Name == "kubelet-dir" && m.MountPath != c.KubeletDir {
						t.Errorf("container %s mounts kubelet's directory at %s, want %s", ctr.Name, m.MountPath, c.KubeletDir)
					}
				}
				i := slices.IndexFunc(ctr.Env, func(e corev1.EnvVar) bool { return e.Name == "KUBERNETES_SERVICE_PORT" })
				if slices.Contains([]string{"sidecar", "csi-provisioner", "registrar"}, ctr.Name) {
					if i < 0 || ctr.Env[i].Value != strconv.Itoa(port) {
						t.Errorf("container %s: KUBERNETES_SERVICE_PORT %v, want %d", ctr.Name, ctr.Env, port)
					}
				}
			}
		}
	}
}

// TestOverlayExtraPools: an extra pool reaches both drivers as a --pool
// argument and a host directory under the cluster's, and a bad name is
// refused.
func TestOverlayExtraPools(t *testing.T) {
	local := localOverlay(t)
	dir := t.TempDir()
	c := &Cluster{cfg: Config{Dir: dir, APIPort: DefaultAPIPort}, KubeletDir: filepath.Join(dir, "kubelet")}
	for _, bad := range []string{"default", "Fast", "a/b"} {
		if _, err := c.Overlay(local, bad); err == nil {
			t.Errorf("extra pool %q accepted", bad)
		}
	}
	overlay, err := c.Overlay(local, "fast")
	if err != nil {
		t.Fatal(err)
	}
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), overlay)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", overlay, err)
	}
	checked := 0
	for _, r := range res.Resources() {
		if k := r.GetKind(); k != "DaemonSet" && k != "StatefulSet" {
			continue
		}
		y, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		var obj struct {
			Spec struct {
				Template corev1.PodTemplateSpec `json:"template"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(y, &obj); err != nil {
			t.Fatal(err)
		}
		spec := obj.Spec.Template.Spec
		driver := spec.Containers[0]
		if driver.Name != "driver" || !slices.Contains(driver.Args, "--pool=fast=/var/lib/loopvol/pools/fast") ||
			!slices.Contains(driver.Args, "--pool=default=/var/lib/loopvol/pools/default") {
			t.Errorf("%s: driver args %v lack both pools", r.GetKind(), driver.Args)
		}
		if !slices.ContainsFunc(driver.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == "pool-fast" && m.MountPath == "/var/lib/loopvol/pools/fast"
		}) {
			t.Errorf("%s: no mount of pool-fast", r.GetKind())
		}
		if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool {
			return v.Name == "pool-fast" && v.HostPath != nil && v.HostPath.Path == c.PoolDirOf("fast")
		}) {
			t.Errorf("%s: no host directory %s", r.GetKind(), c.PoolDirOf("fast"))
		}
		checked++
	}
	if checked != 2 {
		t.Fatalf("%d workloads checked, want the DaemonSet and the StatefulSet", checked)
	}
}
