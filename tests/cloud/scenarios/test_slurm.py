"""qwen3-32b-4x4-a100 (runbook 004) on a real Slurm cluster made of namespaces (tests/cloud/slurm/site.py),
as its user runs it: `launch up --set cluster.infra=slurm/hpc`, status, logs, `launch down
--fetch-artifacts`. The real SkyPilot (client, local API server, its Slurm provisioner: one sbatch job
over both nodes, `srun --overlap` for every command) and the real Slurm (slurmctld, two slurmd, munge)
do every step; the payload trains a tiny Qwen3 on CPU, one torchrun job over both nodes (8 ranks each,
the 8 GRES GPUs SkyPilot scheduled per node, gloo)."""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.cloud.emulator import image as image_mod
from tests.cloud.scenarios import profiles
from tests.cloud.scenarios.steps import cluster_of, status, up, wait_ended, wait_for, wait_step

PROFILE = "qwen3-32b-4x4-a100"
PRICE = profiles.QWEN_PRICE


def shared_env(site) -> None:
    """The payload's GPU environment, built once on the shared filesystem where payload/gpu_env.sh looks
    for it ($LAUNCH_VOLUME/.envs/py3.11-<key>): the site has no package index, so its admin put the baked
    CPU build there (the nodes' image holds it at /opt/launch-payload-env)."""
    envs = site.shared / "launch" / ".envs"
    envs.mkdir(parents=True)
    (envs / f"py3.11-{image_mod.env_key()}").symlink_to("/opt/launch-payload-env")


def squeue(site) -> list[str]:
    return site.on_login("squeue -h -o '%i %T %D %N %b'").split("\n")[:-1]


@pytest.mark.timeout(1500)
def test_runbook_004_on_two_slurm_nodes_up_status_logs_down_fetch(slurm, in_repo, report, tmp_path):
    shared_env(slurm)
    steps, save = 30, 10
    started = time.time()
    run = up(slurm, PROFILE, *profiles.qwen3_32b(in_repo, max_steps=steps, save_steps=save))

    # One Slurm job holds both nodes, 8 GPUs (GRES) each.
    (job,) = squeue(slurm)
    assert " RUNNING 2 node[1-2] " in f"{job} " and "gpu:nvidia_a100_sxm4_80gb:8" in job, job

    st = wait_step(slurm, run, 5, timeout=900)
    assert st["state"] == "running" and st.get("loss") is not None, st
    assert st["price_per_hour"] == pytest.approx(PRICE), st  # both nodes, 16 GPUs at the profile's rate
    assert st["cost_usd"] > 0, st

    done = wait_ended(slurm, run, 900, what="the run to complete")
    assert done["state"] == "completed" and done["step"] == steps, done

    logs = slurm.launch("logs", run, timeout=300)
    assert logs.returncode == 0, logs.stdout + logs.stderr
    ranks = set(re.findall(r"\(\w+, rank=(\d), pid=\d+", logs.stdout))  # SkyPilot's prefix of each node's lines
    assert ranks == {"0", "1"}, logs.stdout[-4000:]

    down = slurm.launch("down", run, "--fetch-artifacts", "--dest", str(tmp_path / "artifacts"), timeout=900)
    out = down.stdout + down.stderr
    assert down.returncode == 0 and "verified" in out, out
    model = sorted((tmp_path / "artifacts" / run).rglob("model*.safetensors"))
    assert model, sorted(str(p) for p in (tmp_path / "artifacts").rglob("*"))[:40]
    assert not squeue(slurm), "the Slurm job outlived `launch down`"
    # the run's checkpoints stay on the shared filesystem; nothing of the run on the nodes' disks
    assert (slurm.shared / "launch" / "runs" / run / "checkpoints").is_dir()

    cost = json.loads(slurm.launch("cost", "--json", timeout=180).stdout)
    usd = cost["total_usd"]
    wall = time.time() - started
    print("\n".join(f"  {c:<40} {t:6.1f} s  exit {rc}" for c, t, rc in slurm.timings))
    print("  what `launch down --fetch-artifacts` said:\n" + "\n".join("    " + ln for ln in out.splitlines()))
    print(f"  launch billed ${usd:.4f} at ${PRICE}/h for 2 nodes; {wall:.0f} s from `up` to the end of `down`")
    assert usd <= PRICE * wall / 3600 + 0.01, (usd, wall)
    report(state=status(slurm, run)["state"], usd=usd, where="(slurm, 2 nodes x A100-80GB:8)", steps=done["step"])


@pytest.mark.timeout(1200)
def test_down_mid_training_on_slurm_saves_cancels_and_leaves_only_the_shared_checkpoints(slurm, in_repo, report):
    shared_env(slurm)
    # No periodic save before `down` (save_steps past the run's steps): a checkpoint is down's final save.
    run = up(slurm, PROFILE, *profiles.qwen3_32b(in_repo, max_steps=100000, save_steps=50000))
    wait_step(slurm, run, 5, timeout=900)
    down = slurm.launch("down", run, timeout=900)
    out = down.stdout + down.stderr
    assert down.returncode == 0, out
    # the cluster is gone: launch reads the run's own status.json on /shared through the login node
    after = status(slurm, run)
    assert after["state"] == "stopped" and after["step"] >= 5, json.dumps(after)
    saved = sorted(p.name for p in (slurm.shared / "launch" / "runs" / run / "checkpoints").glob("checkpoint-*"))
    assert saved == [f"checkpoint-{after['step']}"], (saved, after["step"])  # down's final save, at its step
    ckpt = slurm.shared / "launch" / "runs" / run / "checkpoints" / saved[0]
    assert (ckpt / "COMPLETE").exists(), sorted(p.name for p in ckpt.iterdir())

    assert not squeue(slurm), "the Slurm job outlived `launch down`"
    # SkyPilot's runtime dir in each node's /tmp and the cluster's home in the shared home are gone (its
    # job's EXIT trap, sky/provision/slurm/instance.py:1256-1287). Left in the nodes' /tmp: SkyPilot's own
    # sky_app_*/sky_setup_* files, and torch's torchelastic_*/torchinductor_* (no TMPDIR of the run's there)
    cluster = cluster_of(run)
    left = [str(p) for n in ("node1", "node2") for p in (slurm.dir / "nodes" / n / "tmp").glob(f"{cluster}*")]
    left += [str(p) for p in (slurm.dir / "home" / ".sky_clusters").glob(f"{cluster}*")]
    assert not left, left
    usd = json.loads(slurm.launch("cost", "--json", timeout=180).stdout)["total_usd"]
    print("  what `launch down` said:\n" + "\n".join("    " + ln for ln in out.splitlines()))
    report(state=after["state"], usd=usd, where="(slurm, 2 nodes x A100-80GB:8)", steps=after.get("step"))


def _losses(metrics) -> dict[int, float]:
    """{step: training loss} of a run's metrics.jsonl (the payload's, one line per logged step)."""
    out = {}
    for line in metrics.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:  # the last line, cut off with its node
            break
        if rec.get("loss") is not None and rec.get("split") is None:
            out[int(rec["step"])] = float(rec["loss"])
    return out


def _newest_complete(ckpts) -> int:
    return max((int(p.name.split("-")[1]) for p in ckpts.glob("checkpoint-*") if (p / "COMPLETE").exists()), default=0)


GAP_S = 40  # between the run's end with its node and the user's resume: a billed gap would be >= 20 s over


@pytest.mark.timeout(1800)
def test_a_node_lost_mid_training_on_slurm_resumes_from_the_newest_checkpoint(slurm, in_repo, report):
    shared_env(slurm)
    steps, save = 40, 10  # node2 is lost at step 23; the resume trains 20 steps more to the end
    args = profiles.qwen3_32b(in_repo, max_steps=steps, save_steps=save)
    started = time.monotonic()
    run = up(slurm, PROFILE, *args)
    ckpts = slurm.shared / "launch" / "runs" / run / "checkpoints"
    wait_for(lambda: _newest_complete(ckpts) >= 2 * save, 900, every=0.5, what=f"checkpoint-{2 * save}",
             cloud=slurm, run=run)

    # a few steps past it, so that they run twice: before the loss and after the resume (compared below)
    wait_for(lambda: json.loads((ckpts.parent / "status.json").read_text()).get("step", 0) >= 2 * save + 3, 600,
             every=0.5, what=f"step {2 * save + 3}", cloud=slurm, run=run)
    # node2 dies as a machine does, mid-training: every process at once, its network with it. The run's
    # state is read just before (after, node1's rank may already have failed on the reset connection).
    lost = json.loads((ckpts.parent / "status.json").read_text())
    assert lost["state"] == "training" and lost["step"] < steps, lost
    slurm.kill_node("node2")
    # Slurm fails the job with its node (SkyPilot submits it --no-requeue); launch says the run ended
    ended = wait_ended(slurm, run, 600, what="the run to end with its node")
    assert ended["state"] in ("failed", "stopped"), ended
    wait_for(lambda: not squeue(slurm), 120, what="the Slurm job to go")
    ended_seen = time.monotonic()
    newest = _newest_complete(ckpts)
    first = _losses(ckpts.parent / "metrics.jsonl")  # the uninterrupted run, up to the node's loss

    # the site puts a new machine in node2's place; the user resumes the run
    slurm.replace_node("node2")
    slurm.wait_idle(2)
    # the user comes back a while later: long enough that a billed gap would show in the bill below
    time.sleep(max(0.0, GAP_S - (time.monotonic() - ended_seen)))
    gap = time.monotonic() - ended_seen  # nothing of the run is up: no bill (and at least this long)
    again = slurm.launch("up", PROFILE, "--resume", run, *args, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    done = wait_ended(slurm, run, 900, what="the resumed run to complete")
    assert done["state"] == "completed" and done["step"] == steps, done
    logs = slurm.launch("logs", run, timeout=300).stdout
    resumed = re.findall(r"resum\w* .*?checkpoint-(\d+)", logs)
    assert resumed and int(resumed[-1]) == newest, (newest, logs[-4000:])
    down = slurm.launch("down", run, timeout=600)
    assert down.returncode == 0, down.stdout + down.stderr
    wall = time.monotonic() - started
    # The steps after the checkpoint ran twice: before the loss, as an uninterrupted run does, and again
    # after the resume. The same losses there mean the resumed run is the uninterrupted one (same data
    # order, RNG state and weights from the checkpoint), so its result is that run's result.
    second = _losses(ckpts.parent / "metrics.jsonl")
    replayed = sorted(set(first) & set(second) - set(range(newest + 1)))
    assert replayed, (newest, sorted(first), sorted(second))
    worst = max(abs(first[k] - second[k]) for k in replayed)
    assert worst <= 1e-4 * max(abs(first[k]) for k in replayed), {k: (first[k], second[k]) for k in replayed}
    cost = json.loads(slurm.launch("cost", "--json", timeout=180).stdout)
    usd, [row] = cost["total_usd"], cost["runs"]
    # billed: the two jobs, not the time between them (the node down, replaced, the user's resume)
    # (the rest of the unbilled time, ~10 s, is before the first record and after the job's end)
    assert row["billed_s"] <= wall - gap + 20, (row, wall, gap)
    print(f"  node2 lost at step {lost['step']}; resumed from checkpoint-{newest} (at most one interval, "
          f"{save} steps, lost); steps {replayed[0]}-{replayed[-1]} replayed, losses within {worst:.1e} of "
          f"the uninterrupted run's; billed {row['billed_s']:.0f} s of {wall:.0f} s (the {gap:.0f} s between "
          f"the jobs not billed): ${usd:.4f}")
    report(state=done["state"], usd=usd, where="(slurm, node lost, resumed)", steps=done["step"])
