"""What launch touches on the user's machine outside its own place, walked as the user walks it
(tests/walk.py: the installed `launch` in a subprocess, fresh HOME and LAUNCH_HOME, 80 columns).

- The commands that need no cloud (validate, plan, profiles, render, init, data preview) leave the
  user's HOME as they found it: SkyPilot's offline planner keeps everything, `~/.sky/...` paths
  included, under LAUNCH_HOME (launcher/catalog/snapshot.py). `launch up` on a cloud may create
  `~/.sky`: that is SkyPilot's own place, where it keeps its clusters and API server state.
- `launch compare` after a resume reads a run's latest state: its newest fetch only when that fetch is
  from the last attempt, else the machine's numbers (or, machine gone, the older fetch), with one line
  per run saying the fetch is older than the last attempt and how to refresh it.
- A data path outside the project (an absolute `/home/me/data.jsonl`) is refused by validate, plan, up and
  data preview on every backend, local included, in one line naming file:line, key and the fix
  (launcher/profiles/boundary.py says why the local backend follows the same rule).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from walk import REPO, assert_one_line_error, launch


def home_listing(tmp_path: Path) -> list[str]:
    home = tmp_path / "user-home"
    return sorted(str(p.relative_to(home)) for p in home.rglob("*"))


def repo_copy(tmp_path: Path) -> Path:
    """The code and profiles in a scratch repo (`init` writes clusters/NAME.yaml there, not in the
    checkout other tests read); the installed `launch` runs it with PYTHONPATH pointing at it."""
    copy = tmp_path / "repo"
    for d in ("launcher", "payload", "clusters", "sky"):
        shutil.copytree(REPO / d, copy / d, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_commands_that_need_no_cloud_leave_the_users_home_as_it_was(tmp_path):
    copy = repo_copy(tmp_path)
    sample = "data.sources=[{name: s, path: payload/samples/demo_chat.jsonl, format: messages}]"
    walks = [  # the planning commands each with a fresh LAUNCH_HOME: each imports SkyPilot itself
        (("validate", "sonia-h100"), {}),
        (("plan", "sonia-h100"), {"env": {"LAUNCH_HOME": str(tmp_path / "lh-plan")}}),
        (("profiles",), {"env": {"LAUNCH_HOME": str(tmp_path / "lh-profiles")}}),
        (("render", "sonia-h100", "--check"), {"env": {"LAUNCH_HOME": str(tmp_path / "lh-render")}}),
        (("data", "preview", "sonia-h100", "-n", "1", "--set", sample), {}),
        (("init", "my-h100", "--from", "sonia-h100"), {"cwd": copy, "env": {"PYTHONPATH": str(copy)}}),
    ]
    for args, how in walks:
        r = launch(tmp_path, *args, **how)
        assert r.returncode == 0, f"launch {' '.join(args)}: exit {r.returncode}\n{r.stdout}{r.stderr}"
        assert home_listing(tmp_path) == [], f"launch {' '.join(args)} wrote into HOME: {home_listing(tmp_path)}"
    assert (copy / "clusters" / "my-h100.yaml").is_file() and not (REPO / "clusters" / "my-h100.yaml").exists()
    for used in ("lh-plan", "lh-profiles", "lh-render"):  # where SkyPilot's own files went instead
        assert (tmp_path / used / "sky-offline" / ".sky" / "user_hash").is_file()


# ------------------------------------------------------------------------ compare after a resume


def local_run(tmp_path: Path, rid: str, steps: int) -> Path:
    """A stopped local-backend run of local-demo in the walk's registry, its run dir holding `steps`
    metric rows (one every 2 steps), as `launch up` and the payload leave it."""
    from launcher.store import registry
    from launcher.store.registry import Run
    from payload import layout

    volume = tmp_path / "volume"
    rd = layout.run_dir(volume, rid)
    rd.mkdir(parents=True)
    (rd / "config.yaml").write_text((REPO / "sky/config/local-demo.yaml").read_text())
    (rd / layout.STATUS).write_text(json.dumps({"state": "stopped", "exit_code": 0}))
    add_metrics(rd, 0, steps)
    history = [{"at": time.time() - 60, "by": "launch up", "event": "start", "set": []}]
    registry.save(Run(id=rid, profile="local-demo", backend="local", state="stopped", started_at=time.time() - 60,
                      ended_at=time.time(), handle={"volume": str(volume), "history": history}))
    return rd


def add_metrics(rd: Path, after: int, upto: int) -> None:
    with (rd / "metrics.jsonl").open("a") as f:
        for step in range(after + 2, upto + 1, 2):
            f.write(json.dumps({"step": step, "loss": 5.0 - step / 10, "eval_loss": 5.1 - step / 10}) + "\n")


def resumed(rid: str, rd: Path, upto: int) -> None:
    """What `launch up --resume` leaves: a `resume` entry in the run's history, and the run dir trained on."""
    from launcher.store import registry

    run = registry.get(rid)
    entry = {"at": time.time(), "by": "launch up --resume", "event": "resume", "set": []}
    registry.update(rid, handle={"history": [*run.handle.history, entry]})
    steps = max(json.loads(ln)["step"] for ln in (rd / "metrics.jsonl").read_text().splitlines())
    add_metrics(rd, steps, upto)


def compared(tmp_path: Path, a: str, b: str, art: Path, *flags: str):
    """`launch compare A B`: its runs by id (--json), else its text."""
    r = launch(tmp_path, "compare", a, b, "--dest", str(art), *flags)
    assert r.returncode == 0, r.stdout + r.stderr
    return {x["id"]: x for x in json.loads(r.stdout)["runs"]} if flags else r.stdout


def test_compare_after_a_resume_never_shows_the_fetch_from_before_it_as_current(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCH_HOME", str(tmp_path / "user-launch-home"))  # this process writes the walk's registry
    a, b, art = "local-demo-20261126-000010", "local-demo-20261126-000011", tmp_path / "art"
    local_run(tmp_path, a, 8)
    rd = local_run(tmp_path, b, 4)
    for rid in (a, b):
        r = launch(tmp_path, "down", rid, "--fetch-artifacts", "--dest", str(art))
        assert r.returncode == 0, r.stdout + r.stderr
    resumed(b, rd, 12)  # B resumed after its fetch and trained on to step 12

    runs = compared(tmp_path, a, b, art, "--json")  # B's machine still has its run dir: its numbers are current
    assert runs[b]["source"] == "its local machine" and runs[b]["steps"] == 12, runs[b]  # was art/B, 4 steps
    assert runs[a]["source"] == str(art / a) and runs[a]["fetch_note"] is None and runs[a]["steps"] == 8
    out = compared(tmp_path, a, b, art)
    notes = [ln for ln in out.splitlines() if ln.startswith("!")]
    assert len(notes) == 1 and f"{b}: its fetch {art / b} (" in notes[0], out
    assert "is older than its last attempt (resumed " in notes[0] and "numbers are from its local machine" in notes[0]
    assert f"refresh it with `launch down {b} --fetch-artifacts`" in notes[0], out

    rd.rename(rd.with_name("gone"))  # the machine is gone: the older fetch is all there is, labelled
    runs = compared(tmp_path, a, b, art, "--json")
    assert runs[b]["steps"] == 4 and runs[b]["source"] == f"{art / b} (older than its last attempt)", runs[b]
    assert "): these numbers are from that fetch; refresh it with `launch down" in runs[b]["fetch_note"]

    rd.with_name("gone").rename(rd)  # fetched again after the resume: that fetch is current, no note
    r = launch(tmp_path, "down", b, "--fetch-artifacts", "--dest", str(art))
    assert r.returncode == 0, r.stdout + r.stderr
    runs = compared(tmp_path, a, b, art, "--json")
    assert runs[b]["source"] == str(art / b) and runs[b]["steps"] == 12 and runs[b]["fetch_note"] is None


# --------------------------------------------------------------------------- an absolute data path

SONIA_SOURCE = "    - {name: sonia-train, hf_dataset: VocaborSilentii/SoniaTraining, hf_split: train, format: messages, split: train}"


def with_source(tmp_path: Path, profile: str, old: str, path: str) -> tuple[Path, int]:
    """A copy of clusters/PROFILE.yaml whose source line `old` reads its data from `path`; (file, that line)."""
    text = (REPO / "clusters" / f"{profile}.yaml").read_text()
    assert old in text
    new = (f"    - {{name: mine, path: {path}, format: messages, split: train}}" if old == SONIA_SOURCE
           else old.replace("payload/samples/demo_chat.jsonl", path))
    file = tmp_path / f"{profile}-mine.yaml"
    file.write_text(text.replace(old, new))
    return file, text[:text.index(old)].count("\n") + 1


def test_an_absolute_data_path_is_refused_on_every_backend_by_validate_plan_and_up(tmp_path):
    data = tmp_path / "me" / "data.jsonl"  # the user's own file, outside the project
    data.parent.mkdir()
    data.write_text((REPO / "payload/samples/demo_chat.jsonl").read_text())
    fix = ("is outside the project, and a run (on every backend, local included) gets only the project's files: put "
           "the file under data/ in the project and give its path from the project root, e.g. data/data.jsonl, or use a "
           "Hub dataset (`hf_dataset:` instead of `path:`)")
    cloud, line = with_source(tmp_path, "sonia-h100", SONIA_SOURCE, str(data))
    for args in (("validate", str(cloud)), ("plan", str(cloud))):  # plan used to plan it (0 tokens) with a warning
        r = launch(tmp_path, *args)
        assert_one_line_error(r, f"✗ {cloud}:{line}: data.sources.0.path: {data} {fix}")
        assert len((r.stdout + r.stderr).splitlines()) == 1, r.stdout + r.stderr
    local, line = with_source(tmp_path, "local-demo", "      path: payload/samples/demo_chat.jsonl", str(data))
    for args in (("validate", str(local)), ("plan", str(local)), ("up", str(local), "--dry-run"),
                 ("data", "preview", str(local))):  # the local backend reads it where it lies no more
        assert_one_line_error(launch(tmp_path, *args), f"✗ {local}:{line}: data.sources.0.path: {data} {fix}")
    assert not (tmp_path / "user-launch-home" / "runs").exists()
    inner = REPO / "payload/samples/demo_chat.jsonl"  # in the project, spelled absolute: the one edit is named
    local, line = with_source(tmp_path, "local-demo", "      path: payload/samples/demo_chat.jsonl", str(inner))
    assert_one_line_error(launch(tmp_path, "validate", str(local)),
                          f"✗ {local}:{line}: data.sources.0.path: {inner} is an absolute path: a run reads its "
                          "file by its path from the project root, on every backend; write it as "
                          "payload/samples/demo_chat.jsonl")


def test_offline_skypilot_gets_launchs_dir_as_home_and_still_reads_the_users_config(tmp_path, monkeypatch):
    """While SkyPilot runs offline, `~` is launch's runtime dir (its `~/.sky/...` paths land there); the
    user's ~/.sky/config.yaml is named by SKYPILOT_GLOBAL_CONFIG; both are as they were afterwards."""
    from launcher.catalog import snapshot

    home = tmp_path / "user-home"
    (home / ".sky").mkdir(parents=True)
    (home / ".sky" / "config.yaml").write_text("allowed_clouds: [runpod]\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("LAUNCH_HOME", str(tmp_path / "launch-home"))
    monkeypatch.delenv("SKYPILOT_GLOBAL_CONFIG", raising=False)
    with snapshot.offline_home():
        assert Path("~").expanduser() == snapshot.offline_runtime_dir()
        assert os.environ["SKYPILOT_GLOBAL_CONFIG"] == str(home / ".sky" / "config.yaml")
    assert os.environ["HOME"] == str(home) and "SKYPILOT_GLOBAL_CONFIG" not in os.environ
