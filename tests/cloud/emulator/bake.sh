#!/usr/bin/env bash
# Bakes the emulated RunPod's pod image: one ext4 file holding an overlay layer that every pod puts
# over this machine's root (pods.py). Done once per key (image.py: this script, the dev lock, the
# SkyPilot wheel, the catalog); the only step that needs the package index.
#
#   unshare -m --propagation private bash bake.sh IMAGE.ext4     (as root; image.py runs it)
#
# Inputs (env): REPO (requirements/dev.lock), PY310 (a Python 3.10 install dir, bind-mounted read-only
# into pods: SkyPilot's runtime venv on the pod is Python 3.10), SKY_WHEEL (the wheel SkyPilot builds
# of itself on the client and installs on every pod), UV (uv binary), HOOK (hook/ dir), CATALOG (the
# emulated cloud's ~/.sky/catalogs/v8), TORCH_FLAGS (uv flags that find the CPU torch wheel),
# HOST_UV_CACHE (the host's uv cache, read for the payload environment).
#
# What the layer holds, on top of this machine's root:
# - /root, /tmp, /work, /home, /var/tmp as empty opaque directories: a pod never sees the host's.
# - openssh-server, rsync (SkyPilot's RunPod init script apt-installs them; pods have no network);
#   slurm-wlm and munge for the emulated Slurm site (tests/cloud/slurm/: its nodes run this layer too).
# - ~/skypilot-runtime (SkyPilot's remote venv, skipped by SkyPilot when it exists) with every
#   dependency of the SkyPilot wheel, and uv's cache, so the on-pod `uv pip install wheel[runpod,remote]`
#   (sky/skylet/constants.py:484) resolves offline (/etc/uv/uv.toml: offline = true).
# - the redirect hook (hook/launch_emulator_hook.py) as a .pth file of that venv.
# - SkyPilot's catalogs (~/.sky/catalogs/v8: downloaded when missing, sky/catalog/common.py:246).
# - /opt/launch-payload-env: the payload's CPU environment (requirements/dev.lock: CPU torch, the same
#   transformers/peft/trl as the tests), which the scenarios name as their one environment override.
set -euo pipefail
out=$1
: "${REPO:?}" "${PY310:?}" "${SKY_WHEEL:?}" "${UV:?}" "${HOOK:?}" "${CATALOG:?}" "${HOST_UV_CACHE:?}"
work=$(mktemp -d /var/tmp/launch-bake.XXXXXX)
trap 'umount -R "$work/root" 2>/dev/null || true; umount "$work/fs" 2>/dev/null || true; rm -rf "$work"' EXIT
rm -f "$out.part"
truncate -s 40G "$out.part"
mkfs.ext4 -q -F -E lazy_itable_init=1 "$out.part"
mkdir -p "$work/fs" "$work/root"
mount -o loop "$out.part" "$work/fs"
img=$work/fs/image
mkdir -p "$img" "$work/fs/bakework"
for d in root tmp work home var/tmp; do
  mkdir -p "$img/$d"
  python3 -c 'import os, sys; os.setxattr(sys.argv[1], "trusted.overlay.opaque", b"y")' "$img/$d"
done
chmod 700 "$img/root"; chmod 1777 "$img/tmp" "$img/var/tmp"
# RunPod images run as root; SkyPilot's setup still calls sudo.
mkdir -p "$img/usr/local/bin" "$img/root/.local/bin" "$img/opt/sky-wheel" "$img/etc/uv" "$img/usr/sbin"
# shellcheck disable=SC2016  # the sudo script's own "$@", expanded when it runs
printf '#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n' >"$img/usr/local/bin/sudo"
chmod 755 "$img/usr/local/bin/sudo"
cp "$UV" "$img/root/.local/bin/uv"
cp "$SKY_WHEEL" "$img/opt/sky-wheel/"
printf '#!/bin/sh\nexit 101\n' >"$img/usr/sbin/policy-rc.d"; chmod 755 "$img/usr/sbin/policy-rc.d"

m=$work/root
mount -t overlay overlay -o "lowerdir=/,upperdir=$img,workdir=$work/fs/bakework" "$m"
mount -t proc proc "$m/proc"; mount --rbind /dev "$m/dev"; mount -t sysfs sys "$m/sys"
mount --bind /etc/resolv.conf "$m/etc/resolv.conf"
mkdir -p "$m$PY310" "$m/mnt/req" "$m/mnt/uvcache"
mount --bind -o ro "$PY310" "$m$PY310"
mount --bind -o ro "$REPO/requirements" "$m/mnt/req"
mount --bind "$HOST_UV_CACHE" "$m/mnt/uvcache"
# shellcheck disable=SC2016  # the script runs in the chroot: its $VARS are expanded there
chroot "$m" /usr/bin/env -i HOME=/root PATH=/root/.local/bin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  DEBIAN_FRONTEND=noninteractive UV_LINK_MODE=copy PY310="$PY310" TORCH_FLAGS="${TORCH_FLAGS:-}" \
  SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt bash -euc '
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends openssh-server rsync curl patch slurm-wlm munge >/dev/null
  export UV_CACHE_DIR=/root/.cache/uv
  uv venv -q --seed /root/skypilot-runtime --python "$PY310/bin/python3.10"
  export VIRTUAL_ENV=/root/skypilot-runtime
  # SkyPilot pins for its remote runtime (sky/skylet/constants.py), then the wheel it will install
  # (its `slurm` extra, python-hostlist, is in the cache for the offline runtime install on Slurm nodes).
  uv pip install -q "setuptools<70" "click<8.3.0" "ray[default]==2.9.3" "skypilot[runpod,slurm,remote]==0.14.1"
  for w in /opt/sky-wheel/*.whl; do uv pip install -q "$w[runpod,slurm,remote]"; uv pip uninstall -q skypilot; done
  uv pip install -q "click<8.3.0"
  unset VIRTUAL_ENV
  # A Slurm node has no ~/skypilot-runtime: SkyPilot makes a fresh node-local one and installs the wheel
  # there, unpinned. The same install here puts what that resolves to in the cache.
  uv venv -q --seed /tmp/slurm-runtime --python "$PY310/bin/python3.10"
  for w in /opt/sky-wheel/*.whl; do VIRTUAL_ENV=/tmp/slurm-runtime uv pip install -q "$w[slurm,remote]"; done
  rm -rf /tmp/slurm-runtime
  uv venv -q --seed --relocatable --system-site-packages --python /usr/bin/python3 /root/sky-user-env
  unset VIRTUAL_ENV
  # The payload CPU environment (from the host cache: nothing of it is fetched twice).
  UV_CACHE_DIR=/mnt/uvcache uv venv -q /opt/launch-payload-env --python /usr/bin/python3.11
  # less llama-cpp-python (an sdist, built for this Python: minutes on 2 cores), which only the tests of the
  # GGUF export load, never a pod
  awk '"'"'/^[^ #]/ { skip = ($0 ~ /^llama-cpp-python==/) } !skip'"'"' /mnt/req/dev.lock >/tmp/payload.lock
  # (deepspeed, an sdist, builds as pure Python: its ops are compiled only when a run uses one)
  DS_BUILD_OPS=0 UV_CACHE_DIR=/mnt/uvcache uv pip sync -q --python /opt/launch-payload-env/bin/python $TORCH_FLAGS /tmp/payload.lock
  /opt/launch-payload-env/bin/python -c "import torch, transformers, peft, trl, datasets, deepspeed"
'
umount -R "$m"
rm -f "$img/usr/sbin/policy-rc.d"
site=$img/root/skypilot-runtime/lib/python3.10/site-packages
cp "$HOOK/launch_emulator_hook.py" "$site/"
echo "import launch_emulator_hook" >"$site/launch_emulator_hook.pth"
mkdir -p "$img/root/.sky/catalogs"
cp -r "$CATALOG" "$img/root/.sky/catalogs/v8"
printf 'offline = true\n' >"$img/etc/uv/uv.toml"
# payload/gpu_env.sh reuses a complete environment at $LAUNCH_ENV_ROOT/py3.11-<key>: the image's shell
# environment sets LAUNCH_ENV_ROOT=/opt/launch-envs (as a RunPod template's env would; SkyPilot runs
# setup and run with `bash -i`, which reads ~/.bashrc), and the scenarios set FLASH_ATTN_WHEEL empty,
# the key image.py computes (ENV_KEY).
echo 'export LAUNCH_ENV_ROOT=/opt/launch-envs  # the emulated image: the payload CPU environment' >>"$img/root/.bashrc"
mkdir -p "$img/opt/launch-envs"
ln -s /opt/launch-payload-env "$img/opt/launch-envs/py3.11-${ENV_KEY:?}"
date -u +%FT%TZ >"$img/opt/launch-payload-env/.complete"
rm -rf "$img$PY310" "$img/mnt/req" "$img/mnt/uvcache"  # mount points only; pods bind PY310 again
mkdir -p "$img$PY310"
umount "$work/fs"
mv "$out.part" "$out"
echo "baked $out"
