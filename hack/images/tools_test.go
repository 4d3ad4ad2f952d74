package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestToolImagesAreTheClusterOnes holds the tool images' tags to what the
// rest of the repository expects of them: the provisioner's and the
// attacher's and the snapshotter's to the versions hack/tools builds, the provisioner's to
// overlays/local's newTag, pause's to the sandbox
// image of internal/harness/cluster, busybox's to the tests' workload image.
func TestToolImagesAreTheClusterOnes(t *testing.T) {
	read := func(p string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join("..", "..", p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	tags := map[string]string{}
	for _, r := range toolRecipes {
		tags[r.name] = r.tag
	}
	for name, pin := range map[string]struct{ gomod, module string }{
		"csi-provisioner":     {"hack/tools/csi/go.mod", "github.com/kubernetes-csi/external-provisioner/v6"},
		"csi-attacher":        {"hack/tools/csi/go.mod", "github.com/kubernetes-csi/external-attacher/v4"},
		"csi-snapshotter":     {"hack/tools/csi/go.mod", "github.com/kubernetes-csi/external-snapshotter/v8"},
		"snapshot-controller": {"hack/tools/csi/go.mod", "github.com/kubernetes-csi/external-snapshotter/v8"},
	} {
		if want := pin.module + " " + tags[name] + "\n"; !strings.Contains(read(pin.gomod), want) {
			t.Errorf("%s does not require %q", pin.gomod, strings.TrimSpace(want))
		}
	}
	overlay := read("deploy/kubernetes/overlays/local/kustomization.yaml")
	if !regexp.MustCompile(`newName: localhost/loopvol/csi-provisioner\s+newTag: ` + regexp.QuoteMeta(tags["csi-provisioner"]) + `\n`).MatchString(overlay) {
		t.Errorf("overlays/local does not name localhost/loopvol/csi-provisioner:%s", tags["csi-provisioner"])
	}
	for name, file := range map[string]string{"pause": "internal/harness/cluster/config.go", "busybox": "internal/harness/cluster/workload.go"} {
		if ref := `"localhost/loopvol/` + name + ":" + tags[name] + `"`; !strings.Contains(read(file), ref) {
			t.Errorf("%s does not use %s", file, ref)
		}
	}
}

// TestPauseImage builds the pause image from a stand-in binary and reads
// it back: the binary alone, as /pause, its entrypoint, not root.
func TestPauseImage(t *testing.T) {
	b := controllerBuilder(t)
	if err := os.WriteFile(filepath.Join(b.binDir, "pause"), []byte("binary pause"), 0o755); err != nil {
		t.Fatal(err)
	}
	b.version = "3.10"
	var r recipe
	for _, tr := range toolRecipes {
		if tr.name == "pause" {
			r = tr.recipe
		}
	}
	img, err := b.image(r)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := flatten(t, img), map[string]string{"pause": "0 -rwxr-xr-x 0:0 binary pause"}; !reflect.DeepEqual(got, want) {
		t.Errorf("files %v, want %v", got, want)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cf.Config.Entrypoint, []string{"/pause"}) || cf.Config.User != "65535:65535" || !cf.Created.Time.Equal(time.Unix(1700000000, 0)) {
		t.Errorf("config %+v", cf.Config)
	}
}

// TestFullReferenceTags builds a tool image that is also named by a full
// reference, as the e2e suite's test images are, through run: the OCI
// index names it by both (containerd's name annotation, which ctr images
// import uses, and the tag); an opt-in image is built only when -images
// names it.
func TestFullReferenceTags(t *testing.T) {
	saved := toolRecipes
	t.Cleanup(func() { toolRecipes = saved })
	toolRecipes = []toolRecipe{{
		recipe: recipe{
			name:       "fake",
			from:       "scratch",
			binaries:   []placement{{src: "fake", dst: "/fake"}},
			entrypoint: []string{"/fake"},
			cmd:        []string{"pause"},
		},
		tag:   "2.66.1",
		refs:  []string{"registry.k8s.io/e2e-test-images/fake:2.66.1"},
		optIn: true,
	}}
	tools, bin, out, cache := t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(tools, "fake"), []byte("binary fake"), 0o755); err != nil {
		t.Fatal(err)
	}
	args := []string{"-bin", bin, "-tools", tools, "-out", out, "-cache", cache, "-repo", "localhost/loopvol"}

	// -images names it alone: the loopvol images, which need the static
	// binaries that bin lacks, are not built.
	if err := run(append(args, "-images", "fake")); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(out, "fake", "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	var idx struct {
		Manifests []struct {
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(raw, &idx); err != nil {
		t.Fatal(err)
	}
	var names, tags []string
	for _, m := range idx.Manifests {
		names = append(names, m.Annotations[annotationContainerdName])
		tags = append(tags, m.Annotations[annotationRefName])
		if m.Digest != idx.Manifests[0].Digest {
			t.Errorf("two references, two images: %s and %s", m.Digest, idx.Manifests[0].Digest)
		}
	}
	if want := []string{"localhost/loopvol/fake:2.66.1", "registry.k8s.io/e2e-test-images/fake:2.66.1"}; !reflect.DeepEqual(names, want) {
		t.Errorf("names %q, want %q", names, want)
	}
	if want := []string{"2.66.1", "2.66.1"}; !reflect.DeepEqual(tags, want) {
		t.Errorf("tags %q, want %q", tags, want)
	}
	if _, err := os.Stat(filepath.Join(out, "fake.tar")); err != nil {
		t.Errorf("no archive for ctr images import: %v", err)
	}

	for _, tc := range []struct {
		name  string
		want  map[string]bool
		optIn bool
		built bool
	}{
		{name: "default set, opt-in → left out", want: nil, optIn: true, built: false},
		{name: "default set → built", want: nil, optIn: false, built: true},
		{name: "named, opt-in → built", want: map[string]bool{"fake": true}, optIn: true, built: true},
		{name: "others named → left out", want: map[string]bool{"pause": true}, optIn: false, built: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := toolRecipe{recipe: recipe{name: "fake"}, optIn: tc.optIn}
			if got := r.selected(tc.want); got != tc.built {
				t.Errorf("selected %v, want %v", got, tc.built)
			}
		})
	}
}

// TestE2EImagesAreTheSuiteOnes holds the full references of the test
// images to the ones the upstream e2e suite of hack/tools/go.mod's
// k8s.io/kubernetes asks for (test/utils/image/manifest.go), read from
// the module cache.
func TestE2EImagesAreTheSuiteOnes(t *testing.T) {
	cmd := exec.Command("go", "list", "-mod=mod", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes")
	cmd.Dir = filepath.Join("..", "tools")
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOPROXY=off")
	dir, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(dir)) == "" {
		t.Skipf("k8s.io/kubernetes is not in the module cache (hack/tools/build.sh e2e.test fetches it): %v", err)
	}
	manifest, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(dir)), "test", "utils", "image", "manifest.go"))
	if err != nil {
		t.Fatal(err)
	}
	for id, image := range map[string]string{"Agnhost": "agnhost", "BusyBox": "busybox", "Nginx": "nginx", "GlibcDnsTesting": "glibc-dns-testing"} {
		m := regexp.MustCompile(`configs\[` + id + `\] = Config\{list\.PromoterE2eRegistry, "` + image + `", "([^"]+)"\}`).FindSubmatch(manifest)
		if m == nil {
			t.Fatalf("manifest.go names no %s image", id)
		}
		want := e2eRegistry + "/" + image + ":" + string(m[1])
		var refs []string
		for _, r := range toolRecipes {
			if r.name == image {
				refs = r.refs
			}
		}
		if !slices.Contains(refs, want) {
			t.Errorf("the %s image is named %q, the suite asks for %s", image, refs, want)
		}
	}
	// The populator's image is named in a manifest of the suite's.
	deploy, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(dir)), "test", "e2e", "testing-manifests", "storage-csi", "any-volume-datasource", "hello-populator-deploy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s+image: (\S+)$`).FindSubmatch(deploy)
	if m == nil {
		t.Fatal("hello-populator-deploy.yaml names no image")
	}
	if i := slices.IndexFunc(toolRecipes, func(r toolRecipe) bool { return r.name == "hello-populator" }); i < 0 || !slices.Contains(toolRecipes[i].refs, string(m[1])) {
		t.Errorf("no hello-populator image is named %s, which the suite deploys", m[1])
	}
	agnhostVersion, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(dir)), "test", "images", "agnhost", "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range toolRecipes {
		if r.name == "agnhost" && r.tag != strings.TrimSpace(string(agnhostVersion)) {
			t.Errorf("agnhost tagged %s, its source is version %s", r.tag, agnhostVersion)
		}
	}
}
