"""One emulated RunPod cloud for one test: its namespaces, its emulator process, a user who talks to it.

    with EmulatedCloud(tmp_path) as cloud:
        r = cloud.launch("up", "sonia-h100", "--set", ...)     # the installed `launch`, as a user runs it
        cloud.api("GET", "/admin/state")                          # the emulator's own view (pods, ledger)

Layout (nothing outside these, and nothing left after `__exit__`, also when the test fails):
- network namespace `lc<pid>-<n>` (the cloud): the bridge, the emulator, and every command the user
  runs (`launch`, SkyPilot's local API server it starts, `sky`). The host's network is never touched:
  the user's processes can reach the pods and the emulated API, nothing else.
- network namespaces `lc<pid>-<n>-<pod id>`: one per pod (pods.py).
- the emulator process (serve.py) in its own mount namespace: the loop mounts of the image and of the
  pods' disks, and every pod's mounts, exist only there.
- `/etc/netns/<cloud ns>/hosts`: RunPod's S3 endpoints at the emulator's address, seen only by commands
  run in the cloud's namespace.
- a scratch dir: the user's HOME and LAUNCH_HOME, the emulator's state, network-volume directories, the
  throwaway CA of the S3 endpoints.
On exit: SIGTERM to the emulator (it stops its pods), then every process still in one of these
namespaces is SIGKILLed and the namespaces deleted; `leftovers()` says what would remain.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.cloud.emulator import image as image_mod
from tests.cloud.emulator.pods import kill_netns, sh

REPO = Path(__file__).resolve().parents[2]
LAUNCH = Path(sys.executable).parent / "launch"
HOOK = Path(__file__).resolve().parent / "emulator" / "hook"
API_KEY = "emulated-runpod-key"
# RunPod's S3 API key (docs.runpod.io/storage/s3-api: the access key is the user id, the secret `rps_...`)
S3_ACCESS_KEY, S3_SECRET = "user_emulated", "rps_emulated"
_COUNT = itertools.count()


def _stale_namespaces() -> list[str]:
    """`lc<pid>-...` namespaces whose harness process is gone (a run that was killed)."""
    out = []
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith("lc") and "-" in name:
            pid = name[2:].split("-")[0]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                out.append(name)
    return out


def sweep_stale() -> None:
    for name in sorted(_stale_namespaces(), key=len, reverse=True):  # pods before their cloud
        kill_netns(name)
        shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)


class EmulatedCloud:
    def __init__(self, scratch: Path, *, subnet: str = "10.213.0", port: int = 8765):
        self.scratch = Path(scratch)
        self.ns = f"lc{os.getpid()}-{next(_COUNT)}"
        self.subnet, self.port = subnet, port
        self.state = self.scratch / "emulator"
        self.home = self.scratch / "home"
        self.launch_home = self.scratch / "launch-home"
        self.url = ""
        self.ca: Path | None = None
        self.netns_etc = Path("/etc/netns") / self.ns  # this namespace's /etc/hosts (ip-netns(8))
        self._proc: subprocess.Popen | None = None
        self.timings: list[tuple[str, float, int]] = []  # (command, seconds, exit code), for the report
        # The user's `launch` and where they run it: the checkout's by default; a scenario may take an
        # installed one (tests/installed.py) and a project of its own outside the checkout.
        self.tool: Path = LAUNCH
        self.cwd: Path = REPO

    # --- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> "EmulatedCloud":
        sweep_stale()
        image, catalog = image_mod.ensure_image()
        self.catalog = catalog
        try:
            self._start(image, catalog)
            self._user_home(catalog)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self, image: Path, catalog: Path) -> None:
        sh("ip", "netns", "add", self.ns)
        self.state.mkdir(parents=True)
        # the repo and this scratch dir, exactly: a top directory (`/tmp` for a clone in /tmp/x) would
        # hide what the pod needs there (a 1 MB tmpfs over /tmp: SkyPilot's wheel build ran out of space)
        hide = sorted({str(REPO), str(self.scratch)})
        cmd = ["ip", "netns", "exec", self.ns, "unshare", "--mount", "--propagation", "private",
               sys.executable, "-m", "tests.cloud.emulator.serve", "--state", str(self.state), "--image", str(image),
               "--subnet", self.subnet, "--port", str(self.port), "--prefix", self.ns,
               "--py310", str(image_mod.python310()), "--catalog", str(catalog), "--api-key", API_KEY]
        for h in hide:
            cmd += ["--hide", h]
        cmd += ["--s3-tls", str(self._s3_endpoints(catalog)), "--s3-access-key", S3_ACCESS_KEY]
        log = open(self.state / "emulator.log", "ab")
        self._proc = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        log.close()
        deadline = time.monotonic() + 60
        ready = self.state / "ready"
        while not ready.exists():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the emulator did not start:\n" + (self.state / "emulator.log").read_text()[-3000:])
            time.sleep(0.2)
        self.url = ready.read_text().strip()

    def _s3_endpoints(self, catalog: Path) -> Path:
        """RunPod's per-datacenter S3 endpoints (`s3api-<dc>.runpod.io`) at the emulator's address, for
        commands run in the cloud's namespace only (`ip netns exec` binds /etc/netns/NS/hosts over
        /etc/hosts), with a throwaway CA the user's boto3 trusts (AWS_CA_BUNDLE). Returns the TLS dir."""
        from tests.cloud.emulator.runpod_s3 import make_tls
        from tests.cloud.emulator.runpod_wire import Catalog

        names = [f"s3api-{z.lower()}.runpod.io" for z in Catalog(catalog / "runpod" / "vms.csv").zones]
        tls = self.scratch / "tls"
        self.ca = make_tls(tls, names)[0]
        self.netns_etc.mkdir(parents=True, exist_ok=True)
        hosts = Path("/etc/hosts").read_text() + "".join(f"{self.subnet}.1 {n}\n" for n in names)
        (self.netns_etc / "hosts").write_text(hosts)
        return tls

    def _user_home(self, catalog: Path) -> None:
        """A new user's HOME with a RunPod key (`runpod config` writes ~/.runpod/config.toml), and the
        cloud's catalog where SkyPilot would otherwise download it (no internet here)."""
        (self.home / ".runpod").mkdir(parents=True)
        (self.home / ".runpod" / "config.toml").write_text(f'[default]\napi_key = "{API_KEY}"\n')
        shutil.copytree(catalog, self.home / ".sky" / "catalogs" / "v8")

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait(timeout=30)
        pods = [n for n in self._namespaces() if n != self.ns]
        for name in pods + [self.ns]:
            kill_netns(name)
        shutil.rmtree(self.netns_etc, ignore_errors=True)

    def _namespaces(self) -> list[str]:
        names = [ln.split()[0] for ln in sh("ip", "netns", "list", check=False).stdout.splitlines() if ln.strip()]
        return [n for n in names if n == self.ns or n.startswith(self.ns + "-")]

    def leftovers(self) -> list[str]:
        """What this cloud left behind: namespaces, processes in them, mounts of its scratch dir."""
        out = [f"netns {n}" for n in self._namespaces()]
        out += [f"dir {self.netns_etc}"] if self.netns_etc.exists() else []
        mounts = Path("/proc/mounts").read_text()
        out += [f"mount {ln.split()[1]}" for ln in mounts.splitlines() if str(self.scratch) in ln.split()[1]]
        if self._proc is not None and self._proc.poll() is None:
            out.append(f"emulator pid {self._proc.pid}")
        loops = sh("losetup", "-a", check=False).stdout
        out += [f"loop {ln.split(':')[0]}" for ln in loops.splitlines() if str(self.scratch) in ln]
        return out

    # --- the user's side -------------------------------------------------------------------------
    def env(self, extra: dict | None = None) -> dict:
        from tests.walk import fresh_env

        env = fresh_env(self.scratch, extra)
        env.update({"HOME": str(self.home), "LAUNCH_HOME": str(self.launch_home),
                    "PYTHONPATH": str(HOOK), "LAUNCH_EMULATOR_API": self.url,
                    # SkyPilot builds a wheel of itself with `pip wheel` (sky/backends/wheel_utils.py:163),
                    # under build isolation, which downloads setuptools: this user has no index, and the
                    # venv has setuptools (pip's PIP_NO_BUILD_ISOLATION=0 means "no isolation").
                    "PIP_NO_BUILD_ISOLATION": "0", "PIP_NO_INDEX": "1",
                    # the user's RunPod S3 API key, as the README asks of a managed-job user
                    "RUNPOD_S3_ACCESS_KEY": S3_ACCESS_KEY, "RUNPOD_S3_SECRET_KEY": S3_SECRET,
                    **({"AWS_CA_BUNDLE": str(self.ca)} if self.ca else {})})
        env.update(extra or {})
        return env

    def run(self, *cmd: str, env: dict | None = None, timeout: float = 600,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
        """A command of the user's, inside the cloud's network namespace."""
        start = time.monotonic()
        r = subprocess.run(["ip", "netns", "exec", self.ns, *cmd], cwd=cwd or self.cwd, env=self.env(env),
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        name = " ".join([Path(cmd[0]).name, *[a for a in cmd[1:3] if not a.startswith("-")]])
        self.timings.append((name, time.monotonic() - start, r.returncode))
        return r

    def launch(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.run(str(self.tool), *args, **kw)

    def sky(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.run(str(LAUNCH.parent / "sky"), *args, **kw)

    def api(self, method: str, path: str) -> dict:
        """The emulator's admin API (state, preemption), reached inside the cloud's namespace."""
        code = ("import json, sys, urllib.request; r = urllib.request.Request(sys.argv[1], method=sys.argv[2]);"
                "print(urllib.request.urlopen(r, timeout=30).read().decode())")
        r = subprocess.run(["ip", "netns", "exec", self.ns, sys.executable, "-c", code, self.url + path, method],
                           capture_output=True, text=True, timeout=60, check=True)
        return json.loads(r.stdout or "{}")

    def log(self, name: str) -> str:
        p = self.state / "logs" / name
        return p.read_text(errors="replace") if p.exists() else ""
