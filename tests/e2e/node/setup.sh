#!/usr/bin/env bash
# Installs the Debian packages the real-node tier needs (as root): runc (containerd's runtime), the CNI
# loopback plugin, static busybox for the workload image, buildah (the image builder), mmdebstrap (the
# driver image's base, from Debian packages) and gcc (the static pause binary). Prints one line, the
# reason, and exits 3 where it cannot install them (not root, no apt); the caller turns that into a skip.
set -euo pipefail
pkgs=(runc containernetworking-plugins busybox-static buildah mmdebstrap gcc libc6-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
command -v apt-get >/dev/null || { echo "real-node setup: no apt-get here to install ${missing[*]}"; exit 3; }
[[ $(id -u) -eq 0 ]] || { echo "real-node setup: must run as root to apt-get install ${missing[*]}"; exit 3; }
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >/dev/null 2>&1; then
  echo "real-node setup: apt-get install ${missing[*]} failed (no Debian mirror reachable?)"
  exit 3
fi
