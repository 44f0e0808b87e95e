"""What every preflight check returns, and the facts several checks share (a leaf of payload/preflight/)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

log = logging.getLogger("payload.preflight")

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


def repo_id_problem(repo_id: str) -> Optional[str]:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        return str(e).splitlines()[0].split(". Use ")[0]
    return None
