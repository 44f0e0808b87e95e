"""`launch up` reads its profile file from disk once and validates it once (issue 31, "Data should flow
the same way"): the profile is loaded and checked into one value, launcher.profiles.checks's
ResolvedProfile, and that value goes down the path (resume, checks, rehearsal, dry run, render,
provenance, budget gate, the optimizer's child process).

Counted in the `launch` process, for a real local start and its `down`, a dry run, a resume, and a
SkyPilot profile's `up` as far as the faked SDK edge (tests/sky_edge.py): every open of the profile
file for reading (any reader: YAML, a hash, a copy) and every validation of a Profile.
"""

from __future__ import annotations

import builtins
import io
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli import cli
from launcher.profiles.profile import Profile

REPO = Path(__file__).resolve().parents[3]
QUICK = ("--set", "train.max_steps=2", "--set", "train.checkpoints.save_steps=2", "--set", "train.eval_steps=2",
         "--set", "outputs.merge=false", "--set", "outputs.export_mlx=false")


class Counted:
    """Reads of one profile file and validations of a Profile, in this process."""

    def __init__(self, monkeypatch, name: str):
        self.target = os.path.realpath(REPO / "clusters" / f"{name}.yaml")
        self.reads: list[str] = []
        self.validations = 0
        real_open, real_validate = builtins.open, Profile.model_validate.__func__

        def counting_open(file, mode="r", *args, **kwargs):
            if isinstance(file, (str, os.PathLike)) and not any(c in mode for c in "wax+") \
                    and os.path.realpath(file) == self.target:
                self.reads.append(mode)
            return real_open(file, mode, *args, **kwargs)

        def counting_validate(cls, *args, **kwargs):
            if cls is Profile:
                self.validations += 1
            return real_validate(cls, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", counting_open)
        monkeypatch.setattr(io, "open", counting_open)  # pathlib's Path.open / read_text / read_bytes
        monkeypatch.setattr(Profile, "model_validate", classmethod(counting_validate))

    def launch(self, *args: str):
        """`launch ARGS` in this process; (result, reads, validations) of that command alone."""
        self.reads, self.validations = [], 0
        r = CliRunner().invoke(cli, list(args), catch_exceptions=False)
        assert r.exit_code == 0, r.output
        return r, len(self.reads), self.validations


def run_id(output: str) -> str:
    verb = "started " if "started " in output else "resumed "
    return output.split(verb)[1].split()[0]


def test_local_up_dry_run_and_resume_read_and_validate_the_profile_once(monkeypatch):
    counted = Counted(monkeypatch, "local-demo")

    r, reads, validations = counted.launch("up", "local-demo", *QUICK)
    assert (reads, validations) == (1, 1), r.output
    first = run_id(r.output)
    counted.launch("down", first)

    r, reads, validations = counted.launch("up", "local-demo", "--dry-run")
    assert (reads, validations) == (1, 1), r.output

    r, reads, validations = counted.launch("up", "local-demo", "--resume", first)
    assert "resumed" in r.output and (reads, validations) == (1, 1), r.output
    counted.launch("down", first)

    # A rehearsal is a second config: its cuts are computed from the validated profile, then checked.
    r, reads, validations = counted.launch("up", "local-demo", "--rehearse", "--dry-run")
    assert (reads, validations) == (1, 2), r.output


@pytest.mark.slow  # 10 s: launch up through SkyPilot's SDK
def test_skypilot_up_reads_and_validates_the_profile_once(monkeypatch):
    pytest.importorskip("sky")
    try:
        from sky_edge import FakeSky
    except ImportError:
        from tests.sky_edge import FakeSky

    FakeSky(monkeypatch)
    counted = Counted(monkeypatch, "sonia-h100")
    r, reads, validations = counted.launch("up", "sonia-h100")
    assert "started sonia-h100-" in r.output
    assert (reads, validations) == (1, 1), r.output


@pytest.mark.slow  # 9 s: SkyPilot's optimizer in a child
def test_the_optimizers_child_neither_reads_nor_validates_the_profile():
    """`launch up`'s price and budget gate ask SkyPilot's optimizer in a child process
    (launcher/catalog/child.py): it gets the planning task on stdin, opens no profile and never
    imports the profile schema, and answers as before (tests/launcher/backends/test_skypilot_backend.py: $6.58/h)."""
    import json
    import subprocess
    import sys

    from launcher.catalog import child_input
    from launcher.profiles.profile import load_profile

    p = load_profile("sonia-h100")
    watch = ("import runpy, sys\n"
             "sys.addaudithook(lambda event, args: event == 'open' and '/clusters/' in str(args[0]) and "
             "print('opened', args[0], file=sys.stderr))\n"
             "runpy.run_module('launcher.catalog.child', run_name='__main__')\n"
             "print('schema imported' if 'launcher.profiles.profile' in sys.modules else '', file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", watch], input=child_input(p), capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr
    answer = json.loads(done.stdout.splitlines()[-1])
    assert (answer["cloud"], answer["accelerators"], answer["num_nodes"], answer["node_price_per_hour"]) == \
        ("RunPod", "H100-SXM:2", 1, 6.58)


def test_plan_reads_its_profile_once_with_or_without_the_rehearsal(monkeypatch):
    counted = Counted(monkeypatch, "local-demo")
    _, reads, validations = counted.launch("plan", "local-demo", "--json")
    assert (reads, validations) == (1, 1)
    _, reads, validations = counted.launch("plan", "local-demo", "--rehearse", "--json")
    assert (reads, validations) == (1, 2)  # the profile, then with the rehearsal's cuts: one file read
