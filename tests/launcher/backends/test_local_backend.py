"""Run lifecycle on the local backend: the rendered SkyPilot task runs here for real (CPU, gloo).

`launch up` -> SIGKILL of the process group mid-training -> `status` says preempted -> `launch up
--resume` -> the final adapter equals an uninterrupted run's. Also the multi-node script of
qwen3-32b-4x4-a100 (tiny model and data swapped in) as 2 local nodes.
"""

import json
import os
import signal
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.store import registry
from launcher.cli import cli

REPO = Path(__file__).resolve().parents[3]
QUICK = ("--set", "train.max_steps=12", "--set", "train.checkpoints.save_steps=4",
         "--set", "train.eval_steps=4", "--set", "outputs.merge=false", "--set", "outputs.export_mlx=false")


def launch(*args):
    r = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return r


def wait_done(run_id, timeout=240):
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = launch("status", run_id, "--json")
        d = json.loads(r.output)
        if d["state"] not in ("starting", "running"):
            return d
        time.sleep(1)
    raise AssertionError(f"{run_id} did not finish in {timeout}s")


def run_dir(run_id):
    run = registry.get(run_id)
    return Path(run.handle.run_dir)


def adapter_tensors(path):
    from safetensors.torch import load_file

    return load_file(str(path / "outputs" / "adapter" / "adapter_model.safetensors"))


def losses(path):
    rows = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {(r["step"], k): r[k] for r in rows for k in ("loss", "eval_loss") if k in r}


def started_id(result):
    assert result.exit_code == 0, result.output
    return result.output.split("started ")[1].split()[0] if "started " in result.output else \
        result.output.split("resumed ")[1].split()[0]


@pytest.mark.slow  # 53 s: two local runs, one killed and resumed
def test_kill_and_resume_matches_uninterrupted_run():
    import torch

    ref = started_id(launch("up", "local-demo", *QUICK))
    # A second run of the same profile is refused while the first is active.
    again = launch("up", "local-demo", *QUICK)
    assert again.exit_code == 1 and f"already has an active run {ref}" in again.output and "--new" in again.output
    d = wait_done(ref)
    assert d["state"] == "completed" and d["step"] == 12
    assert d["cost_usd"] > 0 and d["price_per_hour"] == pytest.approx(0.10)

    killed = started_id(launch("up", "local-demo", *QUICK, "--new"))
    rd = run_dir(killed)
    deadline = time.time() + 180
    while not any((c / "COMPLETE").exists() for c in (rd / "checkpoints").glob("checkpoint-*")):
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.2)
    os.killpg(registry.get(killed).handle.pgid, signal.SIGKILL)  # a spot machine dying
    # torchrun's worker runs in a session of its own: it must die with its agent, not train on.
    wait_gone(killed)
    d = json.loads(launch("status", killed, "--json").output)
    assert d["state"] == "preempted" and "--resume" in d["reason"]

    resumed = launch("up", "local-demo", *QUICK, "--resume", killed)
    assert resumed.exit_code == 0 and f"resumed {killed}" in resumed.output
    d = wait_done(killed)
    data_log = (Path(registry.get(killed).handle.home) / "run.log").read_text()
    assert d["state"] == "completed", f"{d['state']}: {d.get('reason')}\n--- run.log (end)\n{data_log[-6000:]}"
    assert "cached" in data_log.lower()  # data preparation was not redone
    assert data_log.count("launch: setup on node 0") == 2  # the log goes on across the restart
    assert "took over this run's stale lease" in data_log and "is gone" in data_log

    a, b = adapter_tensors(run_dir(ref)), adapter_tensors(rd)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    assert losses(run_dir(ref)) == losses(rd)

    # down --fetch-artifacts brings a loadable adapter home, verified
    out = launch("down", killed, "--fetch-artifacts", "--dest", str(rd.parent.parent / "artifacts"))
    assert out.exit_code == 0, out.output
    art = rd.parent.parent / "artifacts" / killed
    assert (art / "adapter" / "adapter_model.safetensors").exists() and (art / "MANIFEST.json").exists()
    cost = json.loads(launch("cost", "--json").output)
    assert {r["id"] for r in cost["runs"]} == {ref, killed}
    assert cost["total_usd"] == pytest.approx(sum(r["cost_usd"] for r in cost["runs"]))


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "(gone)"


def wait_gone(run_id, timeout=20):
    from launcher.backends.local import processes_of

    run = registry.get(run_id)
    deadline = time.time() + timeout
    while processes_of(run):
        assert time.time() < deadline, f"processes of {run_id} still alive: {processes_of(run)}"
        time.sleep(0.2)


@pytest.mark.slow  # 19 s: a whole local run to its budget
def test_budget_stop_is_budget_exhausted_end_to_end():
    # $1 a second against $6: the payload stops itself a few seconds into training, saves, exits 3
    # (torchrun turns that into 1; the payload's status.json says 3).
    rid = started_id(launch("up", "local-demo", "--set", "train.max_steps=100000", "--set", "budget.max_usd=6",
                            "--set", "budget.price_per_hour=3600", "--set", "outputs.merge=false"))
    run = registry.get(rid)
    from launcher.backends.local import LocalBackend

    deadline = time.time() + 240
    while LocalBackend()._alive(run):  # no `launch status` meanwhile: it would enforce the budget itself
        assert time.time() < deadline, "the budget never stopped the run"
        time.sleep(0.5)
    d = json.loads(launch("status", rid, "--json").output)
    assert d["state"] == "budget_exhausted" and d["reason"].startswith("budget of $6.00 reached at step"), d
    assert registry.get(rid).state == "budget_exhausted"
    summary = json.loads((run_dir(rid) / "outputs" / "training_summary.json").read_text())
    assert summary["state"] == "budget_exhausted" and summary["exit_code"] == 3
    assert (run_dir(rid) / "checkpoints" / f"checkpoint-{summary['steps']}" / "COMPLETE").is_file()
    assert json.loads(launch("status", rid, "--json").output)["state"] == "budget_exhausted"


@pytest.mark.slow  # 20 s: a run on two local nodes (torchrun)
def test_multi_node_task_runs_as_two_local_nodes(tmp_path, in_repo):
    csv_path = (in_repo / "qa.csv").relative_to(REPO)  # a run reads repo files only (profiles/boundary.py)
    rows = ["prompt,question,response"] + [
        f"You are terse.,What is {i} plus {i}?,{i} plus {i} is {2 * i}." for i in range(60)]
    (REPO / csv_path).write_text("\n".join(rows) + "\n")
    sets = ["--set", "model={name_or_path: tiny-qwen3, kind: causal_lm, attn_implementation: [sdpa, eager], "
                     "tiny: {arch: qwen3, hidden_size: 64, num_layers: 2, vocab_size: 1024}}",
            "--set", f"data.sources=[{{name: qa, path: {csv_path}, format: prompt_response, "
                     "split: {train: 0.9, val: 0.1}}]",
            "--set", "train.deepspeed=null", "--set", "train.max_seq_length=128",
            "--set", "train.max_steps=4", "--set", "train.epochs=1", "--set", "train.effective_batch_size=null",
            "--set", "train.gradient_accumulation_steps=1", "--set", "train.eval_steps=2",
            "--set", "train.checkpoints.save_steps=2", "--set", "train.gradient_checkpointing=false",
            "--set", "train.report_to=[]"]  # TensorBoard (runbook 004) is in the GPU lock, not the dev one
    r = launch("up", "qwen3-32b-4x4-a100", "--backend", "local", "--nodes", "2", *sets)
    rid = started_id(r)
    d = wait_done(rid, timeout=300)
    home = Path(registry.get(rid).handle.home)
    assert d["state"] == "completed", (home / "run.log").read_text()[-3000:]
    assert (home / "node1.log").exists()
    summary = json.loads((run_dir(rid) / "outputs" / "training_summary.json").read_text())
    assert summary["state"] == "completed" and summary["method"] == "full"
    # Node 1 ran the same script and joined the job (the driver records the first non-zero exit).
    assert "launch: run on node 1" in (home / "node1.log").read_text()
    assert (home / "exit_code").read_text().strip() == "0"


def test_the_first_node_that_fails_ends_the_others(tmp_path):
    """SkyPilot's job driver cancels the other nodes when one fails (get_or_fail); the local driver does
    too: a node that dies before the rendezvous does not leave the others waiting there (torchrun's own
    rendezvous timeout is 15 min), and the run's code is the failed node's."""
    import subprocess

    from launcher.backends.local import DRIVER

    home = tmp_path / "run"
    (home / "workdir").mkdir(parents=True)
    (home / "driver.sh").write_text(DRIVER)
    (home / "node.sh").write_text('set -e\nif [ "$SKYPILOT_NODE_RANK" = 1 ]; then echo "node 1 fails"; exit 3; fi\n'
                                  'sleep 45  # node 0: at the rendezvous\necho "node 0 went on"\n')
    subprocess.run(["bash", str(home / "driver.sh")], env={**os.environ, "NUM_NODES": "2"}, timeout=60)
    assert (home / "exit_code").read_text() == "3\n"
    assert (home / "node1.log").read_text() == "node 1 fails\n" and "went on" not in (home / "run.log").read_text()


@pytest.mark.slow  # 11 s: a local run started and stopped
def test_down_stops_every_process_of_the_run(monkeypatch, tmp_path):
    from launcher.backends.local import processes_of

    # joined here, so that the run's provenance (code.diff: this file, when edited) does not hold it
    secret = "_".join(("hf", "local", "secret", "value", "4711"))
    monkeypatch.setenv("HF_TOKEN", secret)
    rid = started_id(launch("up", "local-demo", "--set", "train.max_steps=500", "--set", "outputs.merge=false"))
    deadline = time.time() + 120
    status_json = run_dir(rid) / "status.json"
    while not processes_of(registry.get(rid)) or not status_json.exists() or \
            json.loads(status_json.read_text() or "{}").get("state") != "training":
        assert time.time() < deadline, "training never started"
        time.sleep(0.5)
    r = launch("down", rid)
    assert r.exit_code == 0 and f"{rid} is down (stopped)" in r.output
    left = {pid: _cmdline(pid) for pid in processes_of(registry.get(rid))}
    assert left == {}, f"{left}\n--- down said\n{r.output}"
    assert registry.get(rid).state == "stopped"
    d = json.loads(launch("status", rid, "--json").output)
    assert d["state"] == "stopped" and d["reason"] == "stopped by launch down"
    # Asked through stop_request.json before any signal: the payload saved a final checkpoint and exited 5.
    status = json.loads((run_dir(rid) / "status.json").read_text())
    assert status["state"] == "stopped" and status["exit_code"] == 5 and "saved (final)" in status["reason"]
    assert (run_dir(rid) / status["final_checkpoint"] / "COMPLETE").is_file()
    assert f"final checkpoint {status['final_checkpoint']} saved" in r.output
    # The secret reached the run only through its environment: no file launch or the run wrote has it.
    written = [f for f in (tmp_path / "launch-home").rglob("*") if f.is_file()]
    assert written and not [f for f in written if secret.encode() in f.read_bytes()]
