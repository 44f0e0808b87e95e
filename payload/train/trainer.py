"""The trainer launch runs: TRL's trainers plus what a run on rented GPUs needs at each step and save.

`LaunchTrainerMixin` goes in front of TRL's SFTTrainer (`trainer_class()`) and of its DPO/GRPO
trainers (payload/train/preference.py): the real-token fraction of every batch (read from the device once
per logging interval), checkpoint finalization right after each save (config + checksums + fsync +
COMPLETE marker + retention, timed), and the logging accumulators saved with each checkpoint and
restored on resume, so a resumed run logs exactly what an uninterrupted one would.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Optional

from payload.volume import checkpoints as ck
from payload.volume.control import Callback
from payload.volume import observe
from payload.config import resume as runconfig
from payload.config import dump_run_config
from payload.config.evaluation import best_metric
from payload.train.run import Run

log = logging.getLogger("payload.train")


_TRAINER_CLASS = None


def trainer_class():
    """LaunchTrainer = LaunchTrainerMixin + TRL's SFTTrainer (built lazily: importing this module
    must not import trl/transformers before `arguments.set_env` ran)."""
    global _TRAINER_CLASS
    if _TRAINER_CLASS is None:
        from trl import SFTTrainer

        _TRAINER_CLASS = type("LaunchTrainer", (LaunchTrainerMixin, SFTTrainer), {})
    return _TRAINER_CLASS


class LaunchTrainerMixin:
    """SFTTrainer plus: the real-token fraction of every batch, checkpoint finalization (config +
    checksums + fsync + COMPLETE marker + retention) right after each save, timed, and the logging
    accumulators saved with each checkpoint and restored on resume."""

    launch_run: Optional[Run] = None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training and "input_ids" in inputs:  # DPO/GRPO batches have other keys
            import torch

            ids = inputs["input_ids"]
            real = inputs["attention_mask"].sum() if "attention_mask" in inputs else torch.tensor(ids.numel())
            pair = torch.stack([real.to(ids.device), torch.tensor(ids.numel(), device=ids.device)]).float()
            self.__dict__.setdefault("_token_pairs", []).append(pair)  # stays on the device until a log
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _flush_token_pairs(self) -> None:
        """Each batch's real-token fraction since the last log, summed over ranks: one gather and
        one device-to-host copy per logging interval, not a GPU sync per batch."""
        pending = self.__dict__.get("_token_pairs")
        if not pending:
            return
        import torch

        pairs = self.accelerator.gather(torch.stack(pending)[None]).sum(0)
        pending.clear()
        self._metrics["train"]["real_token_fraction"].extend((pairs[:, 0] / pairs[:, 1]).tolist())

    def log(self, logs, *args, **kwargs):
        self._flush_token_pairs()
        return super().log(logs, *args, **kwargs)

    def _save_checkpoint(self, model, trial):
        t = time.monotonic()
        super()._save_checkpoint(model, trial)
        path = Path(self.args.output_dir) / f"checkpoint-{self.state.global_step}"
        path.mkdir(parents=True, exist_ok=True)
        rank, world = self.args.process_index, self.args.world_size
        ck.write_loss_state(path, rank, self.loss_state())
        self.accelerator.wait_for_everyone()  # every rank's files (rng_state_N.pth, shards) are written
        run = self.launch_run
        if run is not None:
            if self.args.should_save:
                ck.prepare_checkpoint(path, dump_run_config(run.cfg), run.cfg.model.name_or_path)
            self.accelerator.wait_for_everyone()
            files = ck.digest_checkpoint(path, rank, world)
            if self.args.should_save:
                ck.write_marker(path, {**self._marker_info(run), "files": files})
                c = run.cfg.train.checkpoints
                ck.apply_retention(path.parent, c.keep_best, c.keep_recent, *best_metric(run.cfg))
        seconds = time.monotonic() - t
        if run is not None:
            run.control.note_save(seconds)
        log.info("saved %s in %.2fs", path.name, seconds)

    def _marker_info(self, run: Run) -> dict:
        step = self.state.global_step
        evals = [h["eval_loss"] for h in self.state.log_history if h.get("step") == step and "eval_loss" in h]
        losses = [h["loss"] for h in self.state.log_history if "loss" in h]
        scores = {k: h[k] for h in self.state.log_history if h.get("step") == step for k in observe.GEN_KEYS
                  if k in h}
        return {**scores, "step": step, "eval_loss": evals[-1] if evals else None, "loss": losses[-1] if losses else None,
                "epoch": self.state.epoch, "config_hash": run.cfg.config_hash(),
                "math_hash": runconfig.math_hash(run.cfg), "saved_at": observe.now_iso()}

    def loss_state(self) -> dict:
        """What the Trainer and TRL accumulate between two logs, on this rank: a checkpoint saved
        between logging steps (a SIGTERM, a budget stop) carries it so the next logged loss averages
        the same steps, in the same float32 order, as an uninterrupted run."""
        if hasattr(self, "_metrics"):
            self._flush_token_pairs()
        metrics = getattr(self, "_metrics", {}).get("train", {})
        return {"step": self.state.global_step, "tr_loss": float(self._tr_loss.item()),
                "last_logged": self._globalstep_last_logged,
                "metrics": {k: list(v) for k, v in metrics.items()},
                "total_train_tokens": getattr(self, "_total_train_tokens", None)}

    def restore_loss_state(self, checkpoint: Path) -> bool:
        import torch

        st = ck.read_loss_state(checkpoint, self.args.process_index)
        if st is None or st.get("step") != self.state.global_step:
            log.warning("%s has no logging state for rank %d: the first loss logged after the resume averages "
                        "fewer steps", checkpoint.name, self.args.process_index)
            return False
        self._tr_loss = torch.tensor(st["tr_loss"], dtype=self._tr_loss.dtype, device=self._tr_loss.device)
        self._globalstep_last_logged = st["last_logged"]
        if hasattr(self, "_metrics"):
            self._metrics["train"].clear()
            self._metrics["train"].update({k: list(v) for k, v in st["metrics"].items()})
        if st.get("total_train_tokens") is not None and hasattr(self, "_total_train_tokens"):
            self._total_train_tokens = st["total_train_tokens"]
        return True


class ResumeLossState(Callback):
    """On a resume, put the checkpoint's logging accumulators back once the Trainer has reset them."""

    def __init__(self, run: Run):
        self.run = run

    def on_train_begin(self, args, state, control, **kwargs):
        if self.run.resume is not None and self.run.trainer is not None:
            self.run.trainer.restore_loss_state(self.run.resume)
