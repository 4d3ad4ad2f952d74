#!/usr/bin/env bash
# install-test.sh BIN OUT VERSION: what `kubectl krew install` of the
# released manifest does for a user. hack/krew/release.sh makes the
# release's archive of VERSION for this machine's platform and its manifest
# into OUT; this checks
# the manifest's sha256 is that archive's, installs it with krew (BIN/krew,
# sigs.k8s.io/krew v0.4.3) into a krew root of its own (removed at the end)
# and runs the installed plugin. krew's index is never fetched: --manifest
# and --archive need none (krew uninstall would: it refuses to run without
# an index).
set -euo pipefail
bin=$1 out=$2 version=$3
arch=$(${GO:-go} env GOARCH)
hack/krew/release.sh "$out" "$version" "$arch"
archive=$out/kubectl-loopvol_linux_$arch.tar.gz
sum=$(sha256sum "$archive" | cut -d' ' -f1)
grep -q "sha256: \"$sum\"" "$out/loopvol.yaml" || { echo "install-test: $out/loopvol.yaml lacks the sha256 of $archive" >&2; exit 1; }
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
export KREW_ROOT=$root
"$bin/krew" install --manifest="$out/loopvol.yaml" --archive="$archive" </dev/null 2>&1 | grep -v -e '^WARNING: Detected stdin' || true
[ -x "$root/bin/kubectl-loopvol" ] || { echo "install-test: krew did not install the plugin" >&2; exit 1; }
got=$("$root/bin/kubectl-loopvol" --version)
case $got in
"kubectl loopvol version $version") echo "installed with krew: $got" ;;
*) echo "install-test: the installed plugin printed $got, want kubectl loopvol version $version" >&2; exit 1 ;;
esac
