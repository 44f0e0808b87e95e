"""Every test gets its own HOME and LAUNCH_HOME (run registry, SkyPilot offline runtime dir), so no
test reads or writes the user's ~/.launch or ~/.sky. SkyPilot fixes its runtime dir at import, so
one session-wide SKY_RUNTIME_DIR is set here, before anything imports `sky`."""

import atexit
import gc
import logging
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_SESSION = Path(tempfile.mkdtemp(prefix="launch-tests-"))
atexit.register(shutil.rmtree, _SESSION, ignore_errors=True)  # this process's session folder goes with it
os.environ["SKY_RUNTIME_DIR"] = str(_SESSION / "sky-runtime")
# The temporary files of the processes the suite starts (torchrun's torchelastic_*, W&B's, pip's: ~100 folders a
# run that nothing removed) and of the tests themselves (isolated_state) go to the session folder, not the machine's
# /tmp. pytest's own tmp_path stays where it was: the mkdtemp above has already fixed this process's gettempdir().
SESSION_TMP = _SESSION / "tmp"
SESSION_TMP.mkdir()
os.environ["TMPDIR"] = str(SESSION_TMP)
os.environ["SKYPILOT_DISABLE_USAGE_COLLECTION"] = "1"
os.environ["SKYPILOT_DISABLE_LOCAL_API_SERVER"] = "1"
for _secret in ("HF_TOKEN", "WANDB_API_KEY", "RUNPOD_API_KEY", "LAUNCH_DEBUG"):
    os.environ.pop(_secret, None)
# No network in tests: the payload's preflight skips its Hub/W&B calls (tests/payload/preflight/test_preflight_remote.py
# removes this and fakes those calls).
os.environ["LAUNCH_PREFLIGHT_OFFLINE"] = "1"
# Ctrl-C reaches the processes the tests start, as it does a terminal's foreground job. A shell starts a
# background job (`make test &`, a runner's job without job control) with SIGINT ignored, every child inherits
# that, and Python leaves an ignored SIGINT ignored: the tests that press Ctrl-C on `launch` (logs --follow,
# down --fetch-artifacts) then waited for a process that never heard it (both failed in two `make test`s
# started with `&` side by side; whether a worker still had it ignored hung on the tests it ran before).
# Python's own handler here; the processes it starts begin with the default action.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# One OpenMP thread for torch in every process the suite starts (workers, trainers, gpu-check's children):
# the machine's cores are shared by the test workers and the trainers they start, and OpenMP threads that
# outnumber free cores spin-wait. Measured on 2 cores, a trainer beside another busy one: 13.5 CPU-s with
# torch's default 2 threads, 7.7 with one; gpu-check's smoke test beside a busy core 106 s -> 54 s.
# (The local backend already sets it for its runs; the test sshd sets it for the runs it serves.)
os.environ.setdefault("OMP_NUM_THREADS", "1")
# A worker imports torch, transformers, peft and TRL and keeps ~1,000 test modules' objects: fewer cyclic-GC
# passes over that heap, as the payload's and launch's own processes (payload/__main__.py).
gc.set_threshold(10_000)

# SkyPilot downloads a catalog it does not have (no network here): give the session's runtime dir
# the shipped snapshot, so any test that parses or validates a task works alone and in any order.
from launcher.catalog import install_snapshot  # noqa: E402  (light: imports no SkyPilot)

install_snapshot(Path(os.environ["SKY_RUNTIME_DIR"]))

from launcher.term import ui  # noqa: E402  (light: rich is imported when a console is made)

_UI_CONSOLES = (ui.console, ui.err_console)

from payload.volume.observe import CurrentStream, library_deprecations  # noqa: E402  (the payload's logs, warning filters)


@pytest.fixture(autouse=True)
def isolated_state(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("LAUNCH_HOME", str(tmp_path / "launch-home"))
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(tempfile, "tempdir", str(SESSION_TMP))  # after tmp_path: pytest's base is made by then
    library_deprecations()  # tests call the libraries as a run does (pytest resets filters per test)
    # rich's Console reads COLUMNS once, when it is made, and ui caches it: a console made while a test
    # had COLUMNS=200 set must not print the next test's output (in any order, in any worker).
    for cached in _UI_CONSOLES:
        cached.cache_clear()
    yield
    for cached in _UI_CONSOLES:  # the cached functions themselves, whatever a test patched in their place
        cached.cache_clear()
    # The payload's log handler follows the first caller's choice of stream (the launcher's in-process eval
    # sets stderr, and the payload's own setup keeps it): a process is one or the other, a test worker is
    # both, so the next test's payload starts from no handler, as a process does.
    payload_log = logging.getLogger("payload")
    for handler in [h for h in payload_log.handlers if isinstance(h, CurrentStream)]:
        payload_log.removeHandler(handler)
    # SkyPilot's ux_utils.print_exception_no_traceback sets sys.tracebacklimit = 0 and does not
    # restore it when the body raises; don't let one test's SkyPilot error hide later tracebacks.
    if hasattr(sys, "tracebacklimit"):
        del sys.tracebacklimit


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """A real OpenSSH server on 127.0.0.1 for the module's tests (tests/sshd.py; installed with apt
    where it is missing, else the test is skipped with the reason)."""
    from sshd import SSHServer, ensure_sshd

    ensure_sshd()
    server = SSHServer(tmp_path_factory.mktemp("sshd")).start()
    yield server
    server.stop()


@pytest.fixture
def in_repo():
    """A scratch directory under the repo's data/ (where a user's data lives: a run reads only files in
    the repo, on every backend, launcher/profiles/boundary.py), removed afterwards."""
    import shutil
    import uuid

    data = REPO / "data"
    made_data = not data.exists()
    d = data / f"test-{uuid.uuid4().hex[:8]}"
    d.mkdir(parents=True)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
        if made_data:
            try:
                data.rmdir()
            except OSError:
                pass  # another test's data is there


# `make test-quick` (-m "not slow"): the unit tests, for the inner loop. A test is slow when it runs whole
# programs: a trainer, torchrun, the installed `launch`, an OpenSSH server (its module uses the fixtures of
# train_fixtures, stage_fixtures, walk, installed or sshd, or the test asks for the `sshd` fixture), or it
# says so itself (@pytest.mark.slow, with what it runs and how long it took in the census by duration).
_WHOLE_RUNS = {"train_fixtures", "stage_fixtures", "walk", "installed", "sshd"}


def _runs_whole_programs(module) -> bool:
    for value in vars(module).values():
        name = getattr(value, "__name__", "") if isinstance(value, type(sys)) else getattr(value, "__module__", "")
        if isinstance(name, str) and name.rsplit(".", 1)[-1] in _WHOLE_RUNS:
            return True
    return False


def pytest_collection_modifyitems(config, items):
    seen: dict = {}  # module name -> slow, each module read once
    for item in items:
        module = getattr(item, "module", None)
        if module is None:
            continue
        if module.__name__ not in seen:
            seen[module.__name__] = _runs_whole_programs(module)
        if seen[module.__name__] or "sshd" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
