#!/usr/bin/env bash
# Builds the real-node tier's images without a registry and caches each as an OCI archive, keyed by the hash
# of its inputs (skipped when unchanged):
#   pause   - a static pause() loop (gcc -static), the CRI sandbox image;
#   busybox - Debian's static busybox, the sample pods' workload image;
#   base    - Debian bookworm minbase + python3 (mmdebstrap from Debian packages): the driver image's base,
#             standing in for python:3.11-slim-bookworm, which no registry serves here;
#   driver  - the project's own Dockerfile, built by buildah with PYTHON_IMAGE=<base>.
# The LAST line of stdout is a JSON object: image name -> {"ref", "archive", "bytes"}.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/eks-dra/node/images"
mkdir -p "$cache"
for tool in buildah mmdebstrap gcc; do
  command -v "$tool" >/dev/null || { echo "node/images.sh: $tool not found (run tests/e2e/node/setup.sh as root)" >&2; exit 127; }
done
store="$cache/storage"
bah() { buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs "$@"; }
busybox="$(dpkg -L busybox-static | grep '/bin/busybox$' | head -1)"
digest() { sha256sum | cut -c1-16; }

# archive NAME KEY BUILD_FN: runs BUILD_FN REF TAR unless the archive of that key exists.
archive() {
  local name=$1 key=$2 fn=$3
  local ref="localhost/eks-dra-e2e/$name:$key" tar="$cache/$name-$key.tar"
  if [[ ! -s $tar ]]; then
    local start; start=$(date +%s)
    "$fn" "$ref" "$tar.tmp"
    mv -f "$tar.tmp" "$tar"
    ls -1t "$cache/$name"-*.tar | tail -n +3 | xargs -r rm -f
    echo "image $name: built in $(( $(date +%s) - start ))s" >&2
  else
    echo "image $name: cached ($tar)" >&2
  fi
  printf '%s\t%s\t%s\n' "$name" "$ref" "$tar" >> "$cache/.list.$$"
}

from_rootfs() {  # REF TAR ROOTFS CMD_JSON: a single-layer image of a directory
  local c; c=$(bah from scratch)
  bah copy -q "$c" "$3" / >/dev/null
  bah config --cmd "$4" "$c"
  bah commit -q --rm "$c" "$1" >/dev/null
  bah push -q "$1" "oci-archive:$2:$1"
  bah rmi -f "$1" >/dev/null  # the archive is the cache; buildah's vfs store would only grow
}

build_pause() {
  local d; d=$(mktemp -d); mkdir -p "$d/rootfs"
  gcc -static -Os -s -o "$d/rootfs/pause" "$here/pause.c"
  from_rootfs "$1" "$2" "$d/rootfs" '["/pause"]'
  rm -rf "$d"
}

build_busybox() {
  local d; d=$(mktemp -d); mkdir -p "$d/rootfs/bin" "$d/rootfs/tmp"
  cp "$busybox" "$d/rootfs/bin/busybox"
  for applet in $("$busybox" --list); do [[ $applet == busybox ]] || ln -s busybox "$d/rootfs/bin/$applet"; done
  from_rootfs "$1" "$2" "$d/rootfs" '["/bin/sh"]'
  rm -rf "$d"
}

BASE_PACKAGES="python3,python3-venv,python-is-python3,ca-certificates"
build_base() {
  local d; d=$(mktemp -d)
  mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/usr/share/doc/* "$1"/usr/share/man/*' \
    bookworm "$d/rootfs.tar" >/dev/null
  local c; c=$(bah from scratch)
  bah add -q "$c" "$d/rootfs.tar" / >/dev/null
  bah config --cmd '["python3"]' --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$c"
  bah commit -q --rm "$c" "$1" >/dev/null
  bah push -q "$1" "oci-archive:$2:$1"
  rm -rf "$d"
  # Keep only this base in buildah's store (the driver builds FROM it).
  bah images --format '{{.Name}}:{{.Tag}}' | grep '/base:' | grep -vxF "$1" | xargs -r buildah --root "$store/root" \
    --runroot "$store/run" --storage-driver vfs rmi -f >/dev/null || true
}

base_ref=""
build_driver() {
  # The base must be in buildah's store (it is after build_base; re-pulled from its archive otherwise).
  bah inspect "$base_ref" >/dev/null 2>&1 || bah pull -q "oci-archive:$base_tar" >/dev/null
  bah tag "$(bah images -q --filter reference="$base_ref" | head -1)" "$base_ref" 2>/dev/null || true
  # The build's RUN steps trust what this machine trusts (its TLS-intercepting proxy's CA for PyPI); the
  # bundle is mounted for the build only, never copied into the image.
  local ca=/etc/ssl/certs/ca-certificates.crt
  (cd "$repo" && bah bud -q --isolation chroot --pull-never --layers=false -v "$ca:$ca:ro" \
     --build-arg "PYTHON_IMAGE=$base_ref" -t "$1" -f Dockerfile . >/dev/null)
  bah push -q "$1" "oci-archive:$2:$1"
  bah rmi -f "$1" >/dev/null
}

rm -f "$cache/.list.$$"
# Keys: each image's own build function (declare -f) and inputs, so editing one does not rebuild the others.
archive pause "$( { declare -f build_pause from_rootfs; cat "$here/pause.c"; gcc -dumpversion; } | digest)" build_pause
archive busybox "$( { declare -f build_busybox from_rootfs; cat "$busybox"; } | digest)" build_busybox
base_key="$( { declare -f build_base; echo "bookworm $BASE_PACKAGES"; } | digest)"
archive base "$base_key" build_base
base_ref="localhost/eks-dra-e2e/base:$base_key" base_tar="$cache/base-$base_key.tar"
driver_key="$( { declare -f build_driver; echo "$base_key"; cd "$repo" && git ls-files -co --exclude-standard -- Dockerfile .dockerignore requirements.lock pyproject.toml README.md eks_dra | grep -v -e __pycache__ -e '\.pyc$' | LC_ALL=C sort | xargs cat; } | digest)"
archive driver "$driver_key" build_driver

python3 - "$cache/.list.$$" <<'PY'
import json, os, sys
images = {}
for line in open(sys.argv[1]):
    name, ref, tar = line.rstrip("\n").split("\t")
    images[name] = {"ref": ref, "archive": tar, "bytes": os.path.getsize(tar)}
print(json.dumps(images))
PY
rm -f "$cache/.list.$$"
