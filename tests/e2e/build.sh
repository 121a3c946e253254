#!/usr/bin/env bash
# Builds the e2e-cluster binary (real Kubernetes control plane + kubelet stand-in)
# once and caches it by the hash of its sources. The LAST line of stdout is the
# binary's path.
#   build.sh        Kubernetes 1.34 (cluster/go.mod, the default tier)
#   build.sh 1.36   Kubernetes 1.36 (the same sources against cluster/go-1.36.mod)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$here/cluster"
command -v go >/dev/null || { echo "build.sh: go not found on PATH" >&2; exit 127; }

version="${1:-1.34}"
if [[ "$version" == "1.34" ]]; then
  modfile=go.mod prefix="e2e-cluster-" keep="e2e-cluster-????????????????" tags=""
elif [[ -f "$src/go-$version.mod" ]]; then
  # compat_<version>.go holds the version's signatures of the kubelet internals (build tag k8s<major><minor>).
  modfile="go-$version.mod" prefix="e2e-cluster-$version-" keep="e2e-cluster-$version-*" tags="k8s${version//./}"
else
  echo "build.sh: no tests/e2e/cluster/go-$version.mod; versions: 1.34 $(cd "$src" && ls go-*.mod 2>/dev/null | sed 's/^go-//; s/\.mod$//' | tr '\n' ' ')" >&2
  exit 2
fi
sumfile="${modfile%.mod}.sum"

hash="$(cd "$src" && LC_ALL=C ls "$modfile" "$sumfile" *.go | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/eks-dra/e2e"
bin="$cache/$prefix$hash"

if [[ -x "$bin" ]]; then
  echo "e2e-cluster $version: cached ($bin)" >&2
  echo "$bin"
  exit 0
fi

mkdir -p "$cache"
# The module pins its Go and all dependency versions; go.sum is committed.
export GOTOOLCHAIN=local
start=$(date +%s)
tmp="$(mktemp "$cache/.$prefix$hash.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
(cd "$src" && go build -modfile="$modfile" -tags="$tags" -buildvcs=false -trimpath -ldflags "-s -w" -o "$tmp" .)
mv -f "$tmp" "$bin"
trap - EXIT
# Keep the three newest builds of this version (other checkouts may pin other sources).
ls -1t "$cache"/$keep 2>/dev/null | tail -n +4 | xargs -r rm -f
echo "e2e-cluster $version: built in $(( $(date +%s) - start ))s ($(du -h "$bin" | cut -f1))"
echo "$bin"
