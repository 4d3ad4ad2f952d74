package main

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestToolImagesAreTheClusterOnes holds the tool images' tags to what the
// rest of the repository expects of them: the provisioner's and the
// attacher's to the versions hack/tools builds, the provisioner's to
// overlays/local's newTag, pause's to the sandbox
// image of internal/cluster, busybox's to the tests' workload image.
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
		"csi-provisioner": {"hack/tools/provisioner/go.mod", "github.com/kubernetes-csi/external-provisioner/v6"},
		"csi-attacher":    {"hack/tools/attacher/go.mod", "github.com/kubernetes-csi/external-attacher/v4"},
	} {
		if want := pin.module + " " + tags[name] + "\n"; !strings.Contains(read(pin.gomod), want) {
			t.Errorf("%s does not require %q", pin.gomod, strings.TrimSpace(want))
		}
	}
	overlay := read("deploy/kubernetes/overlays/local/kustomization.yaml")
	if !regexp.MustCompile(`newName: localhost/loopvol/csi-provisioner\s+newTag: ` + regexp.QuoteMeta(tags["csi-provisioner"]) + `\n`).MatchString(overlay) {
		t.Errorf("overlays/local does not name localhost/loopvol/csi-provisioner:%s", tags["csi-provisioner"])
	}
	for name, file := range map[string]string{"pause": "internal/cluster/config.go", "busybox": "internal/cluster/workload.go"} {
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
