#!/usr/bin/env bash
# launch ssh driver: run the node script (log on the volume), record its exit code last.
# Written as the run's driver.sh by launcher/backends/ssh.py, which sets its parameters above this line
# (shell-quoted): log (the run's log on the volume), log_dir (its folder), mark (the restart line).
: "${log:?}" "${log_dir:?}" "${mark:?}"
cd "$(dirname "$0")" || exit 1
mkdir -p "$log_dir" tmp  # tmp: the run's TMPDIR (node.sh), so what torchrun and W&B leave in it stays the run's
if [ -s "$log" ]; then  # a restart: say where it begins (base.restart_line) before start.sh sees the pid
  # shellcheck disable=SC2094  # the log's last byte is read before the group appends to it
  { [ -n "$(tail -c1 "$log")" ] && echo; echo "$mark"; } >> "$log"
fi
echo $$ > pid.tmp && mv pid.tmp pid
trap ':' TERM  # `launch down` signals the group: let the run stop, then record its code
bash node.sh >> "$log" 2>&1 < /dev/null
rc=$?
echo "$rc" > exit_code.tmp && mv exit_code.tmp exit_code
