"""The shell the ssh backend runs on the remote host: the driver that runs a node's script detached
(surviving a dropped connection) and records its exit code, and the one-line commands that start,
inspect, stop and list a run there. Plain text with `{placeholders}`, formatted by
launcher/backends/ssh.py with shell-quoted values only."""

# The pid file names the driver's process group only while that group is the run's: a driver killed
# without an exit code (a reboot, the OOM killer) leaves its pid free for another program, which
# `status` must not take for the run and `down` must not signal. While the leader lives it must run
# in this run's root; a group whose leader is gone keeps its id (no new process gets that number
# while the group has members), so its remaining members are the run's. (No /proc: the group check.)
OURS = 'ours() { [ -n "$1" ] && kill -0 -- "-$1" 2>/dev/null && ' \
       '{ [ ! -d "/proc/$1" ] || [ "$(readlink "/proc/$1/cwd" 2>/dev/null)" = "$(pwd -P)" ]; }; }'
_OURS_FORMATTED = OURS.replace("{", "{{").replace("}", "}}")  # as it reads inside a .format()ted script

DRIVER = """\
#!/usr/bin/env bash
# launch ssh driver: run the node script (log on the volume), record its exit code last.
cd "$(dirname "$0")"
mkdir -p {log_dir} tmp  # tmp: the run's TMPDIR (node.sh), so what torchrun and W&B leave in it stays the run's
if [ -s {log} ]; then  # a restart: say where it begins (base.restart_line) before start.sh sees the pid
  {{ [ -n "$(tail -c1 {log})" ] && echo; echo {mark}; }} >> {log}
fi
echo $$ > pid.tmp && mv pid.tmp pid
trap ':' TERM  # `launch down` signals the group: let the run stop, then record its code
bash node.sh >> {log} 2>&1 < /dev/null
rc=$?
echo "$rc" > exit_code.tmp && mv exit_code.tmp exit_code
"""

# A host may run several runs at once (two launch homes, `launch up --new`): each run's torchrun gets a
# port that is free when its node script starts, not the rendered default 29500, which a second run
# would fail to bind (EADDRINUSE) after its setup and data stage had billed. A port the task's envs
# set stays; without a python the default stays.
FREE_PORT = """\
if [ -z "${LAUNCH_MASTER_PORT:-}" ]; then
  LAUNCH_MASTER_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])' \\
    2>/dev/null) && export LAUNCH_MASTER_PORT || unset LAUNCH_MASTER_PORT
fi
"""

# Reads NAME / value line pairs from stdin (the SSH channel) into the environment with builtins
# only, so no secret reaches a file or any process's argv; then starts the driver detached.
START = """\
cd "$(dirname "$0")" || exit 1
""" + OURS + """
if [ -f pid ] && [ ! -f exit_code ] && ours "$(cat pid)"; then cat pid; exit 0; fi
rm -f pid exit_code stopped
while IFS= read -r name && [ -n "$name" ]; do IFS= read -r value; export "$name=$value"; done
setsid nohup bash driver.sh > /dev/null 2>&1 < /dev/null &
for _ in $(seq 1 100); do [ -s pid ] && break; sleep 0.05; done
cat pid
"""

STATUS_CMD = """\
cd {root} 2>/dev/null || {{ echo 'nodir=1'; exit 0; }}
echo "exit=$(cat exit_code 2>/dev/null)"
echo "stopped=$([ -f stopped ] && echo 1)"
""" + _OURS_FORMATTED + """
p=$(cat pid 2>/dev/null); echo "alive=$(ours "$p" && echo 1)"
echo "pid=$p"
echo ---
cat {status} 2>/dev/null || true
"""

# torchrun starts its workers in new sessions (they die with their agent: PR_SET_PDEATHSIG); as a
# safety net every process whose environment carries the run's LAUNCH_RUN_ID and LAUNCH_VOLUME is
# signalled too.
DOWN_CMD = """\
cd {root} 2>/dev/null || exit 0
touch stopped
p=$(cat pid 2>/dev/null)
tagged() {{ for f in $(grep -lzxF -- {marker} /proc/[0-9]*/environ 2>/dev/null); do
  grep -qzxF -- {volume} "$f" 2>/dev/null && echo "$f"; done | cut -d/ -f3; }}
""" + _OURS_FORMATTED + """
signal() {{
  ours "$p" && kill -"$1" -- "-$p" 2>/dev/null
  for q in $(tagged); do kill -"$1" -- "-$q" 2>/dev/null || kill -"$1" "$q" 2>/dev/null; done
}}
alive() {{ ours "$p" || [ -n "$(tagged)" ]; }}
alive || exit 0
signal TERM
for _ in $(seq 1 {ticks}); do alive || exit 0; sleep 0.5; done
signal KILL; echo killed
"""

SEED_AND_LIST = """\
W={w}
if [ ! -d "$W" ]; then
  mkdir -p "$(dirname "$W")"
  prev=$(ls -dt {root}/*/workdir 2>/dev/null | head -n1)
  # Hard links to the newest workdir: free, and safe because tar replaces a file by unlinking it.
  if [ -n "$prev" ]; then cp -al "$prev" "$W.seed" 2>/dev/null && mv "$W.seed" "$W" || rm -rf "$W.seed"; fi
  mkdir -p "$W"
fi
cd "$W" && find . -name __pycache__ -prune -o -type f -printf '%P\\t%s\\t%T@\\n'
"""
