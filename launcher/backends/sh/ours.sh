# shellcheck shell=bash
# ours PID: whether PID is this run's driver's process group. The pid file names that group only while
# the group is the run's: a driver killed without an exit code (a reboot, the OOM killer) leaves its pid
# free for another program, which `status` must not take for the run and `down` must not signal. While
# the leader lives it must run in this run's root; a group whose leader is gone keeps its id (no new
# process gets that number while the group has members), so its remaining members are the run's.
# (No /proc: the group check.)
ours() { [ -n "$1" ] && kill -0 -- "-$1" 2>/dev/null && { [ ! -d "/proc/$1" ] || [ "$(readlink "/proc/$1/cwd" 2>/dev/null)" = "$(pwd -P)" ]; }; }
