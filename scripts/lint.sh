#!/usr/bin/env bash
# `make lint` (run by `make test`): ruff on the Python (the rules pyproject.toml's [tool.ruff] selects)
# and shellcheck on every shell script of the checkout (the GPU machine's environment payload/gpu_env.sh,
# the local and ssh backends' drivers and host commands in launcher/backends/sh/, scripts/, CI's, the
# emulated cloud's) and on each rendered task's `setup` and `run` (scripts/shell_files.py). shellcheck is
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
  mapfile -t files < <("$BIN/python" scripts/shell_files.py "$tasks")
  if shellcheck "${files[@]}"; then
    echo "shellcheck: clean (${#files[@]} scripts, the rendered tasks' setup/run among them)"
  else
    rc=1
  fi
fi
exit "$rc"
