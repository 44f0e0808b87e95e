"""The run configuration the payload executes: data recipe, model, method, training, outputs.

This package is the contract between the launcher and the payload. It imports only pydantic and
PyYAML (never torch), so the launcher can validate profiles with it. A profile in `clusters/`
holds these sections plus the launcher-owned `cluster:` and `budget:`; `launch render` writes the
resolved form (every default filled in, `runtime:` set) that `python -m payload ... --config` reads.
Import the schema and its loading from here (this face), not from the modules that hold them.

The group: this face, `runconfig` (the training stages' schema and the whole `RunConfig`), `load`
(loading and dumping, with errors that name the file, line and key), `schema` (the sections),
`stages` (each stage's run config), `evaluation` (`evaluation:`, `wandb:`), `resume` (what may
change when a run resumes, checked on the machine too) and `yamlio` (bounded YAML reading). It may
import only the payload's base (errors, layout); every other group, and the launcher, reads it.
"""

from __future__ import annotations

from payload.config.evaluation import EvalConfig, WandbConfig  # noqa: F401  (re-exported: the config's face)
from payload.config.load import (  # noqa: F401  (re-exported: the config's face)
    ConfigError,
    dump_run_config,
    format_validation_errors,
    line_for,
    load_run_config,
    load_yaml_with_lines,
    place,
    suggest_keys,
)
from payload.config.runconfig import (  # noqa: F401  (re-exported: the config's face)
    BUILTIN_REWARDS,
    STAGES_DIR,
    USER_REWARD_RE,
    DpoConfig,
    GrpoConfig,
    RunConfig,
    StageConfig,
    check_stages,
    stage_train,
)
from payload.config.schema import (  # noqa: F401  (re-exported: the config's face)
    CheckpointConfig,
    DataConfig,
    DeepSpeedConfig,
    GGUF_CONVERTED,
    LoraConfig,
    ModelConfig,
    NAME_RE,
    OutputsConfig,
    QuantizationConfig,
    ROLES,
    RUN_ID_RE,
    RuntimeConfig,
    SourceConfig,
    Strict,
    TinyModel,
    TrainConfig,
    check_name,
    safe_id,
    shown,
    slugify,
)
