# The GPU machine's Python environment. Sourced (bash) by the rendered task's `setup` and `run`:
#
#   source payload/gpu_env.sh     # build it unless it already exists, then put it first on PATH
#
# What it installs: payload/requirements-gpu.lock (`make lock`: resolved for linux x86_64, Python
# 3.11, CUDA 12), with uv, into its own Python 3.11 - never on top of the image's torch stack - plus
# the prebuilt flash-attn wheel ($FLASH_ATTN_WHEEL; sdpa is the fallback when it is unavailable).
# Wheels only, except deepspeed (an sdist on PyPI) which is built with DS_BUILD_OPS=0: pure Python,
# no extension compiled (its ops JIT-compile on first use, if a run uses any).
#
# Where: $LAUNCH_ENV_ROOT/<key> (default $LAUNCH_VOLUME/.envs), the key hashing the lock, the
# flash-attn wheel, the Python and uv versions. On the network volume it outlives the machine, so a
# spot recovery or a relaunch finds it complete and installs nothing; a bucket mount (FUSE) is no
# place for a venv, so bucket profiles set LAUNCH_ENV_ROOT to each node's disk. `.complete` is
# written last: a half-built environment (a machine lost mid-install) is removed and rebuilt.
#
# LAUNCH_LOCAL set (the local backend, tests): nothing is installed, the current python is used.
# Knobs for tests: LAUNCH_GPU_LOCK, LAUNCH_ENV_PYTHON, LAUNCH_ENV_SMOKE, and uv's own UV_* vars.

launch_gpu_env() {
  [ -z "${LAUNCH_LOCAL:-}" ] || return 0
  local uv_version=0.13.9 python="${LAUNCH_ENV_PYTHON:-3.11}"
  local lock="${LAUNCH_GPU_LOCK:-payload/requirements-gpu.lock}"
  local root="${LAUNCH_ENV_ROOT:-${LAUNCH_VOLUME:-$HOME/.cache/launch}/.envs}"
  root="${root/#\~/$HOME}"
  local key env uv
  key=$({ cat "$lock"; echo "${FLASH_ATTN_WHEEL:-}"; echo "python $python uv $uv_version"; } \
        | sha256sum | cut -c1-16)
  env="$root/py$python-$key"
  mkdir -p "$root"
  if [ ! -f "$env/.complete" ]; then
    exec 9>"$env.lock"
    command -v flock >/dev/null && flock -w 3600 9  # another setup on this volume builds it
  fi
  if [ -f "$env/.complete" ]; then
    echo "launch: reusing the GPU environment $env (nothing to install)"
  else
    uv=$(_launch_uv "$uv_version" "$root")
    echo "launch: building the GPU environment $env from $lock (once per volume)"
    rm -rf "$env"
    export UV_PYTHON_INSTALL_DIR="${UV_PYTHON_INSTALL_DIR:-$root/python}"  # survives like the env
    export UV_PYTHON_PREFERENCE="${UV_PYTHON_PREFERENCE:-only-managed}"  # never the image's python
    export UV_LINK_MODE="${UV_LINK_MODE:-copy}"  # the cache is on another disk than the env
    "$uv" venv --quiet --python "$python" "$env"
    DS_BUILD_OPS=0 "$uv" pip sync --quiet --python "$env/bin/python" \
      --only-binary :all: --no-binary deepspeed "$lock"
    if [ -n "${FLASH_ATTN_WHEEL:-}" ]; then
      "$uv" pip install --quiet --python "$env/bin/python" --no-deps "$FLASH_ATTN_WHEEL" \
        || echo "launch: flash-attn wheel unavailable; attention falls back to sdpa"
    fi
    local smoke="${LAUNCH_ENV_SMOKE:-torch torchvision transformers peft trl accelerate datasets}"
    "$env/bin/python" -c "import ${smoke// /, }" \
      || { echo "launch: the new GPU environment does not import ($smoke); see above" >&2; return 1; }
    date -u +%FT%TZ >"$env/.complete"
  fi
  exec 9>&-
  local others
  others=$(find "$root" -mindepth 1 -maxdepth 1 -name 'py*' -type d ! -path "$env" 2>/dev/null | head -3)
  [ -z "$others" ] || echo "launch: older environments in $root (rm -rf when no run uses them): $others"
  export VIRTUAL_ENV="$env" PATH="$env/bin:$PATH"
}

_launch_uv() {  # a uv of the pinned version: on PATH, else installed next to the environments
  local version="$1" dir="$2/uv-$1"
  if command -v uv >/dev/null && [ "$(uv --version | cut -d' ' -f2)" = "$version" ]; then
    command -v uv
    return
  fi
  if [ ! -x "$dir/bin/uv" ]; then
    python3 -m pip install -q --target "$dir" "uv==$version" >&2 \
      || curl -LsSf "https://astral.sh/uv/$version/install.sh" \
         | env UV_UNMANAGED_INSTALL="$dir/bin" sh >&2
  fi
  echo "$dir/bin/uv"
}

launch_gpu_env
