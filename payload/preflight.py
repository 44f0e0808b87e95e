"""Preflight stage: cheap checks before any GPU minute is spent.

    python -m payload preflight --config run.yaml

Each check gives `ok`, `warn` or `fail` with one line of detail; any `fail` raises PayloadError
listing the failing lines. Checks: data sources readable (local files exist and are non-empty; hub
ids checked for syntax), base model reference, run directory and HF cache writable, free disk
against what the run will write, HF_TOKEN present where needed (presence only, the value is never
shown), the installed packages against the payload's minimums (payload/versions.py), the
GPU-memory estimate against the GPU, and, over the network (runbook 002's pre-flight; skipped with
LAUNCH_PREFLIGHT_OFFLINE=1 or HF_HUB_OFFLINE=1): each Hub dataset reachable, the base model on the
Hub, WANDB_API_KEY valid (see "network checks" below for ok / fail / warn).

Model size comes from, in order: a local `config.json` (local path, the HF cache, or the tiny
config), else a table of known Qwen shapes looked up by name ("Qwen3-VL-32B-Instruct" ->
qwen3-vl/32), else the size in the name ("70B" -> 70e9 parameters, shape of the nearest known row).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional, TypeVar

from payload import layout
from payload.errors import PayloadError
from payload.memory import (  # noqa: F401  (re-exported: preflight's public face)
    GIB,
    ModelDims,
    dims_from_config,
    dims_from_name,
    estimate_gpu_memory_gb,
    estimate_stage_memory_gb,
    lora_trainable_params,
)

log = logging.getLogger("payload.preflight")
T = TypeVar("T")

DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
PUBLIC_ORGS = {"qwen"}  # hub orgs whose models need no token (Qwen models are not gated)
TOKEN_FIX = "launch with `--secret HF_TOKEN` (the value is taken from your shell, never written to disk)"


@dataclass
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str

    def line(self) -> str:
        return f"{self.status.upper():4} {self.name}: {self.detail}"


def model_dims(cfg, env=None) -> Optional[ModelDims]:
    """The base model's shape: tiny config, local/cached config.json, or the name (see module doc)."""
    if cfg.model.tiny is not None:
        from payload.tiny import build_tiny_tokenizer, tiny_config

        tok = build_tiny_tokenizer(None, vocab_size=cfg.model.tiny.vocab_size)
        return dims_from_config(tiny_config(cfg.model.tiny, tok).to_dict(), "tiny config")
    for path in _config_paths(cfg, env):
        try:
            return dims_from_config(json.loads(path.read_text()), str(path))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return dims_from_name(cfg.model.name_or_path)


def hf_home(cfg, env=None) -> Path:
    env = os.environ if env is None else env
    return Path(cfg.runtime.hf_home or env.get("HF_HOME") or Path(cfg.runtime.volume) / ".hf")


def _hub_cache_dir(cfg, env=None) -> Path:
    return hf_home(cfg, env) / "hub" / ("models--" + cfg.model.name_or_path.replace("/", "--"))


def _config_paths(cfg, env) -> list[Path]:
    local = Path(cfg.model.name_or_path).expanduser()
    return [local / "config.json", *sorted(_hub_cache_dir(cfg, env).glob("snapshots/*/config.json"))]


# -------------------------------------------------------------------------------------- checks


def check_data(cfg) -> list[Check]:
    """Every source: a local file that exists, is readable and non-empty, or a valid hub id."""
    data_dir = cfg.run_dir / layout.DATA_DIR
    if (data_dir / ".complete").is_file():
        return [Check("data", "ok", f"prepared data already in {data_dir}")]
    out = []
    for src in cfg.data.sources:
        name = f"data[{src.name}]"
        if src.hf_dataset:
            bad = _repo_id_problem(src.hf_dataset)
            out.append(Check(name, "fail", f"hf_dataset `{src.hf_dataset}`: {bad}") if bad else
                       Check(name, "ok", f"hub dataset `{src.hf_dataset}` (syntax; reachability: the hub check below)"))
        else:
            out.append(_check_local_file(name, Path(src.path)))
        if src.image_root and not Path(src.image_root).is_dir():
            out.append(Check(name, "fail", f"image_root `{src.image_root}` is not a directory; fix the path"))
    return out


def _check_local_file(name: str, path: Path) -> Check:
    where = path.absolute()
    if not path.exists():
        return Check(name, "fail", f"{where} does not exist; fix `data.sources[].path` or upload the file")
    if not path.is_file():
        return Check(name, "fail", f"{where} is not a file")
    try:
        with open(path, "rb") as f:
            first = f.read(1)
    except OSError as e:
        return Check(name, "fail", f"{where} is not readable: {e.strerror}")
    if not first:
        return Check(name, "fail", f"{where} is empty")
    if path.suffix.lower() not in DATA_SUFFIXES:
        return Check(name, "warn", f"{where}: extension `{path.suffix}` is none of {', '.join(DATA_SUFFIXES)}")
    return Check(name, "ok", f"{where}: {_human(path.stat().st_size)}")


def _repo_id_problem(repo_id: str) -> Optional[str]:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        return str(e).splitlines()[0].split(". Use ")[0]
    return None


def check_model(cfg) -> Check:
    m = cfg.model
    if m.tiny is not None:
        return Check("model", "ok", f"tiny {m.tiny.arch} built from config (no download)")
    local = Path(m.name_or_path).expanduser()
    if local.exists() or m.name_or_path.startswith(("/", ".", "~")):
        if not (local / "config.json").is_file():
            return Check("model", "fail", f"local model {local} has no config.json; fix `model.name_or_path`")
        return Check("model", "ok", f"local model {local}")
    bad = _repo_id_problem(m.name_or_path)
    if bad:
        return Check("model", "fail", f"model.name_or_path `{m.name_or_path}`: {bad}")
    return Check("model", "ok", f"hub model `{m.name_or_path}` (syntax; reachability: the hub check below)")


def check_writable(cfg, env) -> list[Check]:
    """The run directory (and the HF cache, for hub models) can be created and written.

    Creates them when missing (every later stage would) and removes its probe file."""
    dirs = [("run_dir", cfg.run_dir, "set `runtime.volume` (env LAUNCH_VOLUME) to a writable directory")]
    if cfg.model.tiny is None:
        dirs.append(("hf_cache", hf_home(cfg, env), "set `runtime.hf_home` (or HF_HOME) to a writable directory"))
    out = []
    for name, path, fix in dirs:
        probe = Path(path) / f".preflight-{os.getpid()}"
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"ok")
            probe.unlink()
            out.append(Check(name, "ok", f"{path} writable"))
        except OSError as e:
            out.append(Check(name, "fail", f"cannot write to {path} ({e.strerror or e}); {fix}"))
    return out


def disk_needs(cfg, dims: ModelDims, env=None) -> list[tuple[Path, float, Path]]:
    """(location, bytes the run will hold there at its peak, what of it may already exist).

    Base model download 2P into the HF cache (hub models only); in the run directory:
    (keep_best + keep_recent) checkpoints of 14 B/param (full: bf16 weights + fp32 master/Adam)
    or 12 B per LoRA parameter (fp32 adapter + Adam m, v), final weights 2P (full), merged model 2P
    (`outputs.merge`).
    """
    t, p = cfg.train, dims.params
    out = []
    if cfg.model.tiny is None and not Path(cfg.model.name_or_path).expanduser().exists():
        out.append((hf_home(cfg, env), 2 * p, _hub_cache_dir(cfg, env)))
    keep = t.checkpoints.keep_best + t.checkpoints.keep_recent
    run = 14 * p * keep + 2 * p if t.method == "full" else 12 * lora_trainable_params(cfg, dims) * keep
    out.append((cfg.run_dir, run + (2 * p if cfg.outputs.merge else 0), cfg.run_dir))
    return out


def check_disk(cfg, dims: Optional[ModelDims], env) -> Check:
    """Free space plus what this run already wrote, against `disk_needs`, per filesystem."""
    if dims is None:
        return Check("disk", "warn", f"model size unknown for `{cfg.model.name_or_path}`: disk not checked")
    by_fs: dict[int, list] = {}
    for path, need, present in disk_needs(cfg, dims, env):
        anchor = _existing_ancestor(path)
        entry = by_fs.setdefault(anchor.stat().st_dev, [anchor, 0.0, shutil.disk_usage(anchor).free])
        entry[1] += need
        entry[2] += _tree_size(present)
    checks = []
    for anchor, need, avail in by_fs.values():
        status = "fail" if avail < need else "warn" if avail < need * 1.1 + 5 * GIB else "ok"
        fix = "" if status == "ok" else "; use a bigger volume, or lower train.checkpoints.keep_best/keep_recent"
        checks.append(Check("disk", status, f"{anchor}: needs ~{_human(need)}, {_human(avail)} available{fix}"))
    return max(checks, key=lambda c: ("ok", "warn", "fail").index(c.status))


def check_token(cfg, env) -> Check:
    """HF_TOKEN present where needed; its value is never read beyond 'is it set'."""
    has = bool(env.get("HF_TOKEN"))
    if cfg.outputs.push_to_hub and not has:
        return Check("hf_token", "fail", f"outputs.push_to_hub is `{cfg.outputs.push_to_hub}` but HF_TOKEN "
                     f"is not set; {TOKEN_FIX}, or remove outputs.push_to_hub")
    if has:
        return Check("hf_token", "ok", "HF_TOKEN present (value not shown)")
    hub = [s.hf_dataset for s in cfg.data.sources if s.hf_dataset]
    if cfg.model.tiny is None and not Path(cfg.model.name_or_path).expanduser().exists() \
            and not _hub_cache_dir(cfg, env).is_dir():
        hub.append(cfg.model.name_or_path)
    private = [r for r in dict.fromkeys(hub) if "/" in r and r.split("/")[0].lower() not in PUBLIC_ORGS]
    if private:
        return Check("hf_token", "warn", f"HF_TOKEN not set: gated or private repos ({', '.join(private)}) "
                     f"will fail to download; {TOKEN_FIX}")
    return Check("hf_token", "ok", "no token needed (public or local sources, no push)")


def gpu_info(env) -> tuple[Optional[float], int, str]:
    """(memory per GPU in GiB, GPUs in the whole job, where the memory figure came from).

    GPU count: WORLD_SIZE, else SkyPilot's per-node count x nodes (the run-phase variables, or the
    SKYPILOT_SETUP_* ones that SkyPilot sets while `setup`, where preflight runs), else torch.
    """
    ips = env.get("SKYPILOT_NODE_IPS") or env.get("SKYPILOT_SETUP_NODE_IPS") or ""
    nodes = int(env.get("SKYPILOT_NUM_NODES") or 0) or len(ips.split()) or 1
    per_node = env.get("SKYPILOT_NUM_GPUS_PER_NODE") or env.get("SKYPILOT_SETUP_NUM_GPUS_PER_NODE")
    count = int(env.get("WORLD_SIZE") or 0) or (int(per_node) * nodes if per_node else 0)
    if env.get("LAUNCH_GPU_MEMORY_GB"):
        return float(env["LAUNCH_GPU_MEMORY_GB"]), count or 1, "LAUNCH_GPU_MEMORY_GB"
    try:
        import torch

        if torch.cuda.is_available():
            mem = torch.cuda.get_device_properties(0).total_memory / GIB
            return mem, count or torch.cuda.device_count() * nodes, torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return None, count or 1, "no GPU"


def check_versions(cfg) -> Check:
    """The installed training stack against the payload's minimums (payload/versions.py)."""
    from payload import versions

    bad = versions.problems(cfg)
    if bad:
        return Check("versions", "fail", "; ".join(bad))
    have = versions.report()
    return Check("versions", "ok", ", ".join(f"{k} {v}" for k, v in have.items() if v))


def check_gpu_memory(cfg, dims: Optional[ModelDims], env) -> tuple[Check, dict]:
    mem, n, source = gpu_info(env)
    est = estimate_stage_memory_gb(cfg, mem, n, dims=dims) if dims else {"known": False}
    if not est.get("known"):
        return Check("gpu_memory", "warn", f"model size unknown for `{cfg.model.name_or_path}`: not estimated"), est
    comps = ", ".join(f"{k} {v:g}" for k, v in est["components_gb"].items())
    detail = f"~{est['total_gb']:g} GiB per GPU x {n} ({comps})"
    if mem is None:
        return Check("gpu_memory", "ok", f"{detail}; no GPU visible, not compared"), est
    detail += f" vs {mem:.1f} GiB ({source})"
    if est["total_gb"] > mem:
        fixes = "lower train.per_device_batch_size or max_seq_length, use qlora, or add train.deepspeed (zero_stage: 3)"
        return Check("gpu_memory", "fail", f"{detail}: does not fit; {fixes}"), est
    status = "warn" if est["total_gb"] > 0.9 * mem else "ok"
    return Check("gpu_memory", status, detail + (": tight, may OOM" if status == "warn" else "")), est


# ---------------------------------------------------------------------------------------- stage


def run_checks(cfg, env=None) -> tuple[list[Check], dict]:
    env = os.environ if env is None else env
    checks = [*check_data(cfg), check_model(cfg), *check_writable(cfg, env)]
    try:
        dims = model_dims(cfg, env)
    except Exception as e:  # noqa: BLE001 - a malformed config.json must not hide the other checks
        dims = None
        checks.append(Check("model_shape", "warn", f"could not read the model shape: {e}"))
    checks += [check_disk(cfg, dims, env), check_token(cfg, env), check_versions(cfg)]
    checks += check_remote(cfg, env)  # Hub datasets/model exist, W&B key valid (network; see below)
    if getattr(cfg, "stages", None):  # every stage must fit (DPO: pairs + reference, GRPO: generations)
        from payload.stage_config import stage_run_config

        estimate: dict = {}  # the largest stage's
        for i, stage in enumerate(cfg.stages):
            gpu_check, est = check_gpu_memory(stage_run_config(cfg, i), dims, env)
            checks.append(Check(f"gpu_memory[{stage.label}]", gpu_check.status, gpu_check.detail))
            estimate = est if i == 0 or est.get("total_gb", 0) > estimate.get("total_gb", 0) else estimate
        return checks, estimate
    gpu_check, estimate = check_gpu_memory(cfg, dims, env)
    checks.append(gpu_check)
    return checks, estimate


def main(cfg, env=None) -> dict:
    """Run every check, log one line each; raise PayloadError listing the failures."""
    checks, estimate = run_checks(cfg, env)
    for c in checks:
        (log.warning if c.status != "ok" else log.info)(c.line())
    failed = [c for c in checks if c.status == "fail"]
    if failed:
        raise PayloadError(f"preflight: {len(failed)} check(s) failed: " +
                           " | ".join(f"{c.name}: {c.detail}" for c in failed))
    return {"stage": "preflight", "ok": True, "warnings": sum(c.status == "warn" for c in checks),
            "checks": [asdict(c) for c in checks], "memory": estimate}


def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _tree_size(path: Path) -> int:
    total = 0  # os.walk of a missing path yields nothing
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def _human(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB / 10 else f"{n / 2**20:.1f} MiB"


# ------------------------------------------------------------------------------ network checks
#
# On the GPU machine (which has network) preflight asks the services themselves what runbook 002's
# pre-flight asks: is each Hub dataset there, does the base model exist, is the W&B key valid.
# Each call gets payload/retry.py's bounded backoff. Outcomes:
#   found                      -> ok
#   definite answer: 404 / gated / 401 / 403 (any 4xx but 429), or W&B rejecting the key
#                              -> fail naming the key (data.sources.N.hf_dataset, model.name_or_path,
#                                 model.revision, HF_TOKEN, WANDB_API_KEY) and the fix; exit 2
#   no answer after the tries: network errors, timeouts, 5xx, 429
#                              -> warn: the run may still work from the volume's HF cache (a restart
#                                 after preemption, an outage of the Hub API only); data/train retry
#                                 again and fail with their own error if it really is gone
# Skipped without a call: local paths, local and tiny models, data already prepared on the volume,
# W&B not asked for / no WANDB_API_KEY / WANDB_MODE offline or disabled, and everything when
# LAUNCH_PREFLIGHT_OFFLINE=1 or HF_HUB_OFFLINE=1 (the CPU tests set the former). Token and key
# values go to the services only: never into a line, a log or the summary.

OFFLINE_SWITCHES = ("LAUNCH_PREFLIGHT_OFFLINE", "HF_HUB_OFFLINE")
REMOTE_TIMEOUT_S = 20.0
_TRUE = ("1", "true", "yes", "on")


def offline_reason(env) -> Optional[str]:
    """The switch that turns the network checks off, if one is set (in `env` or this process)."""
    for name in OFFLINE_SWITCHES:
        if str(env.get(name) or os.environ.get(name) or "").strip().lower() in _TRUE:
            return f"{name}=1"
    return None


def _http_status(exc: BaseException) -> int:
    return int(getattr(getattr(exc, "response", None), "status_code", 0) or 0)


def _hub_definite(exc: BaseException) -> bool:
    """The Hub answered: not found (or private), gated, bad revision, token rejected (4xx but 429)."""
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(exc, (RepositoryNotFoundError, RevisionNotFoundError)):
        return True
    status = _http_status(exc)
    return isinstance(exc, HfHubHTTPError) and 400 <= status < 500 and status != 429


_REJECTED = re.compile(r"\b(401|403)\b|unauthori[sz]ed|invalid|not authenticated|permission denied",
                       re.I)


def _wandb_definite(exc: BaseException) -> bool:
    """W&B rejected the key (its AuthenticationError also covers 'could not reach the server':
    only a message that says 401/403/invalid/unauthorized is a definite answer)."""
    from payload.errors import is_transient

    e, seen = exc, 0
    while e is not None and seen < 5:
        if is_transient(e):
            return False
        e, seen = e.__cause__ or e.__context__, seen + 1
    text = " ".join(str(x) for x in (exc, exc.__cause__) if x is not None)
    return _http_status(exc) in (401, 403) or bool(_REJECTED.search(text))


def ask(what: str, fn: Callable[[], T], definite: Callable[[BaseException], bool],
        sleep=None) -> tuple[str, object]:
    """`fn()` with payload/retry.py's bounded backoff: ("ok", its value); ("fail", the exception)
    for a definite answer (not retried); ("warn", the last exception) once the tries are spent."""
    from payload.retry import with_retries

    answered: list[BaseException] = []

    def once():
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - definite answers end the retries, the rest are retried
            if definite(e):
                answered.append(e)
                return None
            raise

    try:
        value = with_retries(what, once, sleep=sleep or time.sleep)
    except Exception as e:  # noqa: BLE001 - no answer after the retries
        return "warn", e
    return ("fail", answered[0]) if answered else ("ok", value)


def _say(exc: BaseException, secrets: tuple) -> str:
    """One line for an exception, with any secret value blanked out."""
    from payload.retry import first_line

    text = first_line(exc)
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    return text


def _hub_fail_detail(kind: str, key: str, repo: str, exc: BaseException, has_token: bool) -> tuple[str, str]:
    """(check name, detail) for a definite Hub answer."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    status = _http_status(exc)
    if isinstance(exc, GatedRepoError):
        fix = ("the HF_TOKEN's account has not been granted access: accept the terms on the repo's page"
               if has_token else f"accept the terms on the repo's page and {TOKEN_FIX}")
        return key, f"{kind} `{repo}` is gated; {fix}"
    if isinstance(exc, RevisionNotFoundError):
        return "model.revision", f"revision not found in `{repo}`; fix `model.revision`"
    if status == 401 and has_token and not isinstance(exc, RepositoryNotFoundError):
        return "HF_TOKEN", (f"the Hub rejected HF_TOKEN (401) reading `{repo}`; launch with a valid "
                            "`--secret HF_TOKEN` (huggingface.co/settings/tokens)")
    if isinstance(exc, RepositoryNotFoundError) or status in (401, 404):
        private = "" if has_token else f" or private (then {TOKEN_FIX})"
        return key, f"{kind} `{repo}` not found on the Hub{private}; fix `{key}`"
    return key, f"{kind} `{repo}`: the Hub answered {status}; fix `{key}` or the token's access"


def check_hub(cfg, env, sleep=None) -> list[Check]:
    """Each Hub dataset the profile reads (`dataset_info`) and the base model (`model_info`)."""
    from huggingface_hub import HfApi

    token = env.get("HF_TOKEN") or None
    api = HfApi(token=token)
    out = []
    recipes = [] if (cfg.run_dir / layout.DATA_DIR / ".complete").is_file() else [("", cfg.data)]
    recipes += [(f"stages.{k}.", st.data) for k, st in enumerate(getattr(cfg, "stages", None) or []) if st.data]
    for prefix, data in recipes:  # the run's data and each stage's own (a DPO stage's preference set)
        for i, src in enumerate(data.sources):
            if not src.hf_dataset or _repo_id_problem(src.hf_dataset):
                continue
            key = f"{prefix}data.sources.{i}.hf_dataset"
            outcome, v = ask(f"Hub dataset {src.hf_dataset}", lambda r=src.hf_dataset: api.dataset_info(
                r, token=token, timeout=REMOTE_TIMEOUT_S), _hub_definite, sleep)
            out.append(_hub_check(key, f"hub[{src.name}]", "dataset", src.hf_dataset, outcome, v, token))
    m = cfg.model
    local = Path(m.name_or_path).expanduser()
    if m.tiny is None and not local.exists() and not m.name_or_path.startswith(("/", ".", "~")) \
            and not _repo_id_problem(m.name_or_path):
        outcome, v = ask(f"Hub model {m.name_or_path}", lambda: api.model_info(
            m.name_or_path, revision=m.revision, token=token, timeout=REMOTE_TIMEOUT_S), _hub_definite, sleep)
        out.append(_hub_check("model.name_or_path", "hub_model", "model", m.name_or_path, outcome, v, token))
    return out


def _hub_check(key, name, kind, repo, outcome, value, token) -> Check:
    if outcome == "ok":
        return Check(name, "ok", f"hub {kind} `{repo}` reachable ({key})")
    if outcome == "fail":
        key, detail = _hub_fail_detail(kind, key, repo, value, bool(token))
        return Check(name, "fail", f"{key}: {detail}")
    return Check(name, "warn", f"hub {kind} `{repo}` not checked: no answer after retries "
                 f"({_say(value, (token,))}); the run may still work from the volume's HF cache")


def check_wandb_key(cfg, env, sleep=None) -> list[Check]:
    """WANDB_API_KEY valid, when the profile reports to W&B and a key is set (wandb.Api verifies
    the key with the server when it is built; nothing is written to disk)."""
    key = env.get("WANDB_API_KEY")
    mode = str(env.get("WANDB_MODE") or "").lower()
    from payload.eval_config import wandb_wanted

    if not wandb_wanted(cfg) or not key or mode in ("offline", "dryrun", "disabled"):
        return []

    def verify():
        import wandb

        return wandb.Api(api_key=key, timeout=int(REMOTE_TIMEOUT_S))

    outcome, v = ask("W&B key check", verify, _wandb_definite, sleep)
    if outcome == "ok":
        return [Check("wandb", "ok", "WANDB_API_KEY accepted by W&B (value not shown)")]
    if outcome == "fail":
        return [Check("wandb", "fail", f"WANDB_API_KEY: W&B rejected the key ({_say(v, (key,))}); launch with a "
                      "valid `--secret WANDB_API_KEY` (wandb.ai/authorize), or unset it to train without W&B")]
    return [Check("wandb", "warn", f"WANDB_API_KEY not checked: no answer from W&B after retries "
                  f"({_say(v, (key,))}); W&B init retries again at train start")]


def check_remote(cfg, env, sleep=None) -> list[Check]:
    """The network checks (see above), or one line saying they were switched off."""
    why = offline_reason(env)
    if why:
        return [Check("network", "ok", f"Hub/W&B checks skipped ({why})")]
    return [*check_hub(cfg, env, sleep), *check_wandb_key(cfg, env, sleep)]
