package main

import "embed"

// rootfs holds the files that recipes copy into images as they are.
//
//go:embed rootfs
var rootfs embed.FS

// recipe is what goes into one image. The Dockerfile says the same in its
// stage of the same name; dockerfile_test.go holds the two to each other.
type recipe struct {
	// name is the image's name and the Dockerfile stage that builds it.
	name string
	// from is the image the Dockerfile stage starts from.
	from string
	// packages are the Debian packages the Dockerfile stage installs
	// (apt-get install --no-install-recommends); the Go recipe installs them
	// and everything they depend on.
	packages []string
	// tree is a directory under rootfs/ that both recipes copy to /.
	tree string
	// binaries are the static binaries (bin/static/<src>) and where they go.
	binaries []placement
	// user runs the entrypoint ("" is root).
	user string
	// entrypoint is the image's ENTRYPOINT.
	entrypoint []string
	// cmd is the image's CMD, the arguments a container that sets none
	// gets (nil: none).
	cmd []string
	// base stands in for the Dockerfile's FROM image, for what the packages
	// need of it without saying so.
	base base
}

// placement puts a binary into an image.
type placement struct {
	src string // file name in the binaries directory
	dst string // absolute path in the image
}

// base is what a Go recipe adds itself because the Dockerfile's FROM image
// already has it: Debian's essential packages need not be named in
// Depends, and the files that maintainer scripts (which the Go recipe never
// runs) would create, such as /etc/passwd.
type base struct {
	// packages are installed with their dependencies before the recipe's.
	packages []string
	// tree is a directory under rootfs/ copied to /.
	tree string
	// symlinks are the links (path → target) that the Debian image has and
	// no package ships: debootstrap or maintainer scripts make them.
	symlinks map[string]string
	// env is the image's environment (the FROM image's ENV).
	env []string
}

// debianPath is the PATH of Debian's images.
const debianPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// recipes are the images, in the order they are built.
var recipes = []recipe{
	{
		// The node plugin: the driver runs mount-utils (mount, umount,
		// blkid, fsck, mkfs.ext4, mkfs.xfs, blockdev, resize2fs, xfs_growfs)
		// and e2fsck and resize2fs itself (pkg/node).
		name:       "loopvol-node",
		from:       "debian:bookworm-slim",
		packages:   []string{"util-linux", "mount", "e2fsprogs", "xfsprogs"},
		binaries:   []placement{{src: "driver", dst: "/driver"}},
		entrypoint: []string{"/driver"},
		base: base{
			// base-files: the root's directories and /etc/os-release.
			// dash: /bin/sh, which fsck.xfs (a shell script) needs.
			packages: []string{"base-files", "dash"},
			tree:     "node-base",
			symlinks: map[string]string{
				// debootstrap's; e2fsck and resize2fs refuse to work without it.
				"/etc/mtab": "/proc/mounts",
				// base-files ships a directory; its postinst makes the link.
				"/var/run": "/run",
			},
			env: []string{debianPath},
		},
	},
	{
		// The controller plugin and the sidecar: static binaries only, no
		// shell, not root.
		name: "loopvol-controller",
		from: "scratch",
		tree: "controller",
		binaries: []placement{
			{src: "driver", dst: "/driver"},
			{src: "attacher", dst: "/attacher"},
		},
		user:       "65532:65532",
		entrypoint: []string{"/driver"},
	},
}

// nodeCommands are the programs the node plugin runs (pkg/node and the
// k8s.io/mount-utils calls it makes); the node image must run each.
var nodeCommands = []string{
	"mount", "umount", "blkid", "blockdev", "fsck", "fsck.ext4", "fsck.xfs",
	"mkfs.ext4", "mkfs.xfs", "e2fsck", "resize2fs", "xfs_growfs",
}

// toolRecipe is an image of the one-node cluster that is not loopvol's own
// and has no Dockerfile stage: an upstream or helper binary that
// hack/tools/build.sh builds (into bin/), alone on an empty base. Its tag is
// the binary's version, not loopvol's.
type toolRecipe struct {
	recipe
	// tag is the image's tag in -repo.
	tag string
	// optIn images are built only when -images names them: what only
	// the upstream e2e suite runs (make e2e-k8s-images), so that make
	// cluster-images needs no more binaries than the cluster's.
	optIn bool
	// refs are full references the image is also named by: the names
	// the upstream e2e suite asks containerd for (test/e2e-k8s), which
	// no registry serves here.
	refs []string
}

// toolRecipes are built when -tools names the directory of their binaries
// (the busybox image has none, but is the cluster's too).
var toolRecipes = []toolRecipe{
	{
		// The upstream provisioner of the controller pod
		// (deploy/kubernetes/base/controller.yaml); the tag is the version
		// that hack/tools/csi/go.mod pins and overlays/local names.
		recipe: recipe{
			name:       "csi-provisioner",
			from:       "scratch",
			tree:       "controller",
			binaries:   []placement{{src: "csi-provisioner", dst: "/csi-provisioner"}},
			user:       "65532:65532",
			entrypoint: []string{"/csi-provisioner"},
		},
		tag: "v6.4.0",
	},
	{
		// The upstream attacher that test/cluster's switching scenario
		// puts in place of loopvol's sidecar and back
		// (deploy/kubernetes/components/upstream-attacher); the tag is
		// the version hack/tools/csi/go.mod pins.
		recipe: recipe{
			name:       "csi-attacher",
			from:       "scratch",
			tree:       "controller",
			binaries:   []placement{{src: "csi-attacher", dst: "/csi-attacher"}},
			user:       "65532:65532",
			entrypoint: []string{"/csi-attacher"},
		},
		tag: "v4.13.0",
	},
	{
		// The pods' sandbox image (containerd's sandbox_image, kubelet's
		// --pod-infra-container-image): hack/tools/pause, which sleeps
		// until SIGTERM and reaps children. 65535 as upstream's pause.
		recipe: recipe{
			name:       "pause",
			from:       "scratch",
			binaries:   []placement{{src: "pause", dst: "/pause"}},
			user:       "65535:65535",
			entrypoint: []string{"/pause"},
		},
		tag: "3.10",
	},
	{
		// The tests' and the demo's workload (test/cluster, hack/demo): one
		// static busybox from Debian (sh, sha256sum, dd, sleep, ...), run
		// as /bin/busybox <applet> or by the applet's name. The upstream
		// e2e suite's default test image too: its pods run "sh -c",
		// "ls", "mount" and the like by name (with no command, sh).
		recipe: recipe{
			name:       "busybox",
			from:       "debian:bookworm-slim",
			packages:   []string{"busybox-static"},
			entrypoint: []string{"/bin/busybox"},
			base:       base{env: []string{debianPath}, symlinks: busyboxLinks()},
		},
		tag:  "bookworm",
		refs: []string{e2eRegistry + "/busybox:1.37.0-2"},
	},
	{
		// The upstream e2e suite's other test image
		// (k8s.io/kubernetes/test/images/agnhost, hack/tools/build.sh
		// agnhost): /agnhost with its subcommands, "pause" by default as
		// upstream's; busybox for the shell the suite runs in it. The tag
		// is the VERSION of the agnhost source in hack/tools/go.mod's
		// k8s.io/kubernetes.
		recipe: recipe{
			name:       "agnhost",
			from:       "debian:bookworm-slim",
			packages:   []string{"busybox-static"},
			binaries:   []placement{{src: "agnhost", dst: "/agnhost"}},
			entrypoint: []string{"/agnhost"},
			cmd:        []string{"pause"},
			base:       base{env: []string{debianPath}, symlinks: busyboxLinks()},
		},
		tag:   "2.66.1",
		refs:  []string{e2eRegistry + "/agnhost:2.66.1"},
		optIn: true,
	},
	{
		// The image the e2e suite's "exec" specs run a script in (it
		// names nginx, and uses only its shell): Debian's nginx (1.22,
		// under the tag the suite asks for), as upstream's serving on
		// port 80, with busybox for the shell. passwd and group hold the
		// www-data that nginx-common's maintainer scripts would add.
		recipe: recipe{
			name:       "nginx",
			from:       "debian:bookworm-slim",
			packages:   []string{"nginx", "busybox-static"},
			entrypoint: []string{"nginx", "-g", "daemon off;"},
			base: base{
				packages: []string{"base-files"},
				tree:     "nginx",
				symlinks: busyboxLinks(),
				env:      []string{debianPath},
			},
		},
		tag:   "1.27.0-2",
		refs:  []string{e2eRegistry + "/nginx:1.27.0-2"},
		optIn: true,
	},
	{
		// The image the suite's multiVolume concurrent-access specs run
		// their pods in (glibc-dns-testing), as upstream's a Debian with
		// glibc: their shell commands need GNU dd (oflag=nocache, which
		// busybox's refuses), head, base64 and sha256sum (coreutils),
		// blockdev (util-linux), and getent (libc-bin) is what the image
		// is named after. dash is /bin/sh.
		recipe: recipe{
			name:       "glibc-dns-testing",
			from:       "debian:bookworm-slim",
			packages:   []string{"coreutils", "dash", "util-linux", "grep", "sed", "findutils", "libc-bin"},
			entrypoint: []string{"/bin/sh"},
			base:       base{packages: []string{"base-files"}, env: []string{debianPath}},
		},
		tag:   "2.1.1",
		refs:  []string{e2eRegistry + "/glibc-dns-testing:2.1.1"},
		optIn: true,
	},
	{
		// The volume populator the e2e suite's "provision storage with
		// any volume data source" spec deploys (hack/tools/build.sh
		// hello-populator, lib-volume-populator's example): its controller
		// and, in the same image, the pod that writes the file into the
		// new volume, which is root's (as upstream's image, which runs as
		// root). Named as the suite's manifest asks
		// (testing-manifests/storage-csi/any-volume-datasource); the
		// binary's own version is the module's, in hack/tools/populator.
		recipe: recipe{
			name:       "hello-populator",
			from:       "scratch",
			tree:       "controller",
			binaries:   []placement{{src: "hello-populator", dst: "/hello-populator"}},
			entrypoint: []string{"/hello-populator"},
		},
		tag:   "v1.0.1",
		refs:  []string{sigStorageRegistry + "/hello-populator:v1.0.1"},
		optIn: true,
	},
	{
		// external-snapshotter's sidecar
		// (deploy/kubernetes/components/snapshotter; test/cluster and
		// test/e2e-k8s deploy it); the tag is the version
		// hack/tools/csi/go.mod pins.
		recipe: recipe{
			name:       "csi-snapshotter",
			from:       "scratch",
			tree:       "controller",
			binaries:   []placement{{src: "csi-snapshotter", dst: "/csi-snapshotter"}},
			user:       "65532:65532",
			entrypoint: []string{"/csi-snapshotter"},
		},
		tag: "v8.7.0",
	},
	{
		// external-snapshotter's cluster-wide controller (test/cluster and
		// test/e2e-k8s deploy it: a cluster has one, whatever the
		// drivers).
		recipe: recipe{
			name:       "snapshot-controller",
			from:       "scratch",
			tree:       "controller",
			binaries:   []placement{{src: "snapshot-controller", dst: "/snapshot-controller"}},
			user:       "65532:65532",
			entrypoint: []string{"/snapshot-controller"},
		},
		tag: "v8.7.0",
	},
}

// e2eRegistry is where the upstream e2e suite's test images come from
// (k8s.io/kubernetes/test/utils/image, promoterE2eRegistry).
const e2eRegistry = "registry.k8s.io/e2e-test-images"

// sigStorageRegistry is where the suite's storage manifests take the
// kubernetes-csi images from.
const sigStorageRegistry = "registry.k8s.io/sig-storage"

// busyboxApplets are the commands the busybox images offer by name, as
// links to /bin/busybox (Debian's busybox-static ships the binary only):
// what shell scripts in test pods use, not the system tools (init,
// modprobe, networking daemons). nsenter: the e2e suite's host-exec pods
// (agnhost, hostPID) run commands on the node through it.
var busyboxApplets = []string{
	"[", "[[", "ash", "awk", "base64", "basename", "blockdev", "cat", "chgrp", "chmod", "chown",
	"cmp", "cp", "cut", "date", "dd", "df", "diff", "dirname", "du", "echo", "egrep", "env",
	"expr", "fallocate", "false", "fgrep", "find", "free", "fsfreeze", "fstrim", "grep", "gunzip",
	"gzip", "head", "hexdump", "hostname", "id", "kill", "ln", "losetup", "ls", "md5sum",
	"mkdir", "mkfifo", "mknod", "mktemp", "mount", "mv", "nc", "nproc", "nsenter", "od", "pidof", "printf",
	"ps", "pwd", "readlink", "realpath", "rm", "rmdir", "sed", "seq", "sh", "sha1sum",
	"sha256sum", "sha512sum", "sleep", "sort", "stat", "sync", "tail", "tar", "tee", "test",
	"time", "timeout", "top", "touch", "tr", "true", "truncate", "uname", "umount", "uniq",
	"unlink", "uptime", "usleep", "vi", "watch", "wc", "wget", "which", "whoami", "xargs",
	"yes", "zcat",
}

// busyboxLinks are busyboxApplets as /bin/<applet> → busybox.
func busyboxLinks() map[string]string {
	links := make(map[string]string, len(busyboxApplets))
	for _, a := range busyboxApplets {
		links["/bin/"+a] = "busybox"
	}
	return links
}
