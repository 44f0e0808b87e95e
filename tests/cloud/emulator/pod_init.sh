#!/usr/bin/env bash
# PID 1 of an emulated RunPod pod (pods.py starts it in the pod's own network namespace, under
# `unshare --mount --pid --uts --fork --kill-child`): builds the pod's root and runs the container
# command RunPod would run, SkyPilot's `dockerArgs` (its init script starts sshd, then sleeps).
#
#   pod_init.sh POD_ID IP IMAGE_LAYER UPPER_DIR PY310 API_URL ARGS_FILE [VOLUME_DIR MOUNT_PATH] [-- HIDE...]
#
# The root is an overlay: this machine's / under the baked image layer (which hides /root, /tmp,
# /work, /home, /var/tmp), with a writable upper dir of its own (the container disk). HIDE paths
# (the repo, wherever it lives) get an empty tmpfs. Every mount is in the pod's private mount
# namespace: it goes when the pod's last process does.
set -euo pipefail
id=$1 ip=$2 layer=$3 upper=$4 py310=$5 api=$6 args=$7
shift 7
voldir="" mnt=""
if [ $# -ge 2 ] && [ "$1" != "--" ]; then voldir=$1 mnt=$2; shift 2; fi
[ "${1:-}" != "--" ] || shift
m=$upper/../root
mkdir -p "$upper/data" "$upper/work" "$m"
mount -t overlay overlay -o "lowerdir=$layer:/,upperdir=$upper/data,workdir=$upper/work" "$m"
mount -t proc proc "$m/proc"
mount -t sysfs -o ro sysfs "$m/sys"
mount --rbind /dev "$m/dev"
mount -t tmpfs -o size=2g tmpfs "$m/dev/shm"
mount -t tmpfs tmpfs "$m/run"
mkdir -p "$m$py310"
mount --bind -o ro "$py310" "$m$py310"
for hide in "$@"; do
  [ -d "$m$hide" ] && mount -t tmpfs -o size=1m,mode=755 tmpfs "$m$hide"
done
if [ -n "$voldir" ]; then
  mkdir -p "$m$mnt"
  mount --bind "$voldir" "$m$mnt"
fi
hostname "$id"
echo "$ip $id" >>"$m/etc/hosts"
echo "$api" >"$m/etc/launch-emulator-api"
cmd=$(cat "$args")
mapfile -t container_env <"$upper/../container_env"  # RunPod's container env: RUNPOD_POD_ID, PUBLIC_KEY...
cd "$m"
exec chroot "$m" /usr/bin/env -i HOME=/root TERM=xterm LANG=C.UTF-8 \
  PATH=/root/.local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  RUNPOD_API_BASE_URL="$api" PIP_NO_BUILD_ISOLATION=0 "${container_env[@]}" \
  bash -c "cd / && $cmd"
