# shellcheck shell=bash
# A host may run several runs at once (two launch homes, `launch up --new`): each run's torchrun gets a
# port that is free when its node script starts, not the rendered default 29500, which a second run
# would fail to bind (EADDRINUSE) after its setup and data stage had billed. A port the task's envs
# set stays; without a python the default stays. (Part of node.sh, after its exports.)
if [ -z "${LAUNCH_MASTER_PORT:-}" ]; then
  # shellcheck disable=SC2015  # no port (no python3): unset, whichever step failed
  LAUNCH_MASTER_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])' \
    2>/dev/null) && export LAUNCH_MASTER_PORT || unset LAUNCH_MASTER_PORT
fi
