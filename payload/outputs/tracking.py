"""Weights & Biases for a run (runbook 002): project/entity/name/tags from the `wandb:` section,
the Trainer's loss/eval loss/learning rate/epoch/step (transformers' WandbCallback, which reuses
the run started here), plus what only the payload knows: `cost_usd`, the budget fraction and its
warning, GPU utilisation and memory, the generation metrics, and the highest-loss eval samples
(with their images) as a `wandb.Table`.

Whether W&B is on or not: the run's W&B URL and TensorBoard command go into status.json and the
training summary (`links`), and each step window's GPU memory peak and mean utilisation into
metrics.jsonl and status.json (`GpuWindow`; "not measured" on CPU).

Optional everywhere: without WANDB_API_KEY (and without WANDB_MODE=offline) one log line says W&B is
off and nothing else changes. WANDB_MODE=offline writes the run under `{run_dir}/logs/wandb/` for a
later `wandb sync`. `wandb.init` gets 3 tries with backoff (payload/retry.py). The budget warning
is payload/volume/money.py's (log and status.json); here it only goes into the W&B run's summary.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Optional

from payload import layout
from payload.volume.control import Callback
from payload.config.evaluation import wandb_wanted

log = logging.getLogger("payload.tracking")

_RUN = None  # the wandb run this process started (None: off)
TENSORBOARD_DIR = f"{layout.LOGS_DIR}/tensorboard"  # the Trainer's TENSORBOARD_LOGGING_DIR (train/recipe.py)
_SAID_OFF = False


def why_off() -> Optional[str]:
    """None when W&B can log here, else the one line that says why not."""
    mode = os.environ.get("WANDB_MODE", "").lower()
    if mode == "disabled":
        return "W&B off: WANDB_MODE=disabled"
    if mode in ("offline", "dryrun") or os.environ.get("WANDB_API_KEY"):
        return None
    return "W&B off: WANDB_API_KEY is not set (set it at launch, or WANDB_MODE=offline to log locally)"


def report_to(cfg) -> list[str]:
    """The Trainer's `report_to`: the config's list, with wandb added when the section asks for it
    and removed when W&B is off here."""
    names = [n for n in cfg.train.report_to if n != "wandb"]
    if wandb_wanted(cfg) and why_off() is None:
        names.append("wandb")
    return names


def start(cfg, job_type: str = "train"):
    """Start (or resume: same id per run) the run's wandb run; None when off. The training run's
    links (W&B URL, TensorBoard command) go into status.json, where `launch status` shows them."""
    run = _start(cfg, job_type)
    if job_type == "train":
        from payload.volume.observe import write_status

        write_status(cfg.run_dir, **links(cfg))
    return run


def links(cfg) -> dict:
    """Where the run's tracking is: `wandb_url` when a W&B run logs online; with `train.report_to`
    tensorboard, `tensorboard_logdir` (relative to the run directory: the fetched `logs/` keeps it) and
    the `tensorboard` command that opens it on the machine."""
    out = {}
    if _RUN is not None and getattr(_RUN, "url", None):
        out["wandb_url"] = _RUN.url
    if "tensorboard" in cfg.train.report_to:
        logdir = Path(os.environ.get("TENSORBOARD_LOGGING_DIR") or cfg.run_dir / TENSORBOARD_DIR)
        try:
            out["tensorboard_logdir"] = str(logdir.relative_to(cfg.run_dir))
        except ValueError:  # set elsewhere by the user: not under the run, not fetched with it
            out["tensorboard_logdir"] = str(logdir)
        out["tensorboard"] = f"tensorboard --logdir {logdir}"
    return out


def _start(cfg, job_type: str):
    global _RUN, _SAID_OFF
    if _RUN is not None or not wandb_wanted(cfg):
        return _RUN
    why = why_off()
    if why:
        if not _SAID_OFF:
            log.info(why)
            _SAID_OFF = True
        return None
    import wandb

    from payload.retry import with_retries

    w = cfg.wandb
    name = (w.run_name if w and w.run_name else None) or cfg.runtime.run_id
    directory = cfg.run_dir / layout.LOGS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    os.environ["WANDB_PROJECT"] = w.project if w else os.environ.get("WANDB_PROJECT", "launch")
    kwargs = dict(project=w.project if w else None, entity=w.entity if w else None, name=name,
                  tags=list(w.tags) if w else None, group=cfg.name, job_type=job_type,
                  id=run_id_for(cfg, job_type), resume="allow", dir=str(directory),
                  config=cfg.model_dump(mode="json", exclude={"runtime"}))
    _RUN = with_retries("wandb.init", lambda: wandb.init(**kwargs))
    log.info("W&B run %s (project %s%s)", _RUN.id, kwargs["project"] or "launch",
             ", offline" if os.environ.get("WANDB_MODE", "").lower() in ("offline", "dryrun") else "")
    return _RUN


def run_id_for(cfg, job_type: str) -> str:
    """A stable W&B id per run (and job type): a restarted or resumed job logs into the same run."""
    base = re.sub(r"[^A-Za-z0-9_-]", "-", f"{cfg.runtime.run_id}-{job_type}")
    return base[:120]


def active():
    return _RUN


def finish() -> None:
    global _RUN
    if _RUN is not None:
        _RUN.finish()
        _RUN = None


def gpu_stats() -> dict:
    """GPU utilisation (%) and memory (GB) of this process's device; {} without CUDA."""
    try:
        import torch

        if not torch.cuda.is_available():
            return {}
        out = {"gpu/memory_allocated_gb": round(torch.cuda.memory_allocated() / 1e9, 3),
               "gpu/memory_reserved_gb": round(torch.cuda.memory_reserved() / 1e9, 3)}
        try:
            out["gpu/utilization"] = torch.cuda.utilization()
        except Exception:  # noqa: BLE001 - needs pynvml; utilisation is optional
            pass
        return out
    except Exception:  # noqa: BLE001
        return {}


class GpuWindow(Callback):
    """GPU figures of each step window (the steps between two Trainer log lines) into that log line,
    so metrics.jsonl and status.json carry them (payload/volume/observe.py passes `gpu_*` on):
    `gpu_util_mean_pct`, the mean of NVML's utilisation sampled at every step end of the window
    (torch.cuda.utilization, through nvidia-ml-py), and `gpu_peak_memory_gb`, the most torch's
    allocator has reserved on this process's device so far (not reset per window: other readers of
    the process's peak, bench/gpu, rely on it). Without CUDA, or without NVML, the line says
    `gpu_not_measured` and why, never a number."""

    def __init__(self, run_dir: Path):
        self.run_dir, self.samples, self.why = Path(run_dir), [], None
        self.cuda = _cuda()
        if not self.cuda:
            self.why = "no CUDA device"

    def on_step_end(self, args, state, control, **kwargs):
        if self.cuda:
            try:
                import torch

                self.samples.append(float(torch.cuda.utilization()))
            except Exception as e:  # noqa: BLE001 - NVML missing or refused: utilisation not measured
                self.why = f"utilisation not measured ({type(e).__name__}: needs nvidia-ml-py and NVML)"

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs:  # train lines only: eval lines are not a step window
            return
        fields = self.window()
        logs.update(fields)
        if state.is_world_process_zero:
            from payload.volume.observe import write_status

            write_status(self.run_dir, **{k: fields.get(k) for k in GPU_FIELDS})

    def window(self) -> dict:
        out = {}
        if self.cuda:
            import torch

            out["gpu_peak_memory_gb"] = round(torch.cuda.max_memory_reserved() / 1e9, 3)
            if self.samples:
                out["gpu_util_mean_pct"] = round(sum(self.samples) / len(self.samples), 1)
        self.samples = []
        if "gpu_util_mean_pct" not in out:
            out["gpu_not_measured"] = self.why or "no step ended in this window"
        return out


GPU_FIELDS = ("gpu_peak_memory_gb", "gpu_util_mean_pct", "gpu_not_measured")


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


class TrackingCallback(Callback):
    """With every Trainer log line, to W&B when it is on: cost, budget fraction (and the cost
    tracker's budget warning, once it has one, in the run's summary), GPU stats."""

    def __init__(self, tracker, gpu: bool = True):
        self.tracker, self.gpu = tracker, gpu

    def on_log(self, args, state, control, logs=None, **kwargs):
        if _RUN is None or not state.is_world_process_zero:
            return
        frac = self.tracker.fraction()
        row = {"cost_usd": round(self.tracker.usd(), 6), "train/global_step": state.global_step}
        if frac is not None:
            row["budget/fraction"] = round(frac, 4)
        if self.gpu:
            row.update(gpu_stats())
        _RUN.log(row)
        if self.tracker.warning:
            _RUN.summary["budget_warning"] = self.tracker.warning


def log_high_loss(cfg, path: Path) -> int:
    """The high-loss samples file as a `wandb.Table` (loss, image, target, source): rows logged."""
    if _RUN is None or (cfg.wandb is not None and not cfg.wandb.high_loss_table) or not Path(path).is_file():
        return 0
    import wandb

    from payload.outputs.infer import images_of, split_record, text_of

    table = wandb.Table(columns=["loss", "val_index", "image", "prompt", "target", "source"])
    n = 0
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        rec = {"messages": row.get("messages") or []}
        prompt, target = split_record(rec)
        text = " ".join(text_of(m["content"]) for m in prompt)
        table.add_data(row.get("loss"), row.get("val_index"), _image(images_of(prompt)), text, target,
                       row.get("source"))
        n += 1
    _RUN.log({"high_loss_samples": table})
    return n


def log_eval(cfg, split: str, scores: dict, rows: list[dict]) -> None:
    """Final-split scores (summary + a predictions table); starts a run of its own when called
    from a stand-alone `payload eval`."""
    own = _RUN is None
    run = start(cfg, job_type="eval") if own else _RUN
    if run is None:
        return
    import wandb

    table = wandb.Table(columns=["index", "image", "reference", "prediction", *scores])
    for r in rows:
        table.add_data(r["index"], _image(r.get("images") or []), r["reference"], r["prediction"],
                       *[r.get(k) for k in scores])
    run.log({f"{split}/{k}": v for k, v in scores.items() if v is not None} | {f"{split}/predictions": table})
    for k, v in scores.items():
        run.summary[f"{split}/{k}"] = v
    if own:
        finish()


def _image(paths: list[str]):
    import wandb

    return wandb.Image(paths[0]) if paths and Path(paths[0]).is_file() else None
