#!/usr/bin/env bash
# Builds tests/nvidia_ctk (NVIDIA's pkg/nvcdi driven by go-nvml's mock NVML) once and caches it by the
# hash of its sources under ~/.cache/eks-dra/nvidia-ctk/. The LAST line of stdout is the binary's path.
# cgo is required (go-nvml's bindings); gcc comes with the machine's build-essential.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v go >/dev/null || { echo "build.sh: go not found on PATH" >&2; exit 127; }

hash="$(cd "$here" && LC_ALL=C ls go.mod go.sum *.go | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/eks-dra/nvidia-ctk"
bin="$cache/nvcdi-fixture-$hash"

if [[ -x "$bin" ]]; then
  echo "nvcdi-fixture: cached ($bin)" >&2
  echo "$bin"
  exit 0
fi

mkdir -p "$cache"
export GOTOOLCHAIN=local CGO_ENABLED=1 CGO_CFLAGS="-O2 -Wno-deprecated-declarations"
start=$(date +%s)
tmp="$(mktemp "$cache/.nvcdi-fixture-$hash.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
(cd "$here" && go build -buildvcs=false -trimpath -ldflags "-s -w" -o "$tmp" .)
mv -f "$tmp" "$bin"
trap - EXIT
ls -1t "$cache"/nvcdi-fixture-* 2>/dev/null | tail -n +4 | xargs -r rm -f
echo "nvcdi-fixture: built in $(( $(date +%s) - start ))s ($(du -h "$bin" | cut -f1))"
echo "$bin"
