"""Bounded exponential backoff around network calls (runbook 002: Hub dataset/model loading and
W&B init, 3 tries). Every failed try is logged with what is retried, why and the wait; the last
failure is raised as it was, so the caller's own one-line error (with the fix) still applies.

huggingface_hub's `http_backoff` retries single HTTP requests only; `datasets.load_dataset` and
`wandb.init` need a retry around the whole call, which is this.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional, TypeVar

log = logging.getLogger("payload.retry")

T = TypeVar("T")

TRIES = 3
BASE_DELAY_S = 2.0


def with_retries(what: str, fn: Callable[[], T], *, tries: int = TRIES, base_delay_s: float = BASE_DELAY_S,
                 retry_on: tuple[type[BaseException], ...] = (Exception,),
                 retry_if: Optional[Callable[[BaseException], bool]] = None, sleep=time.sleep) -> T:
    """`fn()`, tried up to `tries` times with waits of base, 2x base, ... between tries. With
    `retry_if`, a failure it says no to is raised at once: a definite answer (a dataset that is not
    there) does not wait out the backoff."""
    for attempt in range(1, tries + 1):
        try:
            return fn()
        except retry_on as e:
            if retry_if is not None and not retry_if(e):
                log.error("%s failed: %s; not retried (not a network failure)", what, first_line(e))
                raise
            if attempt == tries:
                log.error("%s failed %d times; giving up: %s", what, tries, first_line(e))
                raise
            delay = base_delay_s * 2 ** (attempt - 1)
            log.warning("%s failed (try %d of %d): %s; retrying in %.0f s", what, attempt, tries, first_line(e),
                        delay)
            sleep(delay)
    raise AssertionError("unreachable")


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__
