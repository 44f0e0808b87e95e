#!/usr/bin/env bash
# `make demo`: the whole job end to end on this machine - plan, up, follow, down --fetch-artifacts.
set -euo pipefail
cd "$(dirname "$0")/.."
export LAUNCH_HOME="${LAUNCH_HOME:-$PWD/.launch}"
export SKYPILOT_DISABLE_USAGE_COLLECTION=1
launch=.venv/bin/launch
echo "== launch plan local-demo"; $launch plan local-demo
echo "== launch up local-demo";   $launch up local-demo
echo "== launch logs --follow";   $launch logs --follow --progress
echo "== launch down --fetch-artifacts"; $launch down --fetch-artifacts
echo "== launch cost"; $launch cost
