#!/usr/bin/env bash
# install-test.sh BIN OUT: what `kubectl krew install` of deploy/krew/loopvol.yaml
# does for a user, done here with the archive a release would publish. It
# packs BIN/kubectl-loopvol as the release's linux/amd64 archive into OUT,
# writes the manifest with that archive's SHA-256 in place of the zeros,
# installs it with krew (BIN/krew, sigs.k8s.io/krew v0.4.3) into a krew root
# of its own (removed at the end) and runs the installed plugin. krew's index
# is never fetched: --manifest and --archive need none (krew uninstall would:
# it refuses to run without an index).
set -euo pipefail
bin=$1 out=$2
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$out"
archive=$out/kubectl-loopvol_linux_amd64.tar.gz
tar -C "$bin" -czf "$archive" kubectl-loopvol
sum=$(sha256sum "$archive" | cut -d' ' -f1)
# Only the first platform's (linux/amd64) sha256 is this archive's.
sed "0,/\"0\{64\}\"/s//\"$sum\"/" deploy/krew/loopvol.yaml >"$out/loopvol.yaml"
grep -q "$sum" "$out/loopvol.yaml" || { echo "install-test: no sha256 to fill in deploy/krew/loopvol.yaml" >&2; exit 1; }
export KREW_ROOT=$root
"$bin/krew" install --manifest="$out/loopvol.yaml" --archive="$archive" </dev/null 2>&1 | grep -v -e '^WARNING: Detected stdin' || true
[ -x "$root/bin/kubectl-loopvol" ] || { echo "install-test: krew did not install the plugin" >&2; exit 1; }
got=$("$root/bin/kubectl-loopvol" --version)
case $got in
"kubectl loopvol version "*) echo "installed with krew: $got" ;;
*) echo "install-test: the installed plugin printed $got" >&2; exit 1 ;;
esac
