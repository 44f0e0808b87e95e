"""`python -m payload STAGE --config RUN.yaml` - the entry point the rendered SkyPilot task calls.

Stages: preflight, data, train, merge, export, manifest, post (merge/export/push as the config asks,
then the manifest).
Each stage is a module with `main(cfg) -> dict`, callable from Python too. A user-fixable problem
prints one line (`payload: ...`) and exits non-zero; LAUNCH_DEBUG=1 shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

STAGES = {
    "preflight": "payload.preflight",
    "data": "payload.data",
    "train": "payload.train",
    "merge": "payload.merge",
    "export": "payload.export",
    "manifest": "payload.manifest",
}


def post(cfg) -> dict:
    """After training (rank 0): merge / push / MLX export, each only when the config asks, then the
    manifest of the run's artifacts (sizes + sha256, computed here) that `launch down` verifies."""
    out = {}
    if cfg.outputs.merge or cfg.outputs.push_to_hub:
        out["merge"] = importlib.import_module("payload.merge").main(cfg)
    if cfg.outputs.export_mlx:
        out["export"] = importlib.import_module("payload.export").main(cfg)
    out["manifest"] = importlib.import_module("payload.manifest").main(cfg)
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m payload", description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=[*STAGES, "post"])
    p.add_argument("--config", required=True, help="resolved run config (sky/config/<profile>.yaml)")
    p.add_argument("--mlx", action="store_true", help="export: write the MLX adapter (default on)")
    p.add_argument("--json", action="store_true", help="print the stage summary as JSON")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from payload.config import ConfigError, load_run_config
    from payload.errors import PayloadError

    from payload.observe import setup_logging

    setup_logging()
    try:
        cfg = load_run_config(args.config)
        if args.stage == "post":
            summary = post(cfg)
        else:
            summary = importlib.import_module(STAGES[args.stage]).main(cfg)
    except ConfigError as e:
        for line in e.problems:
            print(f"payload: {line}", file=sys.stderr)
        return 2
    except PayloadError as e:
        if os.environ.get("LAUNCH_DEBUG"):
            raise
        print(f"payload {args.stage}: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"payload {args.stage}: interrupted", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(summary, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
