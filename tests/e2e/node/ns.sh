#!/usr/bin/env bash
# The mount namespace of one real node (run under `unshare --mount --propagation slave`). Bind-mounts the
# node's own directories over the fixed host paths the kubelet, containerd and the shipped DaemonSets use,
# so two nodes share the machine without seeing each other's plugins, CDI specs or device nodes:
#   NODE/kubelet -> /var/lib/kubelet    NODE/cdi -> /var/run/cdi    NODE/pod-logs -> /var/log/pods
#   NODE/host    -> HOST_ROOT_PATH      (the fixture host tree; the driver DaemonSet's host-root volume)
#   NODE/host/dev -> /dev               (the fixture's character devices, plus null/zero/... made by the test)
# Then it holds the namespace open (containerd and the kubelet join it with nsenter) until killed.
set -euo pipefail
node=$1 host_root_path=$2
mount --make-rslave /
mount --bind "$node/kubelet" /var/lib/kubelet
mount --bind "$node/cdi" /run/cdi
mount --bind "$node/pod-logs" /var/log/pods
mount --bind "$node/host" "$host_root_path"
mount --bind "$node/host/dev" /dev
mkdir -p /dev/pts /dev/shm /dev/mqueue
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /dev/pts
ln -sf pts/ptmx /dev/ptmx
mount -t tmpfs -o nosuid,nodev,mode=1777 shm /dev/shm
mount -t mqueue mqueue /dev/mqueue
# As on a real node (systemd makes / shared): the kubelet's mountPropagation HostToContainer (the drivers'
# host-root volume) needs its host path on a shared or slave mount. Shared here stays inside this namespace.
mount --make-rshared /
echo "$$" > "$node/ns.ready"
exec sleep infinity
