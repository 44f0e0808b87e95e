#!/usr/bin/env bash
# `make lint` (run by `make test`): ruff on the Python (the rules pyproject.toml's [tool.ruff] selects)
# and shellcheck on every shell script launch runs: the GPU machine's environment (payload/gpu_env.sh),
# the local and ssh backends' drivers and host commands (launcher/backends/sh/), the `setup` and `run`
# of every rendered task in sky/, this folder's scripts and the emulated cloud's. shellcheck is
# Debian's package: where it is missing it is installed as the ssh tests install openssh-server (as
# root, with apt-get), else it is skipped with the reason said.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}

rc=0  # both run, whichever fails
if "$BIN/ruff" check --quiet .; then echo "ruff: clean"; else rc=1; fi

have_shellcheck() {
  command -v shellcheck > /dev/null && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get > /dev/null; then
    echo "shellcheck not run: not installed, and installing it needs root and apt-get (apt-get install shellcheck)"
    return 1
  fi
  local install=(apt-get install -y -q --no-install-recommends shellcheck)
  "${install[@]}" > /dev/null 2>&1 || { apt-get update -q > /dev/null 2>&1 && "${install[@]}" > /dev/null 2>&1; } || {
    echo "shellcheck not run: apt-get could not install it (no package index reachable?)"
    return 1
  }
}

if have_shellcheck; then
  tasks=$(mktemp -d)
  trap 'rm -rf "$tasks"' EXIT
  # a rendered task's setup/run is bash that SkyPilot runs on each node: one file each, as it runs
  "$BIN/python" - "$tasks" <<'EOF'
import pathlib, sys, yaml
out = pathlib.Path(sys.argv[1])
for task in sorted(pathlib.Path("sky").glob("*.yaml")):
    doc = yaml.safe_load(task.read_text()) or {}
    for key in ("setup", "run"):
        if doc.get(key):
            (out / f"{task.stem}.{key}.sh").write_text("# shellcheck shell=bash\n" + doc[key])
EOF
  files=(payload/gpu_env.sh launcher/backends/sh/*.sh scripts/*.sh tests/cloud/emulator/*.sh "$tasks"/*.sh)
  if shellcheck "${files[@]}"; then
    echo "shellcheck: clean (${#files[@]} scripts, the rendered tasks' setup/run among them)"
  else
    rc=1
  fi
fi
exit "$rc"
