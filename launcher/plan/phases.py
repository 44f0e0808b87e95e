"""Every phase a cloud run bills for, in hours, each with where its figure comes from.

Phase figures and where they come from (assumptions are called so; measured ones say where):
- provision: RunPod ~4 min, Azure ~8 min, Kubernetes ~3 min per launch (assumption: pod/VM start,
  image pull, SkyPilot runtime setup; not measured here)
- setup: ~2 min (uv install of payload/requirements-gpu.txt, "about a minute" in the rendered `setup`,
  plus preflight); +5 min when DeepSpeed is used (PyPI ships it as an sdist that builds on every fresh
  machine: FIELD-NOTES)
- model download: model size at 108 MB/s (runbook 000: 65 GB in ~10 min over RunPod's network)
- data: 1 min for hub downloads + records at 62,400/s (README, measured: data stage); local records and
  tokens counted by the payload's own pipeline (profiles/data_count.py)
- training: tokens / (effective tokens/s/GPU x GPUs): a low-mid-high range from plan/speed.py (the user's
  own runs first, calibration.py), network between nodes included (throughput.py); plan/cost.py
  adds the range, eval by generation, spot notes, the budget check and what packing would save
- checkpoint saves: size / nodes at 200 MB/s per node (FIELD-NOTES: RunPod volumes 200-400 MB/s)
- merge: 15 min per 65 GB of model (runbook 000); MLX export ~1 min; full weights written at 200 MB/s
- upload (push_to_hub): 54 MB/s (runbook 000: 65 GB in ~20 min)
- idle before autostop: clusters bill `autostop_minutes` after the job before they tear down
- spot: each expected preemption costs provision + setup + reload + half a checkpoint interval
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from launcher.plan import cost as plan_ranges
from launcher.plan.calibration import measured_phases
from launcher.plan.storage import checkpoint_gb, model_gb
from launcher.plan.throughput import decode_steps_per_s, model_size_b
from launcher.profiles.schema import Profile, total_gpus

PROVISION_MIN = {"RunPod": 4.0, "Azure": 8.0, "Kubernetes": 3.0}
SETUP_MIN, DEEPSPEED_BUILD_MIN = 2.0, 5.0
DOWNLOAD_MB_S, UPLOAD_MB_S, WRITE_MB_S = 108.0, 54.0, 200.0
MERGE_MIN_PER_GB = 15.0 / 65.0
DATA_RECORDS_PER_S, DATA_FIXED_MIN = 62400.0, 1.0
LOCAL_OVERHEAD_H = 0.01
DEFAULT_PREEMPTION_HOURS = 6.0  # a spot profile without checkpoints.expected_preemption_hours (assumption)


@dataclass
class Phase:
    name: str
    hours: float
    source: str


def tokens_per_sequence(p: Profile, data) -> float:
    return float(p.train.max_seq_length) if p.train.packing else min(data.tokens_per_record, p.train.max_seq_length)


def phases(p: Profile, cloud: str, data, tokens: float, speed) -> list[Phase]:
    """Every phase a cloud run bills for, in hours, each with its source (module docstring)."""
    c, t, gpus = p.cluster, p.train, total_gpus(p)
    mgb = model_gb(p)
    setup_min = SETUP_MIN + (DEEPSPEED_BUILD_MIN if t.deepspeed else 0.0)
    train_h = tokens / (speed.tokens_per_s_per_gpu * gpus) / 3600 if tokens else 0.0
    out = [Phase("provision", PROVISION_MIN.get(cloud, 5.0) / 60, f"{cloud} start (assumption)"),
           Phase("setup", setup_min / 60, "uv install + preflight" + (" + deepspeed build" if t.deepspeed else "")),
           Phase("model download", mgb * 1e3 / DOWNLOAD_MB_S / 3600,
                 f"{mgb:.0f} GB at {DOWNLOAD_MB_S:g} MB/s (runbook 000); skipped when the volume has it"),
           Phase("data", (DATA_FIXED_MIN * 60 + data.records / DATA_RECORDS_PER_S) / 3600, "hub download + prep"),
           Phase("training", train_h, f"{tokens / 1e6:,.1f}M tokens, {speed.bound}-bound")]
    seq_tokens = t.per_device_batch_size * t.gradient_accumulation_steps * gpus * max(tokens_per_sequence(p, data), 1)
    steps = t.max_steps or math.ceil(tokens / seq_tokens) if tokens else 0
    saves = steps // t.checkpoints.save_steps
    save_h = checkpoint_gb(p) * 1e3 / c.num_nodes / WRITE_MB_S / 3600
    out.append(Phase("checkpoint saves", saves * save_h, f"{saves} x {checkpoint_gb(p):.1f} GB at {WRITE_MB_S:g} MB/s/node"))
    size = model_size_b(p.model.name_or_path, tiny=p.model.tiny is not None)
    ev_h, ev_src = plan_ranges.eval_generation_hours(p, decode_steps_per_s(c.accelerator_name, size), steps,
                                                     data.test_records)
    out.append(Phase("eval by generation", ev_h, ev_src))
    out += _finish_phases(p, mgb)
    mtbf = t.checkpoints.expected_preemption_hours or (DEFAULT_PREEMPTION_HOURS if c.use_spot else None)
    if c.use_spot and mtbf:
        n = train_h / mtbf
        lost_h = (t.checkpoints.save_steps * seq_tokens / (speed.tokens_per_s_per_gpu * gpus)) / 2 / 3600
        each = out[0].hours + out[1].hours + mgb * 1e3 / WRITE_MB_S / 3600 + lost_h
        out.append(Phase("spot recoveries", n * each, f"~{n:.1f} preemptions (one per {mtbf:g} h, "
                         + ("profile)" if t.checkpoints.expected_preemption_hours else "assumed)")))
    elif not c.use_spot:
        out.append(Phase("idle before autostop", c.autostop_minutes / 60, "cluster.autostop_minutes"))
    return [Phase(ph.name, round(ph.hours, 4), ph.source) for ph in out if ph.hours > 0]


def _finish_phases(p: Profile, mgb: float) -> list[Phase]:
    o, out = p.outputs, []
    if p.train.method == "full":
        out.append(Phase("save final weights", mgb * 1e3 / WRITE_MB_S / 3600, f"{mgb:.0f} GB at {WRITE_MB_S:g} MB/s"))
    if o.merge or o.push_to_hub:
        out.append(Phase("merge", mgb * MERGE_MIN_PER_GB / 60, "15 min per 65 GB (runbook 000)"))
    if o.export_mlx:
        out.append(Phase("MLX export", 1 / 60, "adapter only"))
    if o.push_to_hub:
        out.append(Phase("upload", mgb * 1e3 / UPLOAD_MB_S / 3600, f"{mgb:.0f} GB at {UPLOAD_MB_S:g} MB/s (runbook 000)"))
    return out


MEASURED_PHASES = {"data": "data", "eval": "eval by generation", "merge": "merge", "export": "MLX export"}


def measured(p: Profile, steps: list[Phase]) -> list[Phase]:
    """Phases the user's finished runs of the same GPU, method and model measured (calibration.py)."""
    seen = measured_phases(p.cluster.accelerator_name, p.train.method, p.model.name_or_path)
    by_name = {MEASURED_PHASES[k]: v for k, v in seen.items() if k in MEASURED_PHASES}
    return [Phase(ph.name, round(by_name[ph.name] / 3600, 4), "measured in your runs (median)")
            if ph.name in by_name else ph for ph in steps]
