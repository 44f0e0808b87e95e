"""The emulated-cloud scenarios (`make cloud-test`): each test gets its own EmulatedCloud and reports one
line: scenario, wall time, end state, $ billed (as `launch cost` says, and as the emulator's ledger of
pod lifetimes at catalog prices says), steps trained. The lines are printed at the end of the run."""

from __future__ import annotations

import os
import time

import pytest

from tests.cloud.harness import EmulatedCloud
from tests.cloud.slurm.site import SlurmSite
from tests.host_tools import ensure_rsync

_LINES: list[str] = []


def pytest_collection_modifyitems(config, items):
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="the emulated cloud needs root (network and mount namespaces)")
        for item in items:
            item.add_marker(skip)


@pytest.fixture
def cloud(tmp_path):
    ensure_rsync("SkyPilot's provisioning, on the user's machine")
    with EmulatedCloud(tmp_path) as c:
        yield c
        c.close()
        left = c.leftovers()
    assert not left, f"the emulated cloud left: {left}"


@pytest.fixture
def slurm(tmp_path):
    """The emulated Slurm site (tests/cloud/slurm/site.py): a login node and two GPU nodes."""
    ensure_rsync("SkyPilot's provisioning, on the user's machine")
    with SlurmSite(tmp_path) as site:
        yield site
        site.close()
        left = site.leftovers()
    assert not left, f"the Slurm site left: {left}"


@pytest.fixture
def report(request):
    """report(state=..., usd=..., ledger_usd=..., steps=...): this scenario's line."""
    start = time.monotonic()
    seen: dict = {}

    def _report(**kw):
        seen.update(kw)

    yield _report
    took = time.monotonic() - start
    outcome = "passed" if not getattr(request.node, "_failed", False) else "FAILED"
    usd = seen.get("usd")
    ledger = seen.get("ledger_usd")
    where = seen.get("where") or f"(emulator ${ledger or 0:.4f})"  # a Slurm site has no bill of its own
    _LINES.append(f"{request.node.name:<44} {took / 60:5.1f} min  {seen.get('state', '-'):<12} "
                  f"{'$%.4f' % usd if usd is not None else '-':>9} billed {where}  "
                  f"{seen.get('steps', '-')} steps  [{outcome}]")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    rep = (yield).get_result()
    if rep.failed:
        item._failed = True


def _left_behind() -> list[str]:
    """What this pytest process's clouds left on the host: namespaces `lc<pid>-*`, their /etc/netns
    files, mounts of the scratch dirs, processes in a namespace of ours (none is expected)."""
    import subprocess
    from pathlib import Path

    mine = (f"lc{os.getpid()}-", f"ls{os.getpid()}-")  # the emulated RunPod's, the Slurm site's
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    out = [f"netns {n}" for n in names if n.startswith(mine)]
    etc = Path("/etc/netns")
    out += [f"dir {p}" for p in (etc.iterdir() if etc.is_dir() else []) if p.name.startswith(mine)]
    mounts = Path("/proc/mounts").read_text().splitlines()
    out += [f"mount {m.split()[1]}" for m in mounts if "/launch-cloud-test" in m.split()[1]]
    return out


def pytest_terminal_summary(terminalreporter):
    if _LINES:
        terminalreporter.section("emulated RunPod and Slurm scenarios")
        for line in _LINES:
            terminalreporter.write_line(line)
        left = _left_behind()
        terminalreporter.write_line("left behind on this machine: " + (", ".join(left) if left else
                                    "nothing (no namespace, /etc/netns entry, mount or process of the clouds)"))
