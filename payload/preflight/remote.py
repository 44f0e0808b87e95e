"""The checks that ask the services over the network (Hub datasets and model, the W&B key)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Callable, Optional, TypeVar

from payload import layout
from payload.preflight.base import TOKEN_FIX, Check, repo_id_problem

T = TypeVar("T")


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
        except Exception as e:  # definite answers end the retries, the rest are retried
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
            if not src.hf_dataset or repo_id_problem(src.hf_dataset):
                continue
            key = f"{prefix}data.sources.{i}.hf_dataset"
            outcome, v = ask(f"Hub dataset {src.hf_dataset}", lambda r=src.hf_dataset: api.dataset_info(
                r, token=token, timeout=REMOTE_TIMEOUT_S), _hub_definite, sleep)
            out.append(_hub_check(key, f"hub[{src.name}]", "dataset", src.hf_dataset, outcome, v, token))
    m = cfg.model
    local = Path(m.name_or_path).expanduser()
    if m.tiny is None and not local.exists() and not m.name_or_path.startswith(("/", ".", "~")) \
            and not repo_id_problem(m.name_or_path):
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
    from payload.config.evaluation import wandb_wanted

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
