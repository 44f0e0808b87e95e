# shellcheck shell=bash
# `launch down` on the host (after ours.sh): SIGTERM the run's process group, SIGKILL it after `ticks`
# half-seconds. torchrun starts its workers in new sessions (they die with their agent:
# PR_SET_PDEATHSIG); as a safety net every process whose environment carries the run's marker
# (LAUNCH_RUN_ID=...) and volume (LAUNCH_VOLUME=...) is signalled too. Parameters set above it by
# launcher/backends/ssh.py (shell-quoted): root, ticks, marker, volume.
: "${root:?}" "${ticks:?}" "${marker:?}" "${volume:?}"
cd "$root" 2>/dev/null || exit 0
touch stopped
p=$(cat pid 2>/dev/null)
# shellcheck disable=SC2013  # /proc/<pid>/environ paths: words are lines
tagged() { for f in $(grep -lzxF -- "$marker" /proc/[0-9]*/environ 2>/dev/null); do
  grep -qzxF -- "$volume" "$f" 2>/dev/null && echo "$f"; done | cut -d/ -f3; }
signal() {
  ours "$p" && kill -"$1" -- "-$p" 2>/dev/null
  for q in $(tagged); do kill -"$1" -- "-$q" 2>/dev/null || kill -"$1" "$q" 2>/dev/null; done
}
alive() { ours "$p" || [ -n "$(tagged)" ]; }
alive || exit 0
signal TERM
for _ in $(seq 1 "$ticks"); do alive || exit 0; sleep 0.5; done
signal KILL; echo killed
