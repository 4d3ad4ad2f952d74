// Command images builds loopvol's container images without Docker, as OCI
// image layouts and OCI archives that `ctr images import` reads. The node
// image's root filesystem is unpacked from Debian packages that apt
// downloads (and keeps in a cache); the binaries are the static ones that
// `make static` builds. The Dockerfile at the top of the repository is the
// same recipe for Docker. docs/images.md tells more.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

// tags collects repeated -tag flags.
type tags []string

func (t *tags) String() string     { return strings.Join(*t, ",") }
func (t *tags) Set(v string) error { *t = append(*t, v); return nil }

func run(args []string) error {
	home, _ := os.UserHomeDir()
	fs := flag.NewFlagSet("images", flag.ContinueOnError)
	binDir := fs.String("bin", "", "Directory of the static binaries driver and attacher (required).")
	out := fs.String("out", "_output/images", "Directory that receives <image>/ (OCI layout) and <image>.tar (OCI archive).")
	cache := fs.String("cache", filepath.Join(home, ".cache", "loopvol"), "Cache directory: debs/ (downloaded packages) and layers/ (built layers).")
	repo := fs.String("repo", "localhost/loopvol", "Repository the images are named in: <repo>/<image>:<tag>.")
	created := fs.String("created", "0", "Creation time of the images in seconds since the epoch (e.g. the commit's), so that builds repeat bit for bit.")
	only := fs.String("images", "", "Comma-separated images to build (default: all).")
	toolDir := fs.String("tools", "", "Directory of the one-node cluster's tool binaries csi-provisioner, csi-attacher, csi-snapshotter, snapshot-controller, agnhost, hello-populator and pause (hack/tools/build.sh builds them into bin/); when set, their images "+
		"<repo>/<tool> are built too, tagged with the tool's version (and, for the upstream e2e suite's test images, by the names it asks for).")
	var tagList tags
	fs.Var(&tagList, "tag", "Tag of the images; repeat for more (default: dev). The first is also the version label.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *binDir == "" {
		return fmt.Errorf("-bin is required")
	}
	if len(tagList) == 0 {
		tagList = tags{"dev"}
	}
	secs, err := strconv.ParseInt(*created, 10, 64)
	if err != nil {
		return fmt.Errorf("-created: %w", err)
	}
	want := map[string]bool{}
	for _, n := range strings.Split(*only, ",") {
		if n != "" {
			want[n] = true
		}
	}

	logf := func(format string, args ...any) { fmt.Printf(format+"\n", args...) }
	b := &builder{
		apt:     &apt{cacheDir: filepath.Join(*cache, "debs"), resolvedDir: filepath.Join(*cache, "resolved"), log: logf},
		layers:  &layerCache{dir: filepath.Join(*cache, "layers")},
		binDir:  *binDir,
		created: time.Unix(secs, 0).UTC(),
		version: tagList[0],
		log:     logf,
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	for n := range want {
		if !slices.ContainsFunc(recipes, func(r recipe) bool { return r.name == n }) &&
			!slices.ContainsFunc(toolRecipes, func(r toolRecipe) bool { return r.name == n }) {
			return fmt.Errorf("-images: no image %q", n)
		}
	}
	type job struct {
		b    *builder
		r    recipe
		tags []string
		refs []string // full references besides <repo>/<name>:<tag>
	}
	var jobs []job
	for _, r := range recipes {
		if len(want) == 0 || want[r.name] {
			jobs = append(jobs, job{b, r, tagList, nil})
		}
	}
	for _, r := range toolRecipes {
		if !r.selected(want) {
			continue
		}
		if *toolDir == "" {
			if want[r.name] {
				return fmt.Errorf("-images %s needs -tools", r.name)
			}
			continue
		}
		tb := *b
		tb.binDir = *toolDir
		tb.version = r.tag
		jobs = append(jobs, job{&tb, r.recipe, []string{r.tag}, r.refs})
	}
	for _, j := range jobs {
		b, r := j.b, j.r
		start := time.Now()
		img, err := b.image(r)
		if err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		var refs []string
		for _, t := range j.tags {
			refs = append(refs, *repo+"/"+r.name+":"+t)
		}
		refs = append(refs, j.refs...)
		dir := filepath.Join(*out, r.name)
		wrote, err := writeOCI(dir, index(img, refs))
		if err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		digest, err := img.Digest()
		if err != nil {
			return err
		}
		size, err := imageSize(img)
		if err != nil {
			return err
		}
		state := "up to date"
		if wrote {
			state = "written"
		}
		logf("%s: %s %s, %.1f MiB compressed, %s in %s: %s, %s.tar",
			r.name, digest, strings.Join(refs, " "), float64(size)/(1<<20), state,
			time.Since(start).Round(10*time.Millisecond), dir, dir)
	}
	return nil
}

// selected tells whether a build with -images want (empty: the default
// set) builds r: named, or by default unless it is opt-in.
func (r toolRecipe) selected(want map[string]bool) bool {
	if len(want) == 0 {
		return !r.optIn
	}
	return want[r.name]
}

// imageSize adds up the compressed sizes of the image's layers.
func imageSize(img v1.Image) (int64, error) {
	m, err := img.Manifest()
	if err != nil {
		return 0, err
	}
	var n int64
	for _, l := range m.Layers {
		n += l.Size
	}
	return n, nil
}
