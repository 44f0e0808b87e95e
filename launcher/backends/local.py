"""Local backend: run the rendered SkyPilot task on this machine, detached.

`launch up local-demo` copies the workdir (as SkyPilot would upload it) into the run's local
directory, maps the volume to `$LAUNCH_HOME/volumes/<profile>`, and starts one process per node
with SkyPilot's environment contract (nodes talk over 127.0.0.1, gloo on CPU). A small driver
script waits for the nodes and records the exit code; a run killed with its process group leaves
no exit code and shows as preempted, and `launch up --resume` continues it from the volume. Logs
(run.log, node<N>.log, driver.log) are appended across restarts; run.log marks where each restart
begins, and `launch logs --follow` starts there (base.RESTART_MARK).

The run owns its processes: the driver starts a process group, and torchrun's workers, which run in
sessions of their own, die with their agent (`payload.__main__.die_with_parent`), so SIGKILL of the
driver's group (a simulated preemption, or `down` escalating) leaves nothing training. `down` also
signals every process whose environment carries the run's LAUNCH_RUN_ID, in case anything escaped.

One idea at ~350 lines: base.Backend's contract on this machine: the class, its driver's start and the
process walk `down` needs (psutil); the scripts it runs are in `sh/`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path
from typing import Optional, TextIO

from payload import layout
from payload.volume.checksums import regular_files

from launcher import trainenv
from ..errors import BackendError
from launcher.store.registry import Run
from launcher.store.state import state_dir
from .base import (Access, Backend, LaunchSpec, RemoteStatus, end_state, log_start, mark_restart, run_end,
                   skipped_note)
from .tasks import load_task, node_env, node_script, workdir_files
from launcher.term.ui import err_console, literal

DRIVER = (Path(__file__).resolve().parent / "sh" / "local_driver.sh").read_text()  # shellcheck reads it there


COPY_BLOCK = 8 << 20
NEVER_STARTED = "launch up was stopped before the run's driver started: nothing of it ran"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalBackend(Backend):
    name = "local"

    def __init__(self, num_nodes: int | None = None):
        self.num_nodes = num_nodes

    # ---------------------------------------------------------------------------------- paths

    @staticmethod
    def home(run: Run) -> Path:
        return state_dir() / "local" / run.id

    @staticmethod
    def volume(run: Run) -> Path:
        return Path(run.handle.volume or state_dir() / "volumes" / run.profile)

    def run_dir(self, run: Run) -> Path:
        return layout.run_dir(self.volume(run), run.id)

    # ------------------------------------------------------------------------------------ up

    def up(self, spec: LaunchSpec) -> Run:
        run, task = spec.run, load_task(spec.task_yaml)
        home = self.home(run)
        volume = self.volume(run)
        num_nodes = self.num_nodes or int(task.get("num_nodes") or 1)
        _check_disk(home.parent)
        (home / "tmp").mkdir(parents=True, exist_ok=True)  # the run's TMPDIR: torchrun's and W&B's temp dirs
        volume.mkdir(parents=True, exist_ok=True)
        _copy_workdir(home / "workdir", spec.profile, spec.config_yaml, (task.get("envs") or {}).get("LAUNCH_CONFIG"))
        overrides = {
            "TMPDIR": str(home / "tmp"), **spec.envs,
            "LAUNCH_LOCAL": "1",
            "LAUNCH_RUN_ID": run.id,
            "LAUNCH_VOLUME": str(volume),
            "LAUNCH_MASTER_PORT": str(free_port()),
            # the task's `python` is the training stack's (this one's, or the env launch builds once)
            "PATH": f"{_train_python().parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(home / "workdir"),
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            "NUM_NODES": str(num_nodes),
            "MPLCONFIGDIR": str(home / "matplotlib"),  # the loss plot's font cache: the run's, not ~/.cache
        }
        task_envs = task.get("envs") or {}
        if task_envs.get("HF_HOME") == f"{task_envs.get('LAUNCH_VOLUME')}/.hf":  # the volume's model cache moves
            overrides["HF_HOME"] = str(volume / ".hf")  # with it (a cloud profile's /workspace/.hf is not this machine's)
        env = node_env(task, overrides, rank=0, ips=["127.0.0.1"] * num_nodes, gpus_per_node=0,
                       task_id=run.id)
        env.pop("SKYPILOT_NODE_RANK")  # the driver sets it per node
        (home / "node.sh").write_text(node_script(task))
        (home / "driver.sh").write_text(DRIVER)
        for stale in ("exit_code", "exit_code.tmp", "stopped"):
            (home / stale).unlink(missing_ok=True)
        mark_restart(home / "run.log")  # before the driver: a follow that starts now finds it
        full_env = {**os.environ, **env, **spec.secrets}  # secrets live in the environment only
        with open(home / "driver.log", "ab") as log:
            proc = subprocess.Popen(["bash", str(home / "driver.sh")], env=full_env, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        run.state = "running"
        run.cluster = "localhost"
        run.handle.update(pid=proc.pid, pgid=proc.pid, home=str(home), volume=str(volume), num_nodes=num_nodes,
                          run_dir=str(layout.run_dir(volume, run.id)))
        return run

    # ---------------------------------------------------------------------------------- logs

    def logs(self, run: Run, follow: bool, out: TextIO, tail: Optional[int] = None) -> int:
        path = self.home(run) / "run.log"
        deadline_missing = time.time() + 10
        while not path.exists():
            if not follow or time.time() > deadline_missing:
                raise BackendError(f"run {run.id} has no log yet at {path}")
            time.sleep(0.2)
        with open(path, "rb") as f:
            offset, skipped = log_start(f, os.fstat(f.fileno()).st_size, follow, tail)
        if skipped:
            out.write(skipped_note(run.id))
        with open(path, "r", errors="replace", newline="") as f:  # `\r` redraws kept as written
            f.seek(offset)  # a line start: the decoder begins clean there
            while True:
                chunk = f.read()
                if chunk:
                    out.write(chunk)
                    out.flush()
                elif not follow or not self._alive(run):
                    rest = f.read()
                    if rest:
                        out.write(rest)
                    break
                else:
                    time.sleep(0.3)
        return 0

    # -------------------------------------------------------------------------------- access

    def access(self, run: Run, command: Optional[str], tty: bool) -> Access:
        """A shell, or `bash -c COMMAND`, in the run's directory on the volume (LAUNCH_RUN_DIR)."""
        rd = self.run_dir(run)
        if not rd.is_dir():
            raise BackendError(f"run {run.id} has no directory yet ({rd}): it has not started")
        argv = [os.environ.get("SHELL") or "bash"] if command is None else ["bash", "-c", command]
        return Access(argv, cwd=str(rd), env={"LAUNCH_RUN_DIR": str(rd), "LAUNCH_RUN_ID": run.id})

    # -------------------------------------------------------------------------------- status

    def _alive(self, run: Run) -> bool:
        pid = run.handle.pid
        if not pid:
            return False
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        # A zombie (our child, not yet reaped) is dead for our purposes.
        import psutil

        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            return False
        except (psutil.Error, OSError):
            return True
        # A driver killed without an exit code (SIGKILL, a reboot) leaves its pid free: another program
        # may hold the number now. The run's own driver carries its LAUNCH_RUN_ID and LAUNCH_VOLUME.
        return _carries(pid, run.id, self.volume(run)) is not False

    def read_run_file(self, run: Run, rel: str) -> Optional[str]:
        try:
            return (self.run_dir(run) / rel).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    def write_run_file(self, run: Run, rel: str, text: str) -> bool:
        target = self.run_dir(run) / rel
        if not target.parent.is_dir():
            return False
        tmp = target.with_name(target.name + ".part")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(target)
        return True

    def status(self, run: Run) -> RemoteStatus:
        reported = layout.read_json(self.run_dir(run) / layout.STATUS)
        code_file = self.home(run) / "exit_code"  # the driver's last word: its pid may be reused after it
        if not code_file.exists() and self._alive(run):
            return RemoteStatus.from_report("running", reported)
        if not run.handle.pid and not code_file.exists():  # `launch up` stopped before it recorded one
            if processes_of(run):  # its driver started all the same: the run's processes carry its id
                return RemoteStatus.from_report("running", reported)
            return RemoteStatus.from_report("failed", reported, NEVER_STARTED)
        try:
            code = int(code_file.read_text().strip() or 1)
        except (OSError, ValueError):
            code = None  # killed before the driver could record one
        asked = (self.home(run) / "stopped").exists() or run.state == "stopped"
        state, reason = end_state(code, reported, asked)
        st = RemoteStatus.from_report(state, reported, reason)
        try:
            marker = code_file.stat().st_mtime
        except OSError:
            marker = None
        st.ended_at = run_end(marker, reported)  # billed until the run ended, not until someone looked
        return st

    # ---------------------------------------------------------------------------------- down

    def down(self, run: Run) -> None:
        """SIGTERM the run (the payload checkpoints and stops), SIGKILL whatever is left after 15 s.
        Once the run has ended (the driver recorded its exit code, or the registry says so) its process
        group is gone and the number may be another program's by now: only processes carrying the
        run's id are signalled then."""
        pgid = run.handle.pgid
        if not pgid and not processes_of(run):  # a `launch up` stopped before its driver, or before its pid
            return
        ended = not run.active or (self.home(run) / "exit_code").exists()
        if self.home(run).is_dir() and not ended:
            (self.home(run) / "stopped").touch()
        # The process group only while its leader is still this run's driver: a pgid whose driver died
        # without an exit code may lead another program's group by now (pid numbers are reused).
        ours = bool(pgid) and not ended and _carries(pgid, run.id, self.volume(run)) is True
        if ours:
            _signal_group(pgid, signal.SIGTERM)
        _signal_run_processes(run.id, self.volume(run), signal.SIGTERM)  # torchrun workers live in their own sessions
        deadline = time.time() + 15
        while time.time() < deadline and ((not ended and self._alive(run)) or run_processes(run.id, self.volume(run))):
            time.sleep(0.2)
        if ours:
            _signal_group(pgid, signal.SIGKILL)
        _signal_run_processes(run.id, self.volume(run), signal.SIGKILL)
        # SIGKILL lands when a process leaves the kernel (a checkpoint's fsync on a busy disk): `down`
        # returns once nothing of the run runs, not when the signals are sent
        deadline = time.time() + 30
        while time.time() < deadline and run_processes(run.id, self.volume(run)):
            time.sleep(0.1)

    # --------------------------------------------------------------------------------- fetch

    def list_files(self, run: Run, roots: tuple[str, ...]) -> dict[str, int]:
        root = self.run_dir(run)
        real = root.resolve()
        found: dict[str, int] = {}
        for rel in roots:
            top = root / rel
            if top.exists() and top.resolve().is_relative_to(real):  # not through a symlinked parent
                found.update({r: p.lstat().st_size for r, p in regular_files(root, rel).items()})
        return found

    def copy_files(self, run: Run, rels: list[str], into: Path) -> None:
        """Plain copies that never follow a symlink out of the run directory (O_NOFOLLOW, and every
        parent resolved inside it)."""
        root = self.run_dir(run)
        real = root.resolve()
        for rel in rels:
            src = root / rel
            if not src.parent.resolve().is_relative_to(real):
                continue  # through a symlinked directory: not the run's file
            try:
                fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
            except (FileNotFoundError, OSError):  # vanished, or a symlink (ELOOP): verification says so
                continue
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    continue
                target = into / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "ab") as out:  # what an earlier, cut-off fetch left goes on (store/artifacts)
                    f.seek(out.tell())
                    shutil.copyfileobj(f, out, COPY_BLOCK)


def _signal_group(pgid: int, sig) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _carries(pid: int, run_id: str, volume: Optional[Path]) -> Optional[bool]:
    """Whether process `pid` carries this run's LAUNCH_RUN_ID and (given) LAUNCH_VOLUME in its
    environment, as it was started (psutil: /proc/PID/environ on Linux, the process's arguments area
    on macOS). None: the system cannot say."""
    import psutil

    try:
        env = psutil.Process(pid).environ()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False  # gone (a zombie too), or another user's process: not this run's
    except (psutil.Error, OSError):
        return None
    return env.get("LAUNCH_RUN_ID") == run_id and (volume is None or env.get("LAUNCH_VOLUME") == str(volume))


def run_processes(run_id: str, volume: Optional[Path] = None) -> list[int]:
    """Pids of this user's processes whose environment carries LAUNCH_RUN_ID=<run_id> and, given a
    volume, LAUNCH_VOLUME=<volume>: run ids are unique within one state dir, not across users or
    LAUNCH_HOMEs (two test sessions, two users), so a stop never reaches another home's run."""
    import psutil

    return [p for p in psutil.pids() if p != os.getpid() and _carries(p, run_id, volume)]


def processes_of(run: Run) -> list[int]:
    """Pids of this local run's processes: its id within its own volume (another LAUNCH_HOME's run
    may carry the same id: ids are made of the second a run started)."""
    return run_processes(run.id, LocalBackend.volume(run))


def _signal_run_processes(run_id: str, volume: Path, sig) -> None:
    for pid in run_processes(run_id, volume):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _copy_workdir(dest: Path, profile, config_yaml: Path, config_rel: str | None) -> None:
    """What SkyPilot uploads as the workdir (the upload allowlist)."""
    for rel, src in workdir_files(profile, config_yaml, config_rel or f"sky/config/{config_yaml.name}").items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def _check_disk(path: Path, need_mb: int = 200) -> None:
    path.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path).free // 2**20
    if free < need_mb:
        raise BackendError(f"only {free} MB free under {path}; the local run needs ~{need_mb} MB: "
                           "free some space or point LAUNCH_HOME elsewhere")


def _train_python() -> Path:
    """The Python the run's stages use (launcher/trainenv.py), told on the terminal when it is built."""
    return trainenv.python(say=lambda line: err_console().print(literal("  ", line), soft_wrap=True))
