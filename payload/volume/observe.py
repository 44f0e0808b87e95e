"""What a run shows while and after it trains.

One idea at ~390 lines: what a run shows of itself while and after it trains: console lines,
status.json, metrics.jsonl, the loss plot, the high-loss samples, the summary, a crash's traceback. The
callback writes them and the launcher reads them; they share one module's names.

- `metrics.jsonl`: one line per Trainer log (train: step, loss, lr, grad_norm, tokens/s, real-token
  fraction, cost_usd, epoch; eval: step, eval_loss). Lines past the resumed step are dropped on
  resume, so the file reads like one uninterrupted run.
- console progress lines through the `payload.train.recipe` logger,
- `status.json` (layout.STATUS, written atomically) for `launch status`; every end of a stage
  records `state` (errors.END_STATES), `exit_code` and a one-line `reason` there (`write_end`),
  because torchrun exits 1 whatever its workers did,
- after training: the loss-curve PNG, the N highest-loss eval samples, `training_summary.json`,
- on a crash: `logs/rank_<N>_traceback.log` (one file per rank, runbook 000; appended across restarts).
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from payload import layout
from payload.volume.control import Callback

log = logging.getLogger("payload.train")

TRAIN_KEYS = ("loss", "grad_norm", "learning_rate", "epoch", "real_token_fraction", "num_tokens",
              "mean_token_accuracy")


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


class CurrentStream(logging.StreamHandler):
    """Writes to whatever `sys.stdout` (or `sys.stderr`) is when a record is emitted: a handler set up
    once never keeps a stream that was replaced and closed since (the launcher's in-process `eval`,
    tests)."""

    def __init__(self, name: str = "stdout"):
        self.to = name
        super().__init__()

    @property
    def stream(self):
        return getattr(sys, self.to)

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler assigns one; the current one is looked up instead
        pass


def stacks_on_usr1() -> None:
    """`kill -USR1 PID` writes every thread's stack to the log, and the stage goes on.

    A trainer that hangs (a collective that never completes, a lock in a library) shows nothing in its
    log and bills until someone looks; its stacks say where it waits. On the run's machine (`launch
    exec RUN -- bash`; a local run's is this one), `pgrep -af 'm payload'` lists the pids: each
    `python -m payload STAGE` and torchrun's agent (`python -m payload.train.torchrun`) takes `kill -USR1
    PID`. Not `pkill -f`: the job's own shell holds the same words and would end."""
    if not hasattr(signal, "SIGUSR1"):
        return
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    except (AttributeError, ValueError, OSError):  # stderr is no file (a stage called from Python): no log
        pass


def setup_logging(to: Optional[str] = None) -> None:
    """`payload.*` loggers to stdout (`to="stderr"`: the launcher, whose stdout may carry --json), one
    line per record, rank-prefixed on ranks > 0."""
    logger = logging.getLogger("payload")
    for h in logger.handlers:
        if isinstance(h, CurrentStream):
            h.to = to or h.to
            return
    handler = CurrentStream(to or "stdout")
    prefix = f"[rank {rank()}] " if rank() else ""
    handler.setFormatter(logging.Formatter(f"{prefix}%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if rank() == 0 else logging.WARNING)  # progress lines from rank 0 only
    logger.propagate = False
    library_deprecations()


def library_deprecations() -> None:
    """Ignore the deprecation warnings a library raises by reading a name our code never uses, each
    by its exact message and category (a run's log should carry what the run can act on)."""
    import warnings

    # peft 0.21.2 (PeftModel.__init__, so get_peft_model and PeftModel.from_pretrained) and trl 1.16.0
    # (trl/models/utils.py) read `model.is_gradient_checkpointing`, which transformers 5.23 deprecated
    # for `is_activation_checkpointing`; our code sets `activation_checkpointing` (train/recipe.py).
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)


def quiet_libraries() -> None:
    """Progress bars off (logs are read from files); our own progress line replaces them."""
    import datasets
    from transformers.utils import logging as hf_logging

    datasets.disable_progress_bars()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_warning()


def quiet_trainer(trainer) -> None:
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)  # prints every log dict; ObserveCallback prints a line
    trainer.remove_callback(ProgressCallback)


# ------------------------------------------------------------------------------------------ status


def atomic_write_json(path: Path, data: dict) -> None:
    """Write JSON to a temp file and rename it into place (readers never see half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


STAGE_METRICS = ("reward", "rewards/", "kl", "completions/mean_length", "logps/", "logits/")
# Set by payload.train.stages while a stage trains: (stage dir, fn(fields) -> fields). A stage's status goes
# to the run's one status.json, with `stage` (name, kind, index, of) added by fn.
_STAGE_STATUS: dict = {}


def status_of_stage(stage_dir: Optional[Path], run_dir: Optional[Path] = None, fn=None) -> None:
    """Route status writes for `stage_dir` to `run_dir`'s status.json through `fn` (None: stop)."""
    _STAGE_STATUS.clear()
    if stage_dir is not None:
        _STAGE_STATUS[str(stage_dir)] = (Path(run_dir), fn)


def write_status(run_dir: Path, **fields) -> dict:
    """Merge `fields` into status.json (rank 0 only) and stamp `updated_at`."""
    if rank() != 0:
        return {}
    routed = _STAGE_STATUS.get(str(run_dir))
    if routed is not None:
        run_dir, fields = routed[0], routed[1](fields)
    path = Path(run_dir) / layout.STATUS
    try:
        status = json.loads(path.read_text())
    except (OSError, ValueError):
        status = {}
    status.update({k: v for k, v in fields.items()})
    status["updated_at"] = now_iso()
    atomic_write_json(path, status)
    return status


def write_end(run_dir: Path, exit_code: int, reason: Optional[str], **fields) -> dict:
    """Record how a stage ended: `state` from the exit code, the code itself and one line why."""
    from payload.errors import state_for_exit

    return write_status(run_dir, state=state_for_exit(exit_code), exit_code=exit_code, reason=reason,
                        ended_at=now_iso(), **fields)


def read_metrics(path: Path) -> list[dict]:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:  # a line cut off by a kill
            break
    return out


def truncate_metrics(path: Path, last_step: int) -> int:
    """Keep the records up to `last_step` (the resumed checkpoint); returns how many were dropped."""
    path = Path(path)
    if rank() != 0 or not path.exists():
        return 0
    records = read_metrics(path)
    keep = [r for r in records if r.get("step", 0) <= last_step]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
    os.replace(tmp, path)
    return len(records) - len(keep)


def _fmt_eta(seconds: Optional[float]) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class ObserveCallback(Callback):
    """metrics.jsonl + console + status.json on every Trainer log."""

    def __init__(self, run_dir: Path, tracker, max_steps: int):
        self.run_dir = Path(run_dir)
        self.metrics = self.run_dir / layout.METRICS
        self.tracker = tracker
        self.max_steps = max_steps
        self.t0 = time.monotonic()
        self.start_step = 0
        self.last_tokens: Optional[tuple[float, float]] = None  # (num_tokens, time)
        self.tokens_per_s: list[float] = []
        self.last: dict = {}

    def on_train_begin(self, args, state, control, **kwargs):
        self.t0, self.start_step = time.monotonic(), state.global_step
        self.last_tokens = (0.0, self.t0)
        write_status(self.run_dir, state="training", step=state.global_step, max_steps=state.max_steps)

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "loss" not in logs and "eval_loss" not in logs and not any(k in logs for k in GEN_KEYS):
            return
        rec = self._record(state, logs)
        if rank() == 0:
            with open(self.metrics, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
        self.last.update({k: v for k, v in rec.items() if v is not None})
        eta = self.tracker.eta_s(state.global_step, state.max_steps, state.global_step - self.start_step,
                                 time.monotonic() - self.t0)
        write_status(self.run_dir, state="training", step=state.global_step, max_steps=state.max_steps,
                     loss=self.last.get("loss"), eval_loss=self.last.get("eval_loss"),
                     cost_usd=round(self.tracker.usd(), 6), eta_s=None if eta is None else round(eta, 1),
                     projected_cost_usd=_round(self.tracker.projected_usd(eta), 6))
        log.info(self._line(rec, eta))

    def _record(self, state, logs: dict) -> dict:
        rec = {"step": state.global_step, "epoch": _round(state.epoch, 4)}
        gen = {k: logs[k] for k in GEN_KEYS if k in logs}
        if "eval_loss" in logs or gen:
            if "eval_loss" in logs:
                rec["eval_loss"] = logs["eval_loss"]
            rec.update(gen)
        else:
            rec.update({"loss": logs.get("loss"), "lr": logs.get("learning_rate"),
                        "grad_norm": logs.get("grad_norm"),
                        "real_token_fraction": _round(logs.get("real_token_fraction"), 4),
                        "tokens_per_s": self._tokens_per_s(logs.get("num_tokens"))})
            # DPO / GRPO stages: rewards, margins, KL and completion lengths as TRL logs them
            rec.update({k: _round(v, 6) for k, v in logs.items() if k.startswith(STAGE_METRICS)
                        and isinstance(v, (int, float))})
            rec.update({k: v for k, v in logs.items() if k.startswith("gpu_")})  # tracking.GpuWindow's
        rec["cost_usd"] = round(self.tracker.usd(), 6)
        rec["elapsed_s"] = round(self.tracker.seconds(), 2)
        return rec

    def _tokens_per_s(self, num_tokens) -> Optional[float]:
        if num_tokens is None or self.last_tokens is None:
            return None
        now = time.monotonic()
        prev_n, prev_t = self.last_tokens
        self.last_tokens = (float(num_tokens), now)
        if now <= prev_t or num_tokens < prev_n:
            return None
        rate = (num_tokens - prev_n) / (now - prev_t)
        self.tokens_per_s.append(rate)
        return round(rate, 1)

    def _line(self, rec: dict, eta) -> str:
        parts = [f"step {rec['step']}/{self.max_steps}"]
        gen = [f"{k} {rec[k]:.4f}" for k in GEN_KEYS if rec.get(k) is not None]
        if "eval_loss" in rec or gen:
            if "eval_loss" in rec:
                parts.append(f"eval_loss {rec['eval_loss']:.4f}")
            parts.extend(gen)
        else:
            parts.append(f"loss {rec['loss']:.4f}")
            if rec.get("lr") is not None:
                parts.append(f"lr {rec['lr']:.2e}")
            if rec.get("tokens_per_s") is not None:
                parts.append(f"{rec['tokens_per_s']:.0f} tok/s")
            if rec.get("real_token_fraction") is not None:
                parts.append(f"real tokens {rec['real_token_fraction']:.0%}")
        parts.append(f"${rec['cost_usd']:.4f}")
        parts.append(f"eta {_fmt_eta(eta)}")
        return " | ".join(parts)


GEN_KEYS = ("eval_cer", "eval_wer", "eval_exact_match")  # payload/outputs/evaluate.py logs these at each evaluation


def _round(x, n):
    return None if x is None else round(float(x), n)


# ------------------------------------------------------------------------------------ after training


def plot_losses(metrics_path: Path, out_png: Path, title: str = "") -> Optional[Path]:
    """Train and eval loss against step (matplotlib Agg); None when there is nothing to plot."""
    return plot_overlay([("", read_metrics(metrics_path))], out_png, title)


def plot_overlay(series: list, out_png: Path, title: str = "") -> Optional[Path]:
    """Train (solid) and eval (dots) loss against step of one or more runs, each `(label, metric
    records)` in its own colour (`launch compare` overlays runs); None when there is nothing to plot."""
    curves = []
    for label, records in series:
        train = [(r["step"], r["loss"]) for r in records if r.get("loss") is not None]
        evals = [(r["step"], r["eval_loss"]) for r in records if r.get("eval_loss") is not None]
        curves.append((f"{label} " if label else "", train, evals))
    if not any(train or evals for _, train, evals in curves):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for i, (label, train, evals) in enumerate(curves):
        color = f"C{i % 10}" if len(curves) > 1 else None
        if train:  # a label is user text (run id): `$` would start matplotlib mathtext
            ax.plot(*zip(*train), color=color, label=f"{label}train loss".replace("$", r"\$"))
        if evals:
            ax.plot(*zip(*evals), marker="o", color=color, linestyle="--" if color else "-",
                    label=f"{label}val loss".replace("$", r"\$"))
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    # A title is user text (profile, run id, description): `$` would start matplotlib mathtext.
    ax.set_title((title or "loss").replace("$", r"\$"))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small" if len(curves) > 1 else None)
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)
    return out_png


def per_sample_losses(trainer, dataset, limit: int = 1000) -> list[tuple[float, int]]:
    """(loss, row) for each eval row, one forward pass each through the trainer's own collator."""
    import torch

    model = trainer.model
    was_training = model.training
    model.eval()
    wanted = ("input_ids", "labels", "seq_lengths", "messages", "images", "image")
    keys = [k for k in wanted if k in dataset.column_names]
    out = []
    try:
        for i in range(min(len(dataset), limit)):
            row = dataset[i]
            batch = trainer.data_collator([{k: row[k] for k in keys}])
            batch = {k: v.to(trainer.args.device) if hasattr(v, "to") else v for k, v in batch.items()}
            with torch.no_grad():
                loss = model(**batch, use_cache=False).loss
            if loss is not None and torch.isfinite(loss):
                out.append((float(loss), i))
    finally:
        model.train(was_training)
    return out


def write_high_loss(trainer, dataset, records: list[dict], n: int, path: Path) -> int:
    """The `n` highest-loss eval samples (with their source record) to `path` (JSONL)."""
    if n <= 0 or dataset is None or len(dataset) == 0:
        return 0
    losses = sorted(per_sample_losses(trainer, dataset), reverse=True)[:n]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for loss, i in losses:
            idx = dataset[i].get("record_index", i)
            rec = records[idx] if 0 <= idx < len(records) else {}
            f.write(json.dumps({"loss": round(loss, 6), "val_index": idx, "source": rec.get("source"),
                                "messages": rec.get("messages")}, ensure_ascii=False) + "\n")
    return len(losses)


def write_summary(run_dir: Path, summary: dict) -> Path:
    path = Path(run_dir) / layout.SUMMARY
    atomic_write_json(path, summary)
    return path


def write_traceback(run_dir: Path) -> Optional[Path]:
    """logs/rank_<N>_traceback.log with the current exception (each rank writes its own)."""
    try:
        path = Path(run_dir) / layout.LOGS_DIR / f"rank_{rank()}_traceback.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        # An explicit limit: a library may have left sys.tracebacklimit = 0 (SkyPilot's ux_utils does).
        with open(path, "a", encoding="utf-8") as f:  # appended: a restart keeps the earlier crash
            f.write(f"{now_iso()} rank {rank()} pid {os.getpid()}\n{traceback.format_exc(limit=1000)}\n")
        return path
    except OSError:
        return None
