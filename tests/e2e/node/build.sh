#!/usr/bin/env bash
# Builds the real node runtime once and caches it by the hash of its inputs, like tests/e2e/build.sh:
#   - kubelet from k8s.io/kubernetes cmd/kubelet, inside a copy of the e2e module (same pinned Kubernetes
#     version and go.sum), with the version ldflags so the Node reports the control plane's version;
#   - containerd, ctr and containerd-shim-runc-v2 from github.com/containerd/containerd/v2 (no cgo).
# The LAST line of stdout is the directory holding the four binaries.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mod="$here/../cluster"
command -v go >/dev/null || { echo "node/build.sh: go not found on PATH" >&2; exit 127; }

CONTAINERD_VERSION=v2.4.2
CONTAINERD_TAGS="no_btrfs no_devmapper no_zfs"
k8s_version="$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' "$mod/go.mod")"
[[ $k8s_version =~ ^v([0-9]+)\.([0-9]+)\. ]] || { echo "node/build.sh: no k8s.io/kubernetes version in $mod/go.mod" >&2; exit 1; }
major="${BASH_REMATCH[1]}" minor="${BASH_REMATCH[2]}"

hash="$( { cat "$mod/go.mod" "$mod/go.sum" "${BASH_SOURCE[0]}"; go env GOVERSION; } | sha256sum | cut -c1-16)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/eks-dra/node"
out="$cache/runtime-$hash"
bins=(kubelet containerd ctr containerd-shim-runc-v2)

if [[ -x "$out/kubelet" && -x "$out/containerd-shim-runc-v2" ]]; then
  echo "node runtime: cached ($out)" >&2
  echo "$out"
  exit 0
fi

mkdir -p "$cache"
export GOTOOLCHAIN=local
start=$(date +%s)
tmp="$(mktemp -d "$cache/.runtime-$hash.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# kubelet: the e2e module's go.mod/go.sum in a scratch module; -mod=mod lets go add the two modules
# cmd/kubelet needs beyond the control plane's set (they come from the Go module proxy).
mkdir "$tmp/mod"
cp "$mod/go.mod" "$mod/go.sum" "$tmp/mod/"
v=k8s.io/component-base/version
(cd "$tmp/mod" && GOFLAGS=-mod=mod go build -buildvcs=false -trimpath \
  -ldflags "-s -w -X $v.gitVersion=$k8s_version -X $v.gitMajor=$major -X $v.gitMinor=$minor -X $v.gitTreeState=clean" \
  -o "$tmp/kubelet" k8s.io/kubernetes/cmd/kubelet)
kubelet_done=$(date +%s)

(cd "$tmp" && CGO_ENABLED=0 GOBIN="$tmp" GOFLAGS=-buildvcs=false go install -trimpath -tags "$CONTAINERD_TAGS" \
  -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION")
rm -rf "$tmp/mod"
for b in "${bins[@]}"; do [[ -x "$tmp/$b" ]] || { echo "node/build.sh: $b was not built" >&2; exit 1; }; done
mv -f "$tmp" "$out"
trap - EXIT
ls -1dt "$cache"/runtime-* 2>/dev/null | tail -n +3 | xargs -r rm -rf
echo "node runtime: built in $(( $(date +%s) - start ))s (kubelet $(( kubelet_done - start ))s; $(du -sh "$out" | cut -f1))"
echo "$out"
