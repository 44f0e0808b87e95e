"""Issue 37's items 1, 3, 5, 7, 8, 10 and 11, each where the user met it: the installed `launch` in a
subprocess with a fresh HOME and LAUNCH_HOME, no credentials, stdin not a terminal (tests/walk.py).
Runs the user would have made are written into that LAUNCH_HOME's registry first, as `launch up`
leaves them; nothing here trains or rents."""

from __future__ import annotations

import json
import subprocess

from walk import LAUNCH, REPO, assert_one_line_error, fresh_env, launch

# ------------------------------------------------------------- 3: `up` refuses what `plan` refuses

NO_TOKEN_LEFT = "train.max_seq_length 16 leaves none of the 380 train records a token to train"


def test_up_refuses_what_plan_refuses_on_every_backend_dry_run_included(tmp_path):
    """`plan` refuses a run whose prompts fill max_seq_length; `up` on the local backend, on the ssh
    backend (a billed pod: the host is never dialled) and `up --dry-run` refuse it with the same line,
    before a run id is reserved. Today's `up` started it (`✓ started`, failed after setup)."""
    short = ("--set", "train.max_seq_length=16")
    commands = {
        "plan": ("plan", "local-demo", *short),
        "local": ("up", "local-demo", *short),
        "ssh": ("up", "local-demo", "--backend", "ssh", "--host", "nobody@127.0.0.1:1", *short),
        "dry-run": ("up", "local-demo", "--dry-run", *short),
    }
    env = fresh_env(tmp_path)
    started = {k: subprocess.Popen([str(LAUNCH), *args], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for k, args in commands.items()}  # together: each tokenizes the prompts (~6 s of CPU)
    lines = {}
    for k, proc in started.items():
        out, err = proc.communicate(timeout=300)
        r = subprocess.CompletedProcess(commands[k], proc.returncode, out, err)
        lines[k] = assert_one_line_error(r, NO_TOKEN_LEFT)
        assert "started" not in out and "cannot reach" not in out + err, (k, out, err)
    assert len(set(lines.values())) == 1, lines  # one refusal, word for word
    r = launch(tmp_path, "status", "--all", "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == [], r.stdout  # no run id reserved


def test_up_on_ssh_says_a_plan_over_its_budget_before_dialling_the_host(tmp_path):
    """The over-budget line `up` printed for SkyPilot runs only is said for an ssh run too (a billed
    machine), before anything is uploaded: here the host does not answer, after the line."""
    r = launch(tmp_path, "up", "local-demo", "--backend", "ssh", "--host", "nobody@127.0.0.1:1",
               "--set", "budget.price_per_hour=100", "--set", "budget.max_usd=0.5")
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "Traceback" not in out, out
    over = out.find("is over the budget cap $0.50")
    assert 0 <= over < out.find("cannot reach nobody@127.0.0.1:1"), out


def test_up_dry_run_says_a_plan_over_its_budget_and_starts_nothing(tmp_path):
    """`up --dry-run` said nothing of a plan over its budget cap, which `up` says before it starts."""
    r = launch(tmp_path, "up", "local-demo", "--dry-run", "--set", "budget.price_per_hour=100",
               "--set", "budget.max_usd=0.5")
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "Traceback" not in out, out
    assert "is over the budget cap $0.50" in " ".join(out.split()), out
    r = launch(tmp_path, "status", "--all", "--json")
    assert json.loads(r.stdout) == [], r.stdout  # nothing started, no run id reserved


# ------------------------------------------------------------------- 5: a `~` path is no link out


def test_a_home_path_is_said_to_be_outside_the_repo_not_a_link(tmp_path):
    """`~/x.jsonl` was reported as leading out of the project "through a symbolic link (to <repo>/~/x.jsonl)":
    `~` is expanded before the path is judged, as the boundary rule expands it."""
    (tmp_path / "user-home" / "x.jsonl").parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "user-home" / "x.jsonl").write_text('{"messages": []}\n')
    source = "data.sources=[{name: s, path: ~/x.jsonl, format: messages}]"
    r = launch(tmp_path, "validate", "local-demo", "--set", source)
    line = assert_one_line_error(r, "~/x.jsonl is outside the project", "put the file under data/", "e.g. data/x.jsonl")
    assert "symbolic link" not in line, line
    # a home that holds the repo: the path from the project root is named
    inner = f"~/{REPO.name}/payload/samples/demo_chat.jsonl"
    r = launch(tmp_path, "validate", "local-demo", "--set", f"data.sources=[{{name: s, path: {inner}, format: messages}}]",
               env={"HOME": str(REPO.parent)})
    assert_one_line_error(r, f"{inner} is a path from your home directory", "write it as payload/samples/demo_chat.jsonl")


# ------------------------------------------------------------- 7: a read-only LAUNCH_HOME stays so


def test_launch_home_loses_group_and_other_access_but_never_gains_write(tmp_path):
    """A LAUNCH_HOME the user made read-only (0555) became 0700, writable: only group's and other's
    access is taken (0500); a loose one (0755) still becomes 0700, its registry 0600."""
    for given, kept in ((0o555, 0o500), (0o755, 0o700)):
        home = tmp_path / f"lh-{given:o}"
        home.mkdir(mode=0o700)
        home.chmod(given)
        r = launch(tmp_path, "status", "--all", env={"LAUNCH_HOME": str(home)})
        assert "Traceback" not in r.stdout + r.stderr, r.stderr
        assert home.stat().st_mode & 0o7777 == kept, (oct(given), oct(home.stat().st_mode), r.stdout + r.stderr)
        home.chmod(0o700)
    db = tmp_path / "lh-755" / "runs.db"
    assert db.stat().st_mode & 0o777 == 0o600
    db.chmod(0o444)  # a registry the user froze: read, never made writable again
    launch(tmp_path, "status", "--all", env={"LAUNCH_HOME": str(db.parent)})
    assert db.stat().st_mode & 0o777 == 0o400


# --------------------------------------------------------- 8: a reader that has gone, status 0


def test_output_to_a_closed_pipe_ends_quietly_with_status_0(tmp_path):
    """`launch plan local-demo | head -1` exited 1 (rich's broken-pipe handler; click's exits 1 too), which
    breaks a `set -o pipefail` script. Every command's output goes to a pipe whose reader has already
    gone: status 0, nothing on stderr."""
    import os

    commands = [("--help",), ("plan", "--help"), ("plan", "local-demo"), ("plan", "local-demo", "--json"),
                ("status", "--all"), ("profiles",), ("volumes",)]
    env, started = fresh_env(tmp_path), []
    for args in commands:
        read, write = os.pipe()
        os.close(read)  # the reader is gone before the first byte: every write meets EPIPE
        started.append((args, subprocess.Popen([str(LAUNCH), *args], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                               stdout=write, stderr=subprocess.PIPE, text=True)))
        os.close(write)
    for args, proc in started:
        _, err = proc.communicate(timeout=120)
        assert (proc.returncode, err) == (0, ""), (args, proc.returncode, err)
    shell = subprocess.run(["bash", "-c", f"set -o pipefail; '{LAUNCH}' plan local-demo | head -1"], cwd=REPO,
                           env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert shell.returncode == 0 and shell.stdout.lstrip().startswith("Profile"), shell


# -------------------------------------------------- 10: a W&B-shaped key in either case, anywhere


def test_a_w_and_b_shaped_key_is_refused_in_upper_case_and_inside_a_value(tmp_path):
    """The 40-hex pattern was anchored to the whole value and lower case: `key=<40 hex>` and an
    upper-case key passed. Refused by --env and by a profile's envs:, naming the variable only; a
    sha256 (64 hex) is no W&B key."""
    upper, lower = "A1B2C3D4E5" * 4, "a1b2c3d4e5" * 4
    for value in (upper, f"key={lower}", f"wandb:{upper};x"):
        r = launch(tmp_path, "up", "local-demo", "--dry-run", "--env", f"MY_SETTING={value}")
        line = assert_one_line_error(r, "--env: `MY_SETTING`'s value looks like a W&B API key", "export WANDB_API_KEY")
        assert lower not in line and upper not in line, line
    r = launch(tmp_path, "validate", "local-demo", "--set", f"envs={{MY_SETTING: 'key={upper}'}}")
    assert_one_line_error(r, "`MY_SETTING`'s value looks like a W&B API key")
    r = launch(tmp_path, "validate", "local-demo", "--set", f"envs={{DIGEST: '{'ab' * 32}'}}")
    assert r.returncode == 0, r.stdout + r.stderr


# ------------------------------------------------- 1: volumes beside a local run, no traceback

SITE_FAKE_SKY = '''"""SkyPilot's API server faked at its request edge in the `launch` subprocess (tests/sky_edge.py)."""
import json, os, sys
sys.path[:0] = [os.environ["FAKE_SKY_TESTS"], os.path.dirname(os.environ["FAKE_SKY_TESTS"])]  # tests/, the repo
import pytest, sky, sky.volumes
from sky_edge import FakeSky
mp = pytest.MonkeyPatch()
fake = FakeSky(mp)
for name, owner, full in [("delete", sky.volumes, "volumes.delete"), ("storage_ls", sky, "storage_ls"),
                          ("storage_delete", sky, "storage_delete")]:
    mp.setattr(owner, name, fake._recorder(full))
fake.results.update({"volumes.delete": None, "storage_delete": None, "storage_ls": [],
                     "volumes.ls": json.loads(os.environ["FAKE_SKY_VOLUMES"])})
'''


def test_volumes_and_rm_beside_a_local_run_whose_volume_is_a_path(tmp_path, monkeypatch):
    """A user of a cloud profile and of local-demo: SkyPilot lists a volume, and the registry holds a
    local run whose handle.volume is its directory (a path string). `launch volumes` and `launch
    volumes rm NAME` ended in `AttributeError: 'str' object has no attribute 'get'`."""
    import json

    from launcher.store import registry
    from launcher.store.registry import Run

    monkeypatch.setenv("LAUNCH_HOME", str(tmp_path / "user-launch-home"))
    registry.save(Run(id="local-demo-20261101-000000", profile="local-demo", backend="local", cluster="local",
                      state="completed", price_per_hour=0.1,
                      handle={"kind": "local", "volume": str(tmp_path / "volume"), "run_dir": str(tmp_path)}))
    registry.save(Run(id="sonia-h100-20261101-000000", profile="sonia-h100", backend="skypilot",
                      cluster="sonia-h100-20261101-000000", state="completed", price_per_hour=6.58,
                      handle={"kind": "cluster", "volume": {"name": "sonia-workspace"}}))
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE_FAKE_SKY)
    env = {"PYTHONPATH": str(site), "FAKE_SKY_TESTS": str(REPO / "tests"), "COLUMNS": "120",
           "SKY_RUNTIME_DIR": str(tmp_path / "sky-runtime"), "SKYPILOT_DISABLE_LOCAL_API_SERVER": "1",
           "FAKE_SKY_VOLUMES": json.dumps([{"name": "sonia-workspace", "size": "420", "zone": "US-CA-2"}])}
    r = launch(tmp_path, "volumes", env=env)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("sonia-workspace"))
    assert "sonia-h100-20261101-000000" in row and "local-demo" not in r.stdout, r.stdout
    r = launch(tmp_path, "volumes", "rm", "sonia-workspace", "--yes", env=env)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert r.stdout.startswith("✓ deleted volume sonia-workspace"), r.stdout


# ------------------------------------------------------------------------------- 11: layout


def test_piped_plan_has_no_trailing_spaces_and_its_notes_are_whole_lines(tmp_path):
    """Piped `plan` padded every line with spaces to the width, and its `✗`/`!` notes wrapped at column 0
    (a continuation line with no mark); at $0/h the cap read "= inf h"."""
    r = launch(tmp_path, "plan", "local-demo", "--set", "budget.max_usd=0.0001")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line for line in lines if line != line.rstrip()] == [], r.stdout
    over = [line for line in lines if "over the budget cap" in line]
    assert len(over) == 1 and over[0].startswith("✗ ") and over[0].endswith("shorten the run"), r.stdout
    assert all(line.startswith((" ", "✗", "!", "✓")) for line in lines), r.stdout  # no note's tail at column 0
    free = launch(tmp_path, "plan", "local-demo", "--set", "budget.price_per_hour=0")
    assert "inf h" not in free.stdout and "never reached at $0/h" in " ".join(free.stdout.split()), free.stdout


def test_a_note_on_a_terminal_wraps_under_its_text(tmp_path):
    """On a terminal (80 columns) a long `✗` note is wrapped by launch with a hanging indent."""
    import os
    import pty

    main, child = pty.openpty()
    proc = subprocess.Popen([str(LAUNCH), "plan", "local-demo", "--set", "budget.max_usd=0.0001"], cwd=REPO,
                            env=fresh_env(tmp_path), stdin=subprocess.DEVNULL, stdout=child, stderr=child)
    os.close(child)
    out = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    proc.wait(timeout=120)
    lines = out.decode().replace("\r\n", "\n").splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("✗ planned"))
    note = [lines[at]]  # the note's first line, then each continuation, indented under its text
    for line in lines[at + 1:]:
        if not line.startswith("  ") or line.lstrip().startswith("→"):  # a hint after it is no part of it
            break
        note.append(line)
    assert max(len(line) for line in lines) <= 80 and len(note) > 1, lines[at:at + 3]
    assert " ".join(line.strip() for line in note).endswith("raise budget.max_usd or shorten the run"), note


def test_status_all_keeps_a_state_whole_and_says_when_there_are_no_runs(tmp_path, monkeypatch):
    """`status --all` folded "budget_exha/usted" even at 100 columns, and with no runs printed a header alone."""
    from test_walk_small import local_run

    r = launch(tmp_path, "status", "--all")
    assert r.returncode == 0 and r.stdout.startswith("no runs yet: start one with `launch up PROFILE`"), r.stdout
    monkeypatch.setenv("LAUNCH_HOME", str(tmp_path / "user-launch-home"))
    rid = "local-demo-20261126-000000"
    local_run(tmp_path, rid, "budget_exhausted", {"state": "budget_exhausted", "step": 30, "max_steps": 40,
                                                  "cost_usd": 1.0, "exit_code": 3},
              price_per_hour=0.1, budget_usd=1.0, started_at=1.0, ended_at=2.0)
    for columns in ("80", "100"):
        r = launch(tmp_path, "status", "--all", env={"COLUMNS": columns})
        row = next(line for line in r.stdout.splitlines() if line.startswith(rid))
        assert " budget_exhausted " in f"{row} ", (columns, r.stdout)


def test_a_broken_profile_is_listed_and_its_error_said_whole(tmp_path):
    """`launch profiles` folded a broken profile's error, a path, mid-word over 7 rows of a 16-wide column."""
    from test_walk_edges import repo_copy

    copy = repo_copy(tmp_path)
    (copy / "clusters" / "broken.yaml").write_text("name: broken\ncluster:\n  accelerators: H100:1\n")
    r = launch(tmp_path, "profiles", cwd=copy, env={"PYTHONPATH": str(copy)})
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert any(line.startswith("broken ") and "invalid (below)" in line for line in lines), r.stdout
    error = [line for line in lines if line.startswith("✗ broken: ")]
    assert len(error) == 1 and "clusters/broken.yaml" in error[0] and "launch validate broken" in error[0], r.stdout


def test_a_missing_alpaca_file_is_shown_three_different_example_lines(tmp_path):
    r = launch(tmp_path, "validate", "local-demo", "--set",
               "data.sources=[{name: s, path: data/not-there.jsonl, format: alpaca}]")
    examples = [line.strip() for line in (r.stdout + r.stderr).splitlines() if line.strip().startswith('{"instruction"')]
    assert len(examples) == 3 and len(set(examples)) == 3, r.stdout + r.stderr


def test_eval_of_a_run_stopped_with_a_checkpoint_names_it(tmp_path, monkeypatch):
    """A run stopped with checkpoint-950 kept: eval said it "ended stopped before training saved one"."""
    from test_walk_small import local_run

    monkeypatch.setenv("LAUNCH_HOME", str(tmp_path / "user-launch-home"))
    rid = "local-demo-20261126-000000"
    rd = local_run(tmp_path, rid, "stopped", {"state": "stopped", "step": 950, "exit_code": 5})
    for step, complete in ((900, True), (950, True), (975, False)):
        (rd / "checkpoints" / f"checkpoint-{step}").mkdir(parents=True)
        if complete:
            (rd / "checkpoints" / f"checkpoint-{step}" / "COMPLETE").write_text("{}")
    r = launch(tmp_path, "eval", rid)
    line = assert_one_line_error(r, f"{rid} has no adapter: it ended stopped before training finished",
                                 "(checkpoint-950 is kept)", f"launch up local-demo --resume {rid}")
    assert "saved one" not in line, line
