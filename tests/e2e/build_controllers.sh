#!/usr/bin/env bash
# Builds an ML workload controller from its released Go module and caches it by module version.
#   build_controllers.sh jobset   sigs.k8s.io/jobset v0.8.2 (main package: the module root)
#   build_controllers.sh lws      sigs.k8s.io/lws v0.7.0    (main package: ./cmd)
# The versions are those of eks_dra/planner/crds/README.md, whose CRD schemas the planner validates against.
# The LAST line of stdout is the cache directory: `manager` (the binary), `crds/` (the module's CRD YAML) and
# `webhook.yaml` (the module's webhook configurations, as its kustomize base has them).
set -euo pipefail

command -v go >/dev/null || { echo "build_controllers.sh: go not found on PATH" >&2; exit 127; }
case "${1:-}" in
  jobset) module=sigs.k8s.io/jobset version=v0.8.2 main=. crds=config/components/crd/bases webhook=config/components/webhook/manifests.yaml ;;
  lws) module=sigs.k8s.io/lws version=v0.7.0 main=./cmd crds=config/crd/bases webhook=config/webhook/manifests.yaml ;;
  *) echo "build_controllers.sh: usage: build_controllers.sh jobset|lws" >&2; exit 2 ;;
esac

cache="${XDG_CACHE_HOME:-$HOME/.cache}/eks-dra/controllers"
out="$cache/$1-$version"
if [[ -x "$out/manager" ]]; then
  echo "$1 $version: cached ($out)" >&2
  echo "$out"
  exit 0
fi

# The module's own go.mod and go.sum pin every dependency (what `go install $module/...@$version` builds);
# GOTOOLCHAIN=local makes a too-old Go fail instead of downloading a toolchain.
export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=readonly
dir="$(cd / && go mod download -json "$module@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
[[ -d "$dir" ]] || { echo "build_controllers.sh: go mod download $module@$version gave no directory" >&2; exit 1; }
required="$(sed -n 's/^go //p' "$dir/go.mod")"
echo "$1 $version: $module needs go $required; $(go version)" >&2

mkdir -p "$cache"
start=$(date +%s)
work="$(mktemp -d "$cache/.$1-$version.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# The module cache is read-only; build in a writable copy of the module.
cp -r "$dir" "$work/src"
chmod -R u+w "$work/src"
mkdir -p "$work/out/crds"
(cd "$work/src" && go build -buildvcs=false -trimpath -ldflags "-s -w" -o "$work/out/manager" "$main")
cp "$work/src/$crds"/*.yaml "$work/out/crds/"
cp "$work/src/$webhook" "$work/out/webhook.yaml"
rm -rf "$out"
mv "$work/out" "$out"
echo "$1 $version: built in $(( $(date +%s) - start ))s ($(du -h "$out/manager" | cut -f1))"
echo "$out"
