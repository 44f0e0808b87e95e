#!/usr/bin/env bash
# Inside a node's root: munged, then the role's daemons (login: slurmctld and sshd; compute: slurmd).
# PID 1 waits on them; their logs are in the node's /var/log (NODE_DIR/upper/var/log on the host).
role=$1
mkdir -p /run/munge /run/sshd
munged --force --key-file=/etc/munge/munge.key --socket=/run/munge/munge.socket.2
if [ "$role" = login ]; then
  [ -f /etc/ssh/launch_host_ed25519 ] || ssh-keygen -q -t ed25519 -N "" -f /etc/ssh/launch_host_ed25519
  slurmctld -D -i >/var/log/slurm/slurmctld.out 2>&1 &
  /usr/sbin/sshd -D -e -f /etc/ssh/sshd_config_launch >/var/log/sshd.out 2>&1 &
else
  slurmd -D -N "$(hostname)" >/var/log/slurm/slurmd.out 2>&1 &
fi
wait
