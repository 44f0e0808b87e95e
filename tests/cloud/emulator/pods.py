"""Pods of the emulated RunPod: isolated Linux hosts on a private bridge (the `PodHost` of runpod_api).

Runs inside the emulator process (serve.py), which lives in the cloud's own network namespace and a
private mount namespace. A pod is:
- a network namespace `<prefix>-<pod id>` whose eth0 is a veth on the cloud's bridge, at the next free
  address of the cloud's /24 (no route out: the bridge is all a pod can reach);
- a pid, mount and uts namespace (`unshare --kill-child`), whose PID 1 (pod_init.sh) builds an overlay
  root (the baked image layer over this machine's /, plus a writable container disk) and runs the
  container command SkyPilot passed as `dockerArgs`;
- the network volume's host directory, bind-mounted at the path the pod was created with.
Stopping a pod SIGKILLs its PID 1 (the kernel then kills every process of its pid namespace), waits
until the namespace has no process left, and deletes the network namespace (and with it the veth).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def netns_pids(name: str) -> list[int]:
    out = sh("ip", "netns", "pids", name, check=False).stdout.split()
    return [int(p) for p in out if p.isdigit()]


def kill_netns(name: str, timeout: float = 20.0) -> None:
    """Every process in network namespace `name` killed, then the namespace deleted."""
    deadline = time.monotonic() + timeout
    while True:
        pids = netns_pids(name)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} of {name} do not die")
        time.sleep(0.1)
    sh("ip", "netns", "del", name, check=False)


class Pods:
    def __init__(self, *, prefix: str, subnet: str, bridge: str, layer: Path, disks: Path, py310: Path,
                 api_url: str, logs: Path, hide: list[str]):
        self.prefix, self.subnet, self.bridge = prefix, subnet, bridge
        self.layer, self.disks, self.py310, self.api_url = layer, disks, py310, api_url
        self.logs, self.hide = logs, hide
        self._lock = threading.Lock()
        self._free = list(range(10, 250))
        self._pods: dict[str, dict] = {}  # id -> {"n", "ip", "proc", "ns"}

    def start(self, pod: dict, volume_dir: str | None, mount_path: str | None) -> str:
        pod_id = pod["id"]
        with self._lock:
            n = self._free.pop(0)
            ip = f"{self.subnet}.{n}"
            ns = f"{self.prefix}-{pod_id}"
            self._pods[pod_id] = {"n": n, "ip": ip, "ns": ns, "proc": None}
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", f"v{n}", "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", f"v{n}", "master", self.bridge, "up")
        sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        disk = self.disks / pod_id
        (disk / "upper").mkdir(parents=True, exist_ok=True)
        args = disk / "docker_args"
        args.write_text(pod.get("dockerArgs") or "sleep infinity")
        env = {**(pod.get("env") or {}), **(pod.get("containerEnv") or {})}  # what RunPod puts in the container
        (disk / "container_env").write_text("".join(f"{k}={v}\n" for k, v in env.items() if "\n" not in f"{k}{v}"))
        cmd = ["ip", "netns", "exec", ns, "unshare", "--mount", "--pid", "--uts", "--fork", "--propagation",
               "private", "--kill-child=SIGKILL", "bash", str(HERE / "pod_init.sh"), pod_id, ip, str(self.layer),
               str(disk / "upper"), str(self.py310), self.api_url, str(args)]
        if volume_dir and mount_path:
            cmd += [volume_dir, mount_path]
        cmd += ["--", *self.hide]
        log = open(self.logs / f"pod-{pod_id}.log", "ab")
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        with self._lock:
            self._pods[pod_id]["proc"] = proc
        return ip

    def ssh_ready(self, pod_id: str) -> bool:
        p = self._pods.get(pod_id)
        if p is None or p["proc"] is None or p["proc"].poll() is not None:
            return False
        try:
            with socket.create_connection((p["ip"], 22), timeout=1) as s:
                s.settimeout(1)
                return s.recv(4).startswith(b"SSH")
        except OSError:
            return False

    def stop(self, pod_id: str) -> None:
        with self._lock:
            p = self._pods.pop(pod_id, None)
        if p is None:
            return
        if p["proc"] is not None:
            try:
                os.killpg(p["proc"].pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p["proc"].wait(timeout=30)
        kill_netns(p["ns"])
        shutil.rmtree(self.disks / pod_id, ignore_errors=True)
        with self._lock:
            self._free.append(p["n"])

    def stop_all(self) -> None:
        for pod_id in list(self._pods):
            self.stop(pod_id)
