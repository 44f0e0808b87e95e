"""One emulated Slurm site for one test: a login node and two compute nodes running the real Slurm
(Debian's slurm-wlm 22.05: slurmctld, slurmd, munge) and sshd, and a user who talks to it.

    with SlurmSite(tmp_path) as site:
        r = site.launch("up", "qwen3-32b-4x4-a100", "--set", "cluster.infra=slurm/hpc", ...)
        site.on_login("squeue -h")                 # the site's own view (squeue, sinfo, scontrol)
        site.kill_node("node2")                    # a machine dies: its every process, at once

Layout (nothing outside these, and nothing left after `__exit__`, also when the test fails):
- network namespace `ls<pid>-<n>` (the site's network): a bridge at SUBNET.1, and every command the
  user runs (`launch`, SkyPilot's local API server, `sky`): the user reaches the login node (.10) and
  nothing else. The host's network is never touched.
- network namespaces `ls<pid>-<n>-login`, `-node1`, `-node2`: each node's eth0 on that bridge.
- the site process (site.sh) in its own mount namespace: the image's loop mount and every node's
  mounts exist only there; each node is a pid/mount/uts namespace (node_init.sh).
- a scratch dir: the user's HOME (`~/.slurm/config`, the key), the shared home and /shared, the nodes'
  writable layers and node-local /tmp, the site's config (slurm.conf, gres.conf, the munge key).
On exit: SIGTERM to the site process (it SIGKILLs its nodes), then every process still in one of these
namespaces is SIGKILLed and the namespaces deleted; `leftovers()` says what would remain.

GPUs are GRES backed by empty files (gres.conf `File=`: slurmd 22.05 registers a Count= alone as 0 and
the node goes INVAL), of the type a real A100 80GB node reports (`nvidia_a100_sxm4_80gb`, which SkyPilot
canonicalizes to A100-80GB): SkyPilot schedules the profile's `A100-80GB:8` per node. Training runs on
CPU (`CUDA_VISIBLE_DEVICES=` empty: the "devices" have no minor numbers).
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.cloud.emulator import image as image_mod
from tests.cloud.emulator.pods import kill_netns, netns_pids, sh

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
LAUNCH = Path(sys.executable).parent / "launch"
CLUSTER = "hpc"  # the Slurm ClusterName and the `Host` of ~/.slurm/config: `infra: slurm/hpc`
GPU_TYPE = "nvidia_a100_sxm4_80gb"
# A real 8 x A100 80GB node's shape (Azure ND96amsr A100 v4): SkyPilot asks Slurm for 4 CPUs and 16 GB
# per GPU (sky/clouds/slurm.py:94-95); slurmd registers what slurm.conf says (config_overrides)
NODE_CPUS, NODE_MEM_MB = 96, 1_800_000
NODES = (("login", "login", 10), ("node1", "compute", 11), ("node2", "compute", 12))
_COUNT = itertools.count()


def sweep_stale() -> None:
    """`ls<pid>-...` namespaces whose harness process is gone (a run that was killed)."""
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        pid = name[2:].split("-")[0] if name.startswith("ls") and "-" in name else ""
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            kill_netns(name)


def _subnet(n: int) -> str:
    """A /24 of the site's own: two sites at once (two pytest processes) must not share addresses, since
    ssh's ControlMaster sockets (SkyPilot's ControlPath, in the host's /tmp) are keyed by address and
    cross network namespaces: a second site's sbatch went to the first site's login node."""
    return f"10.217.{(os.getpid() * 8 + n) % 250}"


class SlurmSite:
    def __init__(self, scratch: Path, *, subnet: str = ""):
        self.scratch = Path(scratch)
        n = next(_COUNT)
        self.ns = f"ls{os.getpid()}-{n}"
        self.subnet = subnet or _subnet(n)
        self.dir = self.scratch / "site"  # site.sh's SITE_DIR
        self.home = self.scratch / "home"  # the user's, on the machine they launch from
        self.launch_home = self.scratch / "launch-home"
        self.shared = self.dir / "shared"  # /shared on every node
        self._proc: subprocess.Popen | None = None
        self.timings: list[tuple[str, float, int]] = []

    # --- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> "SlurmSite":
        sweep_stale()
        image, catalog = image_mod.ensure_image()
        try:
            self._network()
            self._config()
            self._user_home(catalog)
            self._start(image)
            self.wait_idle(2)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def node_ns(self, name: str) -> str:
        return f"{self.ns}-{name}"

    def ip(self, name: str) -> str:
        return f"{self.subnet}.{dict((n, i) for n, _, i in NODES)[name]}"

    def _network(self) -> None:
        """The bridge inside the site's namespace; each node's veth made there and moved into the node's."""
        sh("ip", "netns", "add", self.ns)
        sh("ip", "-n", self.ns, "link", "set", "lo", "up")
        sh("ip", "-n", self.ns, "link", "add", "slurmbr0", "type", "bridge")
        sh("ip", "-n", self.ns, "addr", "add", f"{self.subnet}.1/24", "dev", "slurmbr0")
        sh("ip", "-n", self.ns, "link", "set", "slurmbr0", "up")
        for name, _, n in NODES:
            self._node_network(name, n)

    def _node_network(self, name: str, n: int) -> None:
        ns = self.node_ns(name)
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", self.ns, "link", "add", f"v{n}", "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "-n", self.ns, "link", "set", f"v{n}", "master", "slurmbr0", "up")
        sh("ip", "-n", ns, "addr", "add", f"{self.ip(name)}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")

    def _config(self) -> None:
        etc = self.dir / "etc"
        etc.mkdir(parents=True)
        (self.dir / "home").mkdir(mode=0o700)
        self.shared.mkdir()
        hosts = "127.0.0.1 localhost\n" + "".join(f"{self.ip(n)} {n}\n" for n, _, _ in NODES)
        (etc / "hosts").write_text(hosts)
        (etc / "slurm.conf").write_text(slurm_conf(self.subnet))
        (etc / "gres.conf").write_text(f"NodeName=node[1-2] Name=gpu Type={GPU_TYPE} File=/etc/launch-gpu/nvidia[0-7]\n")
        (etc / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
        (etc / "munge.key").write_bytes(os.urandom(1024))
        (etc / "sshd_config").write_text(SSHD_CONFIG)

    def _user_home(self, catalog: Path) -> None:
        """The user's HOME: a key the login node accepts, SkyPilot's `~/.slurm/config` naming the login
        node (an SSH-config `Host` block: sky/adaptors/slurm.py), and the catalog (no internet here:
        SkyPilot downloads common/accelerators.csv for a GPU request when it is missing)."""
        ssh = self.home / ".ssh"
        ssh.mkdir(parents=True, mode=0o700)
        key = ssh / "slurm_ed25519"
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "launch-slurm-test", "-f", str(key))
        auth = self.dir / "home" / ".ssh"
        auth.mkdir(mode=0o700)
        shutil.copy(f"{key}.pub", auth / "authorized_keys")
        (self.home / ".slurm").mkdir()
        (self.home / ".slurm" / "config").write_text(
            f"Host {CLUSTER}\n    HostName {self.ip('login')}\n    User root\n    IdentityFile {key}\n"
            "    IdentitiesOnly yes\n    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n")
        shutil.copytree(catalog, self.home / ".sky" / "catalogs" / "v8")

    def _start(self, image: Path) -> None:
        nodes = " ".join(f"{n}:{role}:{self.node_ns(n)}" for n, role, _ in NODES)
        hide = sorted({str(REPO), str(self.scratch)})
        cmd = ["ip", "netns", "exec", self.ns, "unshare", "--mount", "--propagation", "slave", "bash",
               str(HERE / "site.sh"), str(image), str(self.dir), str(image_mod.python310()), nodes, "--", *hide]
        log = open(self.scratch / "site.log", "ab")
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        log.close()
        deadline = time.monotonic() + 60
        while not (self.dir / "ready").exists():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the Slurm site did not start:\n" + (self.scratch / "site.log").read_text()[-3000:])
            time.sleep(0.2)

    def wait_idle(self, nodes: int, timeout: float = 90) -> None:
        """Until `sinfo` on the login node says `nodes` compute nodes are idle."""
        deadline, said = time.monotonic() + timeout, ""
        while time.monotonic() < deadline:
            said = self.on_login("sinfo -h -N -o '%N %t'", check=False)
            if sum(1 for ln in said.splitlines() if ln.split()[-1:] == ["idle"]) >= nodes:
                return
            time.sleep(1)
        logs = "".join(f"\n--- {n}\n" + self.node_log(n)[-1500:] for n, _, _ in NODES)
        raise RuntimeError(f"the Slurm nodes are not idle after {timeout:.0f} s: {said!r}{logs}")

    def node_log(self, name: str) -> str:
        """The node's daemon logs (its /var/log, in its writable layer) and its PID 1's output."""
        out = []
        for p in [self.dir / "nodes" / f"{name}.log", *sorted((self.dir / "nodes" / name / "upper" / "var" / "log").rglob("*.out"))]:
            if p.is_file():
                out.append(f"[{p.name}]\n" + p.read_text(errors="replace"))
        return "\n".join(out)

    def kill_node(self, name: str) -> None:
        """The machine dies: every process of the node SIGKILLed at once (its network goes with its veth)."""
        kill_netns(self.node_ns(name))

    def replace_node(self, name: str) -> None:
        """A new machine in a dead node's place: the same name and address, a fresh disk and /tmp; slurmd
        registers and slurmctld returns it to service (ReturnToService=2)."""
        n = next(i for nm, _, i in NODES if nm == name)
        role = next(r for nm, r, _ in NODES if nm == name)
        shutil.rmtree(self.dir / "nodes" / name)
        self._node_network(name, n)
        (self.dir / "nodes" / f"{name}.start").write_text(f"{name}:{role}:{self.node_ns(name)}")

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait(timeout=30)
        for name in [n for n in self._namespaces() if n != self.ns] + [self.ns]:
            kill_netns(name)

    def _namespaces(self) -> list[str]:
        names = [ln.split()[0] for ln in sh("ip", "netns", "list", check=False).stdout.splitlines() if ln.strip()]
        return [n for n in names if n == self.ns or n.startswith(self.ns + "-")]

    def leftovers(self) -> list[str]:
        """What this site left behind: namespaces, processes in them, mounts of its scratch dir, loops."""
        out = [f"netns {n} ({len(netns_pids(n))} processes)" for n in self._namespaces()]
        mounts = Path("/proc/mounts").read_text()
        out += [f"mount {ln.split()[1]}" for ln in mounts.splitlines() if str(self.scratch) in ln.split()[1]]
        if self._proc is not None and self._proc.poll() is None:
            out.append(f"site pid {self._proc.pid}")
        loops = sh("losetup", "-a", check=False).stdout
        out += [f"loop {ln.split(':')[0]}" for ln in loops.splitlines() if str(self.scratch) in ln]
        return out

    # --- the site's own view -----------------------------------------------------------------------
    def on_login(self, command: str, check: bool = True) -> str:
        """A shell command on the login node, as its admin runs it (nsenter into the node's namespaces)."""
        pid = self._node_pid("login")
        r = subprocess.run(["nsenter", "-t", str(pid), "-m", "-u", "-n", "-p", "-r", "-w", "/usr/bin/env", "-i",
                            "HOME=/root", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                            "LANG=C.UTF-8", "bash", "-c", command], capture_output=True, text=True, timeout=60)
        if check and r.returncode != 0:
            raise RuntimeError(f"on the login node: {command}: exit {r.returncode}: {r.stdout}{r.stderr}")
        return r.stdout

    def _node_pid(self, name: str) -> int:
        """The node's PID 1 as the host sees it: the child of its `unshare --fork` (site.sh's pid file)."""
        leader = (self.dir / "nodes" / f"{name}.pid").read_text().strip()
        children = Path(f"/proc/{leader}/task/{leader}/children")
        kids = children.read_text().split() if children.exists() else []
        if not kids:
            raise RuntimeError(f"node {name} has no running PID 1")
        return int(kids[0])

    # --- the user's side -------------------------------------------------------------------------
    def env(self, extra: dict | None = None) -> dict:
        from tests.walk import fresh_env  # tests/ is on sys.path in pytest

        env = fresh_env(self.scratch, extra)
        env.update({"HOME": str(self.home), "LAUNCH_HOME": str(self.launch_home),
                    # SkyPilot builds a wheel of itself without an index (as on the emulated RunPod)
                    "PIP_NO_BUILD_ISOLATION": "0", "PIP_NO_INDEX": "1"})
        env.pop("PYTHONPATH", None)
        env.update(extra or {})
        return env

    def run(self, *cmd: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
        """A command of the user's, inside the site's network namespace."""
        start = time.monotonic()
        r = subprocess.run(["ip", "netns", "exec", self.ns, *cmd], cwd=REPO, env=self.env(env),
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        name = " ".join([Path(cmd[0]).name, *[a for a in cmd[1:3] if not a.startswith("-")]])
        self.timings.append((name, time.monotonic() - start, r.returncode))
        return r

    def launch(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.run(str(LAUNCH), *args, **kw)

    def sky(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.run(str(LAUNCH.parent / "sky"), *args, **kw)


def slurm_conf(subnet: str) -> str:
    """slurm.conf of a site whose machines are namespaces of one host: no cgroups, no accounting."""
    nodes = "".join(f"NodeName={n} NodeAddr={subnet}.{i} CPUs={NODE_CPUS} RealMemory={NODE_MEM_MB} "
                    f"Gres=gpu:{GPU_TYPE}:8 State=UNKNOWN\n" for n, role, i in NODES if role == "compute")
    return f"""ClusterName={CLUSTER}
SlurmctldHost=login({subnet}.10)
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
SlurmdParameters=config_overrides
GresTypes=gpu
KillWait=5
InactiveLimit=0
MinJobAge=30
SlurmdTimeout=20
{nodes}PartitionName=gpu Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


SSHD_CONFIG = """Port 22
ListenAddress 0.0.0.0
HostKey /etc/ssh/launch_host_ed25519
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AuthorizedKeysFile .ssh/authorized_keys
PidFile /run/sshd.pid
Subsystem sftp /usr/lib/openssh/sftp-server
AcceptEnv LANG LC_*
MaxStartups 100:30:200
MaxSessions 100
"""
