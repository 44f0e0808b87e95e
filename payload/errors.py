"""Errors the payload reports as one line (no traceback unless LAUNCH_DEBUG=1), and the exit codes
every stage ends with.

One vocabulary for how a run ends, used everywhere (payload status.json and summary, the launcher's
registry, `launch status`, the rendered restart policy, docs):

| end state          | exit code | meaning                                              | retried by SkyPilot |
|--------------------|-----------|------------------------------------------------------|---------------------|
| `completed`        | 0         | trained, outputs written                             | no (done)           |
| `failed`           | 1         | a crash: an unexpected exception (traceback on disk) | no                  |
| `failed`           | 2         | config or data error: the user must fix the input    | no                  |
| `budget_exhausted` | 3         | the budget was reached; a resumable checkpoint saved | no                  |
| `failed`           | 4         | another live trainer holds the run's lease           | no                  |
| `stopped`          | 5         | `launch down` asked for a final checkpoint: saved    | no                  |
| `preempted`        | 75        | a transient failure (network, NCCL, a lost node)     | yes                 |
| `stopped`          | 143       | SIGTERM/SIGINT (preemption notice, `launch down`)    | yes (recovery)      |

`stopped` is what the payload knows (it was told to stop); the launcher shows `preempted` when it
did not ask for the stop itself. Only EXIT_TRANSIENT and EXIT_INTERRUPTED are listed in the rendered
`job_recovery.recover_on_exit_codes`; `max_restarts_on_errors` stays 0 so that a budget stop or a
config error never restarts on paid GPUs.
"""

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_CONFIG = 2
EXIT_BUDGET = 3
EXIT_LEASE_HELD = 4
EXIT_STOP_REQUESTED = 5  # payload/volume/stop_request.py: saved on request, then exited
EXIT_TRANSIENT = 75  # sysexits.h EX_TEMPFAIL
EXIT_INTERRUPTED = 143  # 128 + SIGTERM

RETRYABLE_EXIT_CODES = (EXIT_TRANSIENT, EXIT_INTERRUPTED)

END_STATES = ("completed", "failed", "budget_exhausted", "preempted", "stopped")

EXIT_STATE = {EXIT_OK: "completed", EXIT_CRASH: "failed", EXIT_CONFIG: "failed", EXIT_BUDGET: "budget_exhausted",
              EXIT_LEASE_HELD: "failed", EXIT_STOP_REQUESTED: "stopped", EXIT_TRANSIENT: "preempted",
              EXIT_INTERRUPTED: "stopped"}


def state_for_exit(code: int) -> str:
    """The end state a process exit code stands for (unknown non-zero codes are crashes)."""
    return EXIT_STATE.get(code, "failed")


class PayloadError(Exception):
    """A problem the user can fix: the message is one line naming the file/key/record and the fix."""

    exit_code = EXIT_CONFIG


class BudgetExhausted(PayloadError):
    """Training stopped because the budget was reached (a resumable checkpoint was saved)."""

    exit_code = EXIT_BUDGET


class TransientError(PayloadError):
    """A failure worth retrying on a fresh machine (network after bounded retries, NCCL, lost node)."""

    exit_code = EXIT_TRANSIENT


# Exceptions that mean "the machine or its network failed", not "the job is wrong": by class name,
# so this module needs neither torch nor an HTTP client (torch.distributed, requests, httpx).
_TRANSIENT_NAMES = frozenset({
    "DistBackendError", "DistNetworkError", "DistStoreError",
    "ConnectionError", "ConnectTimeout", "ReadTimeout", "Timeout", "ChunkedEncodingError",
    "ConnectError", "ReadError", "WriteError", "RemoteProtocolError", "TimeoutException", "NetworkError",
})


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, (ConnectionError, TimeoutError)) or type(exc).__name__ in _TRANSIENT_NAMES:
        return True
    if type(exc).__name__ == "HfHubHTTPError":
        status = getattr(getattr(exc, "response", None), "status_code", 0) or 0
        return status >= 500 or status == 429
    text = str(exc)
    return "NCCL" in text and "out of memory" not in text.lower()


def transient_cause(exc: BaseException) -> bool:
    """Whether `exc` or one of its causes (explicit or implicit, up to 10 deep) is the network's or
    the machine's (`is_transient`): worth another try."""
    seen, e = 0, exc
    while e is not None and seen < 10:
        if is_transient(e):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def edge_error(message: str, exc: BaseException) -> PayloadError:
    """The one-line error for a failure at a network edge (a Hub dataset, a model download): a
    TransientError (exit 75, retried) when `exc` or a cause of it is the network's, else a
    PayloadError (exit 2: the input is wrong). `message` says what failed and the fix either way."""
    if transient_cause(exc):
        return TransientError(f"{message} (network: retried on a fresh machine)")
    return PayloadError(message)


def exit_code_for(exc: BaseException) -> int:
    """The exit code a stage ends with for `exc`: a PayloadError's own, 143 for an interrupt,
    75 for a transient failure (anywhere in the cause chain), 1 for anything else (a crash)."""
    if isinstance(exc, PayloadError):
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return EXIT_TRANSIENT if transient_cause(exc) else EXIT_CRASH


def one_line(exc: BaseException) -> str:
    """The last line of a traceback for `exc` (`Type: first line of the message`); a PayloadError's
    own message is already that line."""
    msg = (str(exc).strip().splitlines() or [""])[0]
    if isinstance(exc, PayloadError):
        return msg
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
