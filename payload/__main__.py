"""`python -m payload STAGE --config RUN.yaml` - the entry point the rendered SkyPilot task calls.

Stages: preflight, data, train, eval (generation metrics of the adapter on a split: `--split test
--adapter DIR`), merge, export (MLX), gguf, manifest, post (the final evaluation, merge/export/push as the config
asks, then the manifest).
Each stage is a module with `main(cfg) -> dict`, callable from Python too. A user-fixable problem
prints one line (`payload: ...`) and exits non-zero; LAUNCH_DEBUG=1 shows the traceback.

Exit codes (payload/errors.py): 0 done, 1 crash (traceback in the log and in
`logs/rank_<N>_traceback.log`), 2 config/data error, 3 budget exhausted, 4 the run's lease is held by
a live trainer, 5 stopped by `launch down`'s request, 75 transient (network, NCCL: worth a fresh
machine), 143 stopped by SIGTERM/SIGINT. A failed stage also records `state`, `exit_code` and `reason`
in the run's status.json (the train stage does it itself, for every end). A train stage that stopped
(3, 5, 143) ends the log with rank 0's line: why, and the checkpoint a resume starts from. Under
torchrun (payload/train/torchrun.py) the ranks other than 0 exit 0 after a stop they all agreed on, so
that torchrun does not end rank 0 while it writes the run's end (`quiet_rank`). The stages that write
outputs after training (post, merge, export) hold the run's lease (payload/volume/lease.py) while they
run; preflight and data refuse with exit 4 while another trainer holds it (they run before torchrun,
which would turn the 4 into a 1).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import sys
import signal
import traceback

from payload.errors import EXIT_BUDGET, EXIT_INTERRUPTED, EXIT_STOP_REQUESTED

# Python's cyclic GC runs every 700 net allocations; importing torch, transformers, peft and TRL (~4,000
# modules, millions of objects) then costs ~1,000 collections: measured 4.8 -> 4.0 CPU-s for those imports
# with 10,000, and nothing else changes (collections still run, in larger steps). Set before any stage
# imports them; payload/train/torchrun.py and bench/gpu/gpu_child.py do the same.
gc.set_threshold(10_000)

LEASED = ("post", "merge", "export", "gguf", "eval")  # `train` takes the lease itself (rank 0 only)
QUIET = ("post", "merge", "export", "gguf", "eval")  # stages that load models: progress bars off (train does it itself)
# The trainer's own stops (the budget, `launch down`'s request, a signal): each keeps a checkpoint.
TRAINER_ENDS = (EXIT_BUDGET, EXIT_STOP_REQUESTED, EXIT_INTERRUPTED)
STAGES = {
    "preflight": "payload.preflight",
    "data": "payload.data",
    "train": "payload.train.stages",  # one SFT run, or every stage of a run with `stages:`
    "eval": "payload.outputs.evaluate",
    "merge": "payload.outputs.merge",
    "export": "payload.outputs.export",
    "gguf": "payload.outputs.gguf",  # outputs.export_gguf: llama.cpp's converter and quantizer
    "manifest": "payload.outputs.manifest",
}


def post(cfg) -> dict:
    """After training (rank 0): merge / push / MLX export, each only when the config asks, then the
    manifest of the run's artifacts (sizes + sha256, computed here) that `launch down` verifies."""
    from payload.volume import timings

    out = {}
    ev = cfg.evaluation
    if ev is not None and ev.final_split:
        with timings.timed(cfg.run_dir, "eval"):
            out["eval"] = importlib.import_module("payload.outputs.evaluate").main(cfg, ev.final_split)
    if cfg.outputs.merge or cfg.outputs.push_to_hub:
        with timings.timed(cfg.run_dir, "merge"):
            out["merge"] = importlib.import_module("payload.outputs.merge").main(cfg)
    if cfg.outputs.export_mlx:
        with timings.timed(cfg.run_dir, "export"):
            out["export"] = importlib.import_module("payload.outputs.export").main(cfg)
    if cfg.outputs.export_gguf:
        with timings.timed(cfg.run_dir, "gguf"):
            out["gguf"] = importlib.import_module("payload.outputs.gguf").main(cfg)
    timings.fold_into_summary(cfg.run_dir)  # measured phase durations, before the manifest hashes the summary
    out["manifest"] = importlib.import_module("payload.outputs.manifest").main(cfg)
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m payload", description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=[*STAGES, "post"])
    p.add_argument("--config", required=True, help="resolved run config (sky/config/<profile>.yaml)")
    p.add_argument("--mlx", action="store_true", help="export: write the MLX adapter (default on)")
    p.add_argument("--json", action="store_true", help="print the stage summary as JSON")
    p.add_argument("--split", choices=["val", "test"], help="eval: the split to score (default: "
                   "evaluation.final_split)")
    p.add_argument("--adapter", help="eval: adapter directory (default: the run's outputs/adapter)")
    return p


def die_with_parent() -> bool:
    """Under torchrun, end with the agent that started this worker.

    torchrun starts each worker in a session of its own (`start_new_session=True`), out of reach of
    a signal to the run's process group: when the agent is SIGKILLed (`launch down` escalating, a
    simulated preemption, the OOM killer), the worker would go on training beside the next attempt.
    PR_SET_PDEATHSIG makes the kernel SIGKILL it when its parent dies. Only under torchrun: a payload
    started by hand (nohup, screen) must survive its shell."""
    if not os.environ.get("TORCHELASTIC_RUN_ID") or not sys.platform.startswith("linux"):
        return False
    import ctypes

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG = 1
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # the agent died before the prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def run_stage(stage: str, cfg, args=None) -> dict:
    from payload.volume import lease
    from payload.volume import timings
    from payload.volume.observe import rank

    if stage in ("preflight", "data"):  # before torchrun: exit 4 reaches the job as is
        lease.ensure_free(cfg.run_dir, cfg.runtime.run_id)
    held = lease.acquire(cfg.run_dir, cfg.runtime.run_id) if stage in LEASED and rank() == 0 else None
    if stage in QUIET:  # transformers' "Loading weights" / "Writing model shards" bars stay out of run.log
        from payload.volume.observe import quiet_libraries

        quiet_libraries()
    try:
        with timings.timed(cfg.run_dir, stage):
            if stage == "eval":
                return importlib.import_module(STAGES[stage]).main(cfg, getattr(args, "split", None),
                                                                   getattr(args, "adapter", None))
            return post(cfg) if stage == "post" else importlib.import_module(STAGES[stage]).main(cfg)
    finally:
        if held is not None:
            held.release()


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from payload.config import ConfigError, load_run_config
    from payload.errors import EXIT_CONFIG, EXIT_CRASH, EXIT_OK, exit_code_for, one_line
    from payload.volume.observe import rank, setup_logging, stacks_on_usr1

    setup_logging()
    die_with_parent()
    stacks_on_usr1()
    cfg = None
    try:
        cfg = load_run_config(args.config)
        summary = run_stage(args.stage, cfg, args)
    except ConfigError as e:
        for line in e.problems:
            print(f"payload: {line}", file=sys.stderr)
        return EXIT_CONFIG
    except Exception as e:
        if args.stage == "train" and quiet_rank(e):  # not a failure to debug either
            return EXIT_OK
        code = exit_code_for(e)
        if os.environ.get("LAUNCH_DEBUG"):
            raise
        _record(args.stage, cfg, e, code)
        if code == EXIT_CRASH:
            traceback.print_exc()
        if args.stage != "train" or code not in TRAINER_ENDS or rank() == 0:  # rank 0 says how training ended
            print(f"payload {args.stage}: {one_line(e)}", file=sys.stderr)
        return code
    except KeyboardInterrupt as e:
        code = exit_code_for(e)
        _record(args.stage, cfg, e, code)
        print(f"payload {args.stage}: interrupted", file=sys.stderr)
        return code
    if args.json:
        print(json.dumps(summary, default=str))
    return 0


def quiet_rank(exc: BaseException) -> bool:
    """Whether this worker ends quietly with 0 because rank 0 speaks for the run: a stop that every
    rank's trainer agreed on (a stop request or the budget, all-reduced at a step's end) on a rank
    other than 0 on rank 0's node. That node's torchrun ends every other worker as soon as one exits
    non-zero, so a rank that left with the run's code could cut rank 0 off while it writes the
    MANIFEST and status.json; rank 0 exits with the code (payload/train/torchrun.py passes it on) and
    says the end's line. The other nodes' workers exit with the code: their torchrun passes it on."""
    from payload.errors import BudgetExhausted
    from payload.volume.observe import rank
    from payload.volume.stop_request import StopRequested

    same_node = os.environ.get("GROUP_RANK", "0") == "0"  # torchrun's node rank of this worker
    return rank() != 0 and same_node and isinstance(exc, (StopRequested, BudgetExhausted))


def _record(stage: str, cfg, exc: BaseException, code: int) -> None:
    """status.json for a failed stage other than train (which records its own ends), unless the
    failure is that another trainer holds the run."""
    from payload.volume import lease
    from payload.volume import observe
    from payload.errors import EXIT_CRASH, one_line

    if cfg is None or stage == "train" or isinstance(exc, lease.LeaseHeld):
        return
    if code == EXIT_CRASH:
        observe.write_traceback(cfg.run_dir)
    try:
        observe.write_end(cfg.run_dir, code, f"{stage}: {one_line(exc)}")
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
