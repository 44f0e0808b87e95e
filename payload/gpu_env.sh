# shellcheck shell=bash
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
# A network failure while building it (the package index, the uv or Python download) is tried
# LAUNCH_ENV_TRIES times (3, LAUNCH_ENV_RETRY_S 30 s then 60 s apart), then
# ends setup with exit 75 (payload/errors.py EXIT_TRANSIENT: retried on a fresh machine), not uv's
# own exit 2, which the launcher reads as "config or data error" and never retries; past
# LAUNCH_MAX_RETRIES such setups in a row (counted in the env root: on the volume, or per node for
# bucket profiles) with 1. Any other failure of the build ends it with 1 (a crash: retrying a lock
# that cannot install would bill forever).
#
# LAUNCH_LOCAL set (the local backend, tests): nothing is installed, the current python is used.
# Knobs for tests: LAUNCH_GPU_LOCK, LAUNCH_ENV_PYTHON, LAUNCH_ENV_SMOKE, LAUNCH_ENV_TRIES,
# LAUNCH_ENV_RETRY_S, and uv's own UV_* vars.

launch_gpu_env() {
  [ -z "${LAUNCH_LOCAL:-}" ] || return 0
  local uv_version=0.13.9 python="${LAUNCH_ENV_PYTHON:-3.11}"
  local lock="${LAUNCH_GPU_LOCK:-payload/requirements-gpu.lock}"
  local root="${LAUNCH_ENV_ROOT:-${LAUNCH_VOLUME:-$HOME/.cache/launch}/.envs}"
  root="${root/#\~/$HOME}"
  _LAUNCH_ENV_ROOT="$root"  # where _launch_net counts setups that failed on the network in a row
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
    _launch_net "downloading uv $uv_version" _launch_uv_install "$uv_version" "$root" || return $?
    uv="$_LAUNCH_UV"
    echo "launch: building the GPU environment $env from $lock (once per volume)"
    rm -rf "$env"
    export UV_PYTHON_INSTALL_DIR="${UV_PYTHON_INSTALL_DIR:-$root/python}"  # survives like the env
    export UV_PYTHON_PREFERENCE="${UV_PYTHON_PREFERENCE:-only-managed}"  # never the image's python
    export UV_LINK_MODE="${UV_LINK_MODE:-copy}"  # the cache is on another disk than the env
    _launch_net "creating the environment (Python $python)" "$uv" venv --quiet --clear --python "$python" "$env" \
      || return $?
    _launch_net "installing $lock" env DS_BUILD_OPS=0 "$uv" pip sync --quiet --python "$env/bin/python" \
      --only-binary :all: --no-binary deepspeed "$lock" || return $?
    if [ -n "${FLASH_ATTN_WHEEL:-}" ]; then
      _launch_net "installing the flash-attn wheel" "$uv" pip install --quiet --python "$env/bin/python" \
        --no-deps "$FLASH_ATTN_WHEEL" || echo "launch: flash-attn wheel unavailable; attention falls back to sdpa"
    fi
    local smoke="${LAUNCH_ENV_SMOKE:-torch torchvision transformers peft trl accelerate datasets}"
    "$env/bin/python" -c "import ${smoke// /, }" \
      || { echo "launch: the new GPU environment does not import ($smoke); see above" >&2; return 1; }
    date -u +%FT%TZ >"$env/.complete"
    rm -f "$root/.network-failures"
  fi
  exec 9>&-
  local others
  others=$(find "$root" -mindepth 1 -maxdepth 1 -name 'py*' -type d ! -path "$env" 2>/dev/null | head -3)
  [ -z "$others" ] || echo "launch: older environments in $root (rm -rf when no run uses them): $others"
  export VIRTUAL_ENV="$env" PATH="$env/bin:$PATH"
}

_launch_uv_install() {  # _LAUNCH_UV: a uv of the pinned version, on PATH, else installed next to the envs
  local version="$1" dir="$2/uv-$1"
  if command -v uv >/dev/null && [ "$(uv --version | cut -d' ' -f2)" = "$version" ]; then
    _LAUNCH_UV=$(command -v uv)
    return
  fi
  if [ ! -x "$dir/bin/uv" ]; then
    python3 -m pip install -q --target "$dir" "uv==$version" \
      || curl -LsSf "https://astral.sh/uv/$version/install.sh" \
         | env UV_UNMANAGED_INSTALL="$dir/bin" sh
  fi
  _LAUNCH_UV="$dir/bin/uv"
  [ -x "$_LAUNCH_UV" ] || { echo "launch: no uv at $_LAUNCH_UV after installing it" >&2; return 1; }
}

# What a network failure prints: uv (Failed to fetch, tcp connect, dns), pip (NewConnectionError,
# ReadTimeout), curl ((6) Could not resolve host, (7) Failed to connect, (28) timed out).
_LAUNCH_NET_ERRORS='failed to fetch|error sending request|tcp connect error|dns error|connection refused|connection reset|timed out|network is unreachable|no route to host|name or service not known|temporary failure in name resolution|could not resolve host|failed to connect|newconnectionerror|failed to establish a new connection|max retries exceeded|readtimeouterror|connecttimeout'

_launch_net_streak() {  # 75 (retried), or 1 once setups failed on the network LAUNCH_MAX_RETRIES times in a row
  local file="$_LAUNCH_ENV_ROOT/.network-failures" max="${LAUNCH_MAX_RETRIES:-3}" n
  n=$(( $(cat "$file" 2>/dev/null || echo 0) + 1 ))
  echo "$n" >"$file" 2>/dev/null || true
  if [ "$n" -gt "$max" ]; then
    echo "launch: $1 failed on the network in $n setups in a row: not retrying (exit 1); check the" \
         "machine's network, then \`launch up --resume\`" >&2
    return 1
  fi
  echo "launch: $1 failed on the network ($LAUNCH_ENV_TRIES_DONE tries; setup $n of $((max + 1)) in a row):" \
       "ending setup with exit 75 (transient: retried on a fresh machine)" >&2
  return 75
}

_launch_net() {  # WHAT CMD...: CMD, again after a wait while its failure is the network's; then 75
  local what="$1" tries="${LAUNCH_ENV_TRIES:-3}" wait="${LAUNCH_ENV_RETRY_S:-30}" try=1 code err
  LAUNCH_ENV_TRIES_DONE=$tries
  shift
  err=$(mktemp)
  while true; do
    code=0
    # CMD's stderr kept in $err, then shown: written in full before the grep below reads it (a tee in a
    # process substitution was not reliably waited for: under CI load a network failure read as "not a network
    # error", and was not retried). CMD runs in this shell (_launch_uv_install sets _LAUNCH_UV); the
    # installs are --quiet, so little waits to be shown.
    "$@" 2>"$err" || code=$?
    cat "$err" >&2
    [ "$code" -ne 0 ] || { rm -f "$err"; return 0; }
    if ! grep -qiE "$_LAUNCH_NET_ERRORS" "$err"; then
      rm -f "$err"
      echo "launch: $what failed (exit $code), not a network error: see above" >&2
      return 1
    fi
    if [ "$try" -ge "$tries" ]; then
      rm -f "$err"
      _launch_net_streak "$what"
      return $?
    fi
    echo "launch: $what failed on the network (try $try of $tries); retrying in $((wait * try)) s" >&2
    sleep "$((wait * try))"
    try=$((try + 1))
  done
}

launch_gpu_env
