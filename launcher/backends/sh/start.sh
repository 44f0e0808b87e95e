# shellcheck shell=bash
# start.sh in the run's root (after ours.sh): start the driver detached, unless the run's driver is
# alive; print its pid. Reads NAME / value line pairs from stdin (the SSH channel) into the environment
# with builtins only, so no secret reaches a file or any process's argv.
cd "$(dirname "$0")" || exit 1
if [ -f pid ] && [ ! -f exit_code ] && ours "$(cat pid)"; then cat pid; exit 0; fi
rm -f pid exit_code stopped
while IFS= read -r name && [ -n "$name" ]; do IFS= read -r value; export "$name=$value"; done
setsid nohup bash driver.sh > /dev/null 2>&1 < /dev/null &
for _ in $(seq 1 100); do [ -s pid ] && break; sleep 0.05; done
cat pid
