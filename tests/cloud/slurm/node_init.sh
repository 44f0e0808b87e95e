#!/usr/bin/env bash
# PID 1 of a node of the emulated Slurm site (site.sh starts it in the node's own network namespace,
# under `unshare --mount --uts --pid --fork --kill-child`): builds the node's root and starts its daemons.
#
#   node_init.sh NAME ROLE LAYER NODE_DIR SITE_DIR PY310 [-- HIDE...]
#
# The root is an overlay: this machine's / under the baked image layer (tests/cloud/emulator/bake.sh:
# slurm-wlm, munge, sshd, uv's cache; /root, /tmp, /work, /home, /var/tmp hidden), with a writable upper
# dir of the node's own. On top of it, what a cluster's node has:
# - /root: the home every node shares (SITE_DIR/home; NFS on a real cluster; SkyPilot puts each
#   cluster's home under it, sky/provision/slurm/instance.py:723);
# - /shared: a second shared filesystem (SITE_DIR/shared), where runs keep their checkpoints;
# - /tmp: node-local (SkyPilot's runtime venv and uv's cache live there, instance.py:650);
# - /sys/fs/cgroup read-only: slurmd 22.05 loads a cgroup plugin even with proctrack/linuxproc and
#   task/none, and fails without a cgroup filesystem; nothing is written there.
# HIDE paths (the repo, the test's scratch dir) get an empty tmpfs. Every mount is in the node's private
# mount namespace: it goes when the node's last process does (a dead machine: SIGKILL to this PID 1).
set -euo pipefail
name=$1 role=$2 layer=$3 d=$4 site=$5 py310=$6
shift 6
[ "${1:-}" != "--" ] || shift
m=$d/root
mkdir -p "$d/upper" "$d/work" "$m" "$d/tmp" "$d/uvc-upper" "$d/uvc-work"
chmod 1777 "$d/tmp"
mount -t overlay overlay -o "lowerdir=$layer:/,upperdir=$d/upper,workdir=$d/work" "$m"
mount -t proc proc "$m/proc"
mount -t sysfs -o ro sysfs "$m/sys"
if [ -d /sys/fs/cgroup ]; then
  mount --rbind /sys/fs/cgroup "$m/sys/fs/cgroup"
  awk -v r="$m/sys/fs/cgroup" '$2==r || index($2, r"/")==1 {print $2}' /proc/self/mounts |
    while read -r sub; do mount -o remount,bind,ro "$sub"; done
fi
mount --rbind /dev "$m/dev"
mount -t tmpfs -o size=2g tmpfs "$m/dev/shm"
mount -t tmpfs tmpfs "$m/run"
mount --bind "$d/tmp" "$m/tmp"
mkdir -p "$m/shared"
mount --bind "$site/home" "$m/root"
mount --bind "$site/shared" "$m/shared"
mkdir -p "$m$py310"
mount --bind -o ro "$py310" "$m$py310"
# uv's cache, node-local, at the path SkyPilot's SlurmCommandRunner sets (sky/utils/command_runner.py:2121:
# /tmp/uv_cache_$(id -u)): the baked one underneath, so the runtime install resolves offline
mkdir -p "$m/tmp/uv_cache_0"
mount -t overlay overlay -o "lowerdir=$layer/root/.cache/uv,upperdir=$d/uvc-upper,workdir=$d/uvc-work" "$m/tmp/uv_cache_0"
for hide in "$@"; do
  [ -d "$m$hide" ] && mount -t tmpfs -o size=1m,mode=755 tmpfs "$m$hide"
done
# the node's files (slurm.conf, munge key, hosts: site.py wrote them under SITE_DIR/etc)
mkdir -p "$m/etc/slurm" "$m/etc/munge" "$m/usr/local/lib/launch-slurm" "$m/var/spool/slurmd" \
  "$m/var/spool/slurmctld" "$m/var/log/slurm" "$m/var/lib/munge" "$m/var/log/munge" "$m/etc/launch-gpu"
cp "$site/etc/slurm.conf" "$site/etc/cgroup.conf" "$site/etc/gres.conf" "$m/etc/slurm/"
for i in 0 1 2 3 4 5 6 7; do : >"$m/etc/launch-gpu/nvidia$i"; done  # GRES File= (Count= alone: INVAL on 22.05)
cp "$site/etc/hosts" "$m/etc/hosts"
echo "$name" >"$m/etc/hostname"
install -m 400 "$site/etc/munge.key" "$m/etc/munge/munge.key"
cp "$site/etc/sshd_config" "$m/etc/ssh/sshd_config_launch"
cp "$layer/root/.local/bin/uv" "$m/usr/local/lib/launch-slurm/uv"
install -m 755 "$(dirname "$0")/curl-shim" "$m/usr/local/bin/curl"
install -m 755 "$(dirname "$0")/node_role.sh" "$m/usr/local/lib/launch-slurm/role.sh"
ln -sf "$py310/bin/python3.10" "$m/usr/local/bin/python3.10"  # uv venv --python 3.10 (constants.py:347)
hostname "$name"
cd "$m"
exec chroot "$m" /usr/bin/env -i HOME=/root TERM=xterm LANG=C.UTF-8 \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  bash /usr/local/lib/launch-slurm/role.sh "$role"
