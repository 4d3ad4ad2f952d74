#!/usr/bin/env bash
# Builds the real Kubernetes binaries that loopvol's tests run (by default
# kube-apiserver and etcd, for envtest) and those of the one-node cluster
# (internal/harness/cluster) from the versions pinned in the go.mod files here:
# go.mod (Kubernetes, e2e.test, agnhost, ginkgo), etcd/, containerd/,
# runc/, provisioner/, attacher/, snapshotter/, populator/ and pause/.
#
# Usage: hack/tools/build.sh [BIN_DIR] [NAME...]
#   BIN_DIR  where the binaries go (default: <repo root>/bin)
#   NAME     kube-apiserver, etcd, any k8s.io/kubernetes/cmd/<NAME>
#            (kubelet, kubectl, kube-scheduler, kube-controller-manager, ...),
#            containerd, containerd-shim-runc-v2, ctr, runc, csi-provisioner,
#            csi-attacher, csi-snapshotter, snapshot-controller, pause,
#            e2e.test (the upstream Kubernetes e2e suite, `go test -c
#            k8s.io/kubernetes/test/e2e`), ginkgo (the runner that runs it
#            in parallel), agnhost (its test image's binary),
#            hello-populator (the volume populator one of its specs
#            deploys), "cluster"
#            for everything the one-node cluster and its tests run, or
#            "e2e-k8s" for what the upstream storage e2e suite adds to it
#            (test/e2e-k8s)
#            default: kube-apiserver etcd
#
# A cold build takes 10-15 minutes on 2 cores, so finished binaries are kept
# in a cache folder named after the versions, outside the repository, and a
# later run (another clone, a `git clean`) only links them into BIN_DIR.
# Every file is written under a temporary name and renamed into place, so an
# interrupted run never leaves a half-written binary behind.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd "$here/../.." && pwd)

bin_dir=${1:-$repo_root/bin}
if (($# > 0)); then shift; fi
names=()
for name in "$@"; do
	if [[ $name == cluster ]]; then
		names+=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl
			containerd containerd-shim-runc-v2 ctr runc csi-provisioner csi-attacher
			csi-snapshotter snapshot-controller pause kube-proxy)
	elif [[ $name == e2e-k8s ]]; then
		names+=(e2e.test ginkgo agnhost hello-populator)
	else
		names+=("$name")
	fi
done
if ((${#names[@]} == 0)); then
	names=(kube-apiserver etcd)
fi

log() { printf 'hack/tools: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

command -v go >/dev/null || die "go is not on PATH"

# mod_version FILE MODULE prints the version FILE's go.mod requires MODULE at.
mod_version() {
	awk -v m="$2" '{ for (i = 1; i < NF; i++) if ($i == m && $(i + 1) ~ /^v[0-9]/) { print $(i + 1); exit } }' "$1"
}

kube_version=$(mod_version "$here/go.mod" k8s.io/kubernetes)
etcd_version=$(mod_version "$here/etcd/go.mod" go.etcd.io/etcd/server/v3)
[[ -n $kube_version ]] || die "no k8s.io/kubernetes version in $here/go.mod"
[[ -n $etcd_version ]] || die "no go.etcd.io/etcd/server/v3 version in $here/etcd/go.mod"
# The others are read only when they are asked for (describe).

# Without these the Kubernetes binaries report v0.0.0, and clients that
# negotiate by server version (and our own checks below) would be misled.
kube_minor=${kube_version#v*.}
kube_minor=${kube_minor%%.*}
kube_major=${kube_version#v}
kube_major=${kube_major%%.*}
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	kube_ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=$kube_major -X $pkg.gitMinor=$kube_minor -X $pkg.gitTreeState=clean"
done

# mod_hash DIR prints a short hash of DIR's go.mod and go.sum: a cache
# folder named after it changes with any pin, not only the tool's own
# version (hack/alignmods raises the shared libraries' pins).
mod_hash() {
	cat "$1/go.mod" "$1/go.sum" | sha256sum | cut -c1-12
}

# One cache folder per pinned set: Kubernetes and etcd (the envtest pair)
# share one, the cluster's other tools have one each (describe).
cache_root=${XDG_CACHE_HOME:-$HOME/.cache}/loopvol/tools
kube_cache=$cache_root/k8s-$kube_version-etcd-$etcd_version-$(mod_hash "$here")
mkdir -p "$cache_root" "$bin_dir"
bin_dir=$(cd "$bin_dir" && pwd)

# Temporary files this run created; removed however the script ends.
temps=()
cleanup() {
	local f
	for f in "${temps[@]+"${temps[@]}"}"; do
		rm -rf -- "$f"
	done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Two runs at once (two clones, make -j) would both spend 10 minutes on the
# same build; the second waits for the first and then finds the cache filled.
if command -v flock >/dev/null; then
	exec 9>"$cache_root/.lock"
	if ! flock -n 9; then
		log "waiting for another build.sh using $cache_root..."
		flock 9
	fi
fi

# describe NAME sets mod_dir, pkg, version, ldflags, tags, cgo, vflag,
# gocmd, cache_dir and eta for NAME.
describe() {
	tags=""
	gocmd=build
	cgo=0
	vflag=--version
	cache_dir=$kube_cache
	case $1 in
	etcd)
		mod_dir=$here/etcd
		pkg=go.etcd.io/etcd/server/v3
		version=$etcd_version
		ldflags="-s -w"
		eta="~1-3 minutes"
		;;
	kube-* | kubelet | kubectl | kubeadm | kubemark)
		mod_dir=$here
		pkg=k8s.io/kubernetes/cmd/$1
		version=$kube_version
		ldflags=$kube_ldflags
		eta="~15-20 minutes for all of them"
		[[ $1 == kubectl ]] && vflag="version --client"
		;;
	containerd | containerd-shim-runc-v2 | ctr)
		mod_dir=$here/containerd
		local m=github.com/containerd/containerd/v2
		pkg=$m/cmd/$1
		version=$(mod_version "$mod_dir/go.mod" $m)
		ldflags="-s -w -X $m/version.Version=$version -X $m/version.Package=$m"
		# The snapshotters that need kernel modules or libraries this
		# machine lacks; overlayfs and native stay.
		tags="no_btrfs no_devmapper"
		[[ $1 == containerd-shim-runc-v2 ]] && vflag=-v
		cache_dir=$cache_root/containerd-$version
		eta="~2 minutes"
		;;
	runc)
		mod_dir=$here/runc
		pkg=github.com/opencontainers/runc
		version=$(mod_version "$mod_dir/go.mod" $pkg)
		ldflags="-s -w"
		# seccomp needs cgo and libseccomp-dev (Debian); runc reads its
		# version from its embedded VERSION file.
		tags="seccomp urfave_cli_no_docs"
		cgo=1
		if [[ ! -x $cache_root/runc-$version/runc ]] && ! pkg-config --exists libseccomp 2>/dev/null; then
			die "runc needs libseccomp's headers and pkg-config: apt-get install libseccomp-dev pkg-config"
		fi
		cache_dir=$cache_root/runc-$version
		eta="~1-2 minutes"
		;;
	csi-provisioner | csi-attacher | csi-snapshotter | snapshot-controller)
		# The kubernetes-csi sidecars, one module (csi/tools.go says
		# why): csi-provisioner beside loopvol's controller, csi-attacher
		# (the real-cluster tests switch loopvol's sidecar to it and
		# back), external-snapshotter's sidecar and cluster-wide
		# controller (the e2e suite's snapshot specs). One cache folder
		# for the four, named after the module's pins: a bump of any of
		# them rebuilds all, since they share their libraries.
		mod_dir=$here/csi
		local m
		case $1 in
		csi-provisioner) m=github.com/kubernetes-csi/external-provisioner/v6 ;;
		csi-attacher) m=github.com/kubernetes-csi/external-attacher/v4 ;;
		*) m=github.com/kubernetes-csi/external-snapshotter/v8 ;;
		esac
		pkg=$m/cmd/$1
		version=$(mod_version "$mod_dir/go.mod" $m)
		ldflags="-s -w -X main.version=$version"
		cache_dir=$cache_root/csi-$(mod_hash "$mod_dir")
		eta="~5 minutes for the four"
		;;
	e2e.test)
		# The upstream e2e suite is a test binary: `go test -c` of the
		# package, with the version ldflags of the other Kubernetes
		# binaries (the suite logs and checks them). e2e.go pins the
		# test files' imports.
		mod_dir=$here
		pkg=k8s.io/kubernetes/test/e2e
		version=$kube_version
		ldflags=$kube_ldflags
		# -vet=off: go test would vet the suite's packages first, for nothing.
		gocmd="test -c -vet=off"
		eta="~10 minutes"
		;;
	ginkgo)
		# The ginkgo CLI runs e2e.test in parallel processes (--procs),
		# at the version e2e.test is built with.
		mod_dir=$here
		pkg=github.com/onsi/ginkgo/v2/ginkgo
		version=$(mod_version "$here/go.mod" github.com/onsi/ginkgo/v2)
		ldflags="-s -w"
		vflag=version
		cache_dir=$cache_root/ginkgo-$version-$(mod_hash "$mod_dir")
		eta="~1 minute"
		;;
	agnhost)
		# The suite's do-everything test image (hack/images wraps it);
		# its version is the image tag the suite asks for, from the
		# VERSION file beside its source.
		mod_dir=$here
		pkg=k8s.io/kubernetes/test/images/agnhost
		# go mod download prints the module's folder, fetching it first
		# on a cold module cache (go list -m would print none: build.sh
		# describes every tool before it builds the first).
		local kdir
		kdir=$(cd "$here" && GOWORK=off go mod download -json k8s.io/kubernetes | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
		[[ -n $kdir && -r $kdir/test/images/agnhost/VERSION ]] ||
			die "agnhost: no test/images/agnhost/VERSION in k8s.io/kubernetes's module folder '$kdir'"
		version=$(<"$kdir/test/images/agnhost/VERSION")
		version=v${version#v}
		ldflags="-s -w -X main.Version=${version#v}"
		cache_dir=$cache_root/agnhost-$version-$(mod_hash "$mod_dir")
		eta="~2-4 minutes"
		;;
	hello-populator)
		# The volume populator the suite's "any volume data source" spec
		# deploys (kubernetes-csi/lib-volume-populator's example); its
		# image is named as the suite asks (hack/images).
		mod_dir=$here/populator
		local m=github.com/kubernetes-csi/lib-volume-populator
		pkg=$m/example/hello-populator
		version=$(mod_version "$mod_dir/go.mod" $m)
		ldflags="-s -w -X main.version=$version"
		cache_dir=$cache_root/hello-populator-$version
		eta="~1 minute"
		;;
	pause)
		mod_dir=$here
		pkg=./pause
		# Our own source: the cache is keyed by its content.
		version=$(cat "$here/pause/"*.go | sha256sum | cut -c1-12)
		ldflags="-s -w -X main.version=$version"
		vflag=-v
		cache_dir=$cache_root/pause-$version
		eta="seconds"
		;;
	*)
		die "unknown tool '$1' (want etcd, a k8s.io/kubernetes/cmd name, containerd, containerd-shim-runc-v2, ctr, runc, csi-provisioner, csi-attacher, csi-snapshotter, snapshot-controller, e2e.test, ginkgo, agnhost, hello-populator, pause, cluster or e2e-k8s)"
		;;
	esac
	[[ -n $version ]] || die "no version of $1 in $mod_dir/go.mod"
	mkdir -p "$cache_dir"
}

# has_version NAME FILE VERSION succeeds when FILE runs and reports VERSION.
has_version() {
	local out want=${3#v}
	# shellcheck disable=SC2086 # vflag may be two words
	out=$("$2" $vflag 2>&1) || return 1
	grep -Eq "(^|[^0-9.])v?${want//./\\.}([^0-9.]|$)" <<<"$out"
}

# put SRC DST places SRC at DST atomically, hard-linked when the file
# systems allow it (no second 100 MB copy), copied otherwise.
put() {
	local tmp
	tmp=$(dirname "$2")/.$(basename "$2").tmp.$$
	temps+=("$tmp")
	rm -f -- "$tmp"
	ln -f -- "$1" "$tmp" 2>/dev/null || cp -f -- "$1" "$tmp"
	mv -f -- "$tmp" "$2"
}

# A build group is every binary still to build whose go command, module,
# tags and cgo setting are the same: one `go build` builds the group, so
# the libraries they share (most of Kubernetes for kube-apiserver, kubelet
# and the others; client-go and gRPC for the sidecars) are compiled once
# and the linker of one binary runs while the next is compiled. Each
# binary keeps its own -ldflags through go build's per-package pattern
# form (-ldflags=PKG=FLAGS).
declare -A group_of=() # name -> group key
declare -a groups=()   # group keys, in the order first asked for
declare -A group_names=()

# queue NAME adds NAME (already described) to its build group.
queue() {
	local key="$mod_dir|$gocmd|$tags|$cgo"
	if [[ -z ${group_names[$key]+x} ]]; then
		groups+=("$key")
		group_names[$key]=""
	fi
	group_names[$key]+=" $1"
	group_of[$1]=$key
}

# bin_name PKG prints the name go build -o DIR/ gives PKG's binary: its
# last path element, or the one before a major version suffix
# (go.etcd.io/etcd/server/v3 is "server").
bin_name() {
	local b=${1##*/}
	if [[ $b =~ ^v[0-9]+$ ]]; then
		b=${1%/*}
		b=${b##*/}
	fi
	printf '%s\n' "$b"
}

# build_group KEY builds every binary of the group KEY into its cache
# folder, each checked to report its version before it is renamed into
# place.
build_group() {
	local key=$1 name tmpdir start list=() args=() pkgs=()
	read -r -a list <<<"${group_names[$key]}"
	describe "${list[0]}"
	local dir=$mod_dir cmd=$gocmd gtags=$tags gcgo=$cgo geta=$eta what=""
	for name in "${list[@]}"; do
		describe "$name"
		pkgs+=("$pkg")
		args+=("-ldflags=$pkg=$ldflags")
		what+=" $name $version,"
	done
	tmpdir=$(mktemp -d "$cache_root/.build.XXXXXX")
	temps+=("$tmpdir")
	log "building${what%,} (a first build takes $geta)..."
	start=$SECONDS
	if [[ $cmd == build ]]; then
		# -o DIR/ names each binary after its package (bin_name).
		(
			cd "$dir"
			GOWORK=off CGO_ENABLED=$gcgo GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod" \
				go build -trimpath -tags "$gtags" "${args[@]}" -o "$tmpdir/" "${pkgs[@]}"
		)
	else
		# go test -c builds one test binary at a time.
		# shellcheck disable=SC2086 # cmd is "test -c -vet=off"
		(
			cd "$dir"
			GOWORK=off CGO_ENABLED=$gcgo GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod" \
				go $cmd -trimpath -tags "$gtags" -ldflags "$ldflags" -o "$tmpdir/${list[0]}" "${pkgs[0]}"
		)
	fi
	for name in "${list[@]}"; do
		describe "$name"
		local out=$tmpdir/$name
		[[ $cmd == build ]] && out=$tmpdir/$(bin_name "$pkg")
		has_version "$name" "$out" "$version" ||
			die "the freshly built $name does not report version $version"
		mv -f -- "$out" "$cache_dir/$name"
	done
	rm -rf -- "$tmpdir"
	log "built ${list[*]} in $((SECONDS - start))s"
}

log "cache: $cache_root"
for name in "${names[@]}"; do
	describe "$name"
	[[ -z ${group_of[$name]+x} ]] || continue
	cached=$cache_dir/$name
	dst=$bin_dir/$name
	if [[ ! -x $cached ]]; then
		if [[ -x $dst ]] && has_version "$name" "$dst" "$version"; then
			log "keeping the existing $dst ($version) and caching it"
			put "$dst" "$cached"
		elif [[ $gocmd == build ]]; then
			queue "$name"
		else
			# A test binary is a group of its own.
			local_key="$mod_dir|$gocmd|$name"
			groups+=("$local_key")
			group_names[$local_key]=" $name"
			group_of[$name]=$local_key
		fi
	fi
done

# The groups build one after another: each already keeps both cores busy.
for key in "${groups[@]+"${groups[@]}"}"; do
	build_group "$key"
done

for name in "${names[@]}"; do
	describe "$name"
	cached=$cache_dir/$name
	dst=$bin_dir/$name
	if [[ -e $dst && ($dst -ef $cached) ]] || { [[ -e $dst ]] && cmp -s -- "$cached" "$dst"; }; then
		log "$dst is up to date ($version)"
	else
		put "$cached" "$dst"
		log "$dst <- $cached ($version)"
	fi
done
