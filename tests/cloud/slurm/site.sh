#!/usr/bin/env bash
# The emulated Slurm site's machines, as one process (site.py starts it as
#   ip netns exec SITE_NS unshare --mount --propagation slave bash site.sh IMAGE SITE_DIR PY310 NODES -- HIDE...
# so every mount it and its nodes make lives only in namespaces of their own; a slave, not private, so a
# network namespace the host adds later, a replacement node's, is seen here: private, `ip netns exec` of it
# said "setting the network namespace ... failed: Invalid argument"). It loop-mounts the baked
# image read-only, starts each node (NODES: `name:role:netns ...`) in its network namespace, writes
# SITE_DIR/ready and waits; on SIGTERM it SIGKILLs the nodes (each node's PID 1 takes its pid namespace,
# and with it every process of the node, along) and exits; its mounts go with it.
set -euo pipefail
image=$1 site=$2 py310=$3 nodes=$4
shift 4
[ "${1:-}" != "--" ] || shift
here=$(dirname "$(readlink -f "$0")")
mkdir -p "$site/image" "$site/nodes"
mount -o loop,ro "$image" "$site/image"
pids=()
stop() { for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done; exit 0; }
trap stop TERM INT
start_node() {  # name:role:netns
  local name role ns
  IFS=: read -r name role ns <<<"$1"
  mkdir -p "$site/nodes/$name"
  setsid ip netns exec "$ns" unshare --mount --uts --pid --fork --propagation private --kill-child=SIGKILL \
    bash "$here/node_init.sh" "$name" "$role" "$site/image/image" "$site/nodes/$name" "$site" "$py310" -- "$@" \
    >>"$site/nodes/$name.log" 2>&1 </dev/null &
  pids+=("$!")
  echo "$!" >"$site/nodes/$name.pid"
}
for spec in $nodes; do start_node "$spec" "$@"; done
touch "$site/ready"
# A replacement machine (site.py replace_node): SITE_DIR/nodes/NAME.start holds its `name:role:netns`.
while :; do
  for req in "$site"/nodes/*.start; do
    [ -e "$req" ] || continue
    spec=$(cat "$req"); rm -f "$req"; start_node "$spec" "$@"
  done
  sleep 1 & wait $! || true
done
