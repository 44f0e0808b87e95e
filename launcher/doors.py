"""The doors from the launcher into the payload: every payload module that launcher code imports, and
why. The payload is a separate program (it runs on the GPU machine and never imports the launcher);
the launcher reads its schema, its layout and its vocabulary rather than restating them, and runs a
few of its stages here on purpose (`launch eval`, `launch chat`). Any other import is an accident:
tests/house/test_imports.py fails on a door that is not listed here (and on a listed one nobody uses), so a
new door is a decision written down, not a side effect.
"""

PAYLOAD_DOORS: dict[str, str] = {
    "payload.config": "the run schema (RunConfig) that profiles extend, its YAML loader and error type: one "
                      "schema for both sides, validated before money is spent",
    "payload.config.yamlio": "the bounded YAML reader (size, depth, aliases) for profiles and --set values",
    "payload.config.stages": "each stage's derived run config (SFT -> DPO -> GRPO), to plan and render stages "
                            "as the machine will run them",
    "payload.config.evaluation": "whether a run reports to W&B (which secrets the rendered task asks for) and which "
                           "checkpoint it exports (`launch validate` says it)",
    "payload.config.resume": "which config keys may change when a run resumes (cadence and money) and which may not "
                         "(the math): one rule, applied by `launch up --resume` and again by the payload",
    "payload.layout": "the one place that names every path in a run directory and every artifact",
    "payload.volume.stop_request": "the save-and-exit request `launch down` writes into a run dir before any signal "
                            "(SkyPilot SIGKILLs 30 s after SIGTERM): its file name, one protocol for every backend",
    "payload.errors": "the exit codes and end states (completed, budget_exhausted, ...): one vocabulary for "
                      "backends, registry and the rendered recovery rules",
    "payload.data.pipeline": "the data step itself, run here into a temp dir, so `plan` counts records and "
                             "tokens exactly as the machine will (max_records, filters, dedup, split)",
    "payload.data.preview": "`launch data preview`: the first training examples from the data step itself and "
                            "TRL's tokenization, so what is shown is what is trained",
    "payload.volume.money": "the one money formatter (`$0.0042` below a cent), shared with the machine's budget "
                     "messages, so `launch status` and the run's own lines write dollars alike",
    "payload.model.memory": "the GPU-memory estimator, so `plan` and `validate` say 'fits' with the machine's numbers",
    "payload.volume.checksums": "streamed sha256 and the regular-file walk, to verify fetched artifacts as the "
                         "machine hashed them",
    "payload.volume.checkpoints": "the checkpoint index format the machine writes, read by `launch checkpoints`",
    "payload.volume.verify": "checkpoint verification, run here on fetched checkpoints (`launch checkpoints`)",
    "payload.outputs.evaluate": "`launch eval` runs the machine's evaluation here on the fetched adapter",
    "payload.outputs.infer": "`launch chat` runs the machine's inference here (base + fetched adapter)",
    "payload.volume.observe": "metrics/summary file readers and writers shared by `launch eval`/`chat` results",
}
