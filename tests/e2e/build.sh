#!/usr/bin/env bash
# Builds the e2e-cluster binary (real Kubernetes 1.34 control plane + kubelet
# stand-in) once and caches it by the hash of its sources. The LAST line of stdout
# is the binary's path.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$here/cluster"
command -v go >/dev/null || { echo "build.sh: go not found on PATH" >&2; exit 127; }

hash="$(cd "$src" && LC_ALL=C ls go.mod go.sum *.go | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/eks-dra/e2e"
bin="$cache/e2e-cluster-$hash"

if [[ -x "$bin" ]]; then
  echo "e2e-cluster: cached ($bin)" >&2
  echo "$bin"
  exit 0
fi

mkdir -p "$cache"
# The module pins its Go and all dependency versions; go.sum is committed.
export GOTOOLCHAIN=local
start=$(date +%s)
tmp="$(mktemp "$cache/.e2e-cluster-$hash.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
(cd "$src" && go build -buildvcs=false -trimpath -ldflags "-s -w" -o "$tmp" .)
mv -f "$tmp" "$bin"
trap - EXIT
# Keep the three newest builds (other checkouts may pin other sources).
ls -1t "$cache"/e2e-cluster-* 2>/dev/null | tail -n +4 | xargs -r rm -f
echo "e2e-cluster: built in $(( $(date +%s) - start ))s ($(du -h "$bin" | cut -f1))"
echo "$bin"
