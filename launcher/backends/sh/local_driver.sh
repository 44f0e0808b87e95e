#!/usr/bin/env bash
# launch local driver: start every node, wait, record the exit code (written last, atomically).
# Several nodes: as SkyPilot's job driver does (get_or_fail), the first node that fails ends what the
# others run (SIGTERM), so none waits at the rendezvous for a node that is gone; its code is the run's.
# Written as the run's driver.sh by launcher/backends/local.py; NUM_NODES comes from its environment.
cd "$(dirname "$0")/workdir" || exit 1
pids=()
for rank in $(seq 0 $((NUM_NODES - 1))); do
  log="../node$rank.log"; [ "$rank" = 0 ] && log="../run.log"
  SKYPILOT_NODE_RANK=$rank bash ../node.sh >>"$log" 2>&1 &
  pids+=($!)
done
rc=0
if [ "${#pids[@]}" -gt 1 ] && (( BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] >= 403 )); then  # wait -n
  for _ in "${pids[@]}"; do
    wait -n; r=$?
    if [ "$r" != 0 ] && [ "$rc" = 0 ]; then
      rc=$r
      for p in "${pids[@]}"; do pkill -TERM -P "$p" 2>/dev/null; done
    fi
  done
else
  for p in "${pids[@]}"; do wait "$p" || { r=$?; [ "$rc" = 0 ] && rc=$r; }; done
fi
echo "$rc" > ../exit_code.tmp && mv ../exit_code.tmp ../exit_code
