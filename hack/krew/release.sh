#!/usr/bin/env bash
# release.sh OUT VERSION [ARCH ...]: what a release of kubectl-loopvol
# publishes for krew, made into OUT: kubectl-loopvol_linux_ARCH.tar.gz for
# each ARCH (default: amd64 arm64, every platform of the manifest; static
# builds with -trimpath, archives with fixed owners, order and times, so the
# same tree gives the same bytes) and loopvol.yaml: deploy/krew/loopvol.yaml
# with VERSION in spec.version and the download URIs, and each built
# platform's sha256 that of its own archive (a platform not built keeps the
# zeros: make test-krew builds only the machine's). The release uploads the
# archives under the tag VERSION and submits loopvol.yaml to krew's index.
set -euo pipefail
out=$1 version=$2
shift 2
arches=("$@")
[ ${#arches[@]} -gt 0 ] || arches=(amd64 arm64)
[[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "release: VERSION $version is not vMAJOR.MINOR.PATCH (krew's spec.version)" >&2; exit 1; }
src=deploy/krew/loopvol.yaml
old=$(sed -n 's/^  version: //p' "$src")
[ -n "$old" ] || { echo "release: no spec.version in $src" >&2; exit 1; }
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sums=""
for arch in "${arches[@]}"; do
	grep -q "^ *arch: $arch\$" "$src" || { echo "release: $src has no platform for linux/$arch" >&2; exit 1; }
	mkdir -p "$work/$arch"
	CGO_ENABLED=0 GOOS=linux GOARCH=$arch ${GO:-go} build -trimpath -ldflags "-X main.version=$version -s -w" \
		-o "$work/$arch/kubectl-loopvol" ./cmd/kubectl-loopvol
	archive=$out/kubectl-loopvol_linux_$arch.tar.gz
	tar -C "$work/$arch" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - kubectl-loopvol | gzip -n -9 >"$archive"
	sum=$(sha256sum "$archive" | cut -d' ' -f1)
	sums+="$arch=$sum "
	echo "release: $archive $sum"
done
# Each platform's sha256 is the one after its arch: selector, whatever the
# order of the platforms in the source.
awk -v old="$old" -v new="$version" -v sums="$sums" '
	BEGIN { n = split(sums, kv, " "); for (i = 1; i <= n; i++) { split(kv[i], p, "="); sum[p[1]] = p[2] }; want = n }
	{ gsub("/download/" old "/", "/download/" new "/") }
	/^  version: / { $0 = "  version: " new }
	/^ +arch: / { arch = $2 }
	/^ +sha256: / && (arch in sum) { sub(/sha256: .*/, "sha256: \"" sum[arch] "\""); filled++ }
	{ print }
	END { if (filled != want) { print "release: filled " filled " sha256 fields, want " want > "/dev/stderr"; exit 1 } }
' "$src" >"$out/loopvol.yaml"
echo "release: $out/loopvol.yaml"
