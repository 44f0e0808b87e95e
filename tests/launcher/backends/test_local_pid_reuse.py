"""The local backend knows its run's processes by what they carry (LAUNCH_RUN_ID, LAUNCH_VOLUME), not by a
pid number: a driver killed without an exit code (SIGKILL, a reboot) leaves its pid free, and on a busy
machine (pid_max 32768 here) another program soon holds it. Such a run is gone (`preempted`), and
`launch down` of it signals nothing of the other program."""

import subprocess

from launcher.backends.local import LocalBackend
from launcher.store.registry import Run


def test_a_reused_pid_is_not_the_run_and_down_leaves_it_alone(tmp_path):
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)  # leads a process group of its own
    try:
        run = Run(id="local-demo-20261126-0000-reuse", profile="local-demo", backend="local", state="running",
                  handle={"pid": other.pid, "pgid": other.pid, "volume": str(tmp_path / "volume")})
        be = LocalBackend()
        be.home(run).mkdir(parents=True)  # the run's local home, without the driver's exit code
        st = be.status(run)
        assert st.state == "preempted" and "--resume" in st.reason
        be.down(run)
        assert other.poll() is None, "launch down signalled another program's process group"
    finally:
        other.kill()
        other.wait()
