# shellcheck shell=bash
# `launch status` on the host (after ours.sh): the run's exit code and when it was written, stop mark
# and liveness, then its status.json. Parameters set above it by launcher/backends/ssh.py
# (shell-quoted): root (the run's root), status_json (its status.json on the volume; not `status`,
# read-only in zsh, a login shell the command may meet).
: "${root:?}" "${status_json:?}"
cd "$root" 2>/dev/null || { echo 'nodir=1'; exit 0; }
echo "exit=$(cat exit_code 2>/dev/null)"
echo "ended=$(stat -c %Y exit_code 2>/dev/null || stat -f %m exit_code 2>/dev/null)"  # GNU, then BSD stat
echo "stopped=$([ -f stopped ] && echo 1)"
p=$(cat pid 2>/dev/null); echo "alive=$(ours "$p" && echo 1)"
echo "pid=$p"
echo ---
cat "$status_json" 2>/dev/null || true
