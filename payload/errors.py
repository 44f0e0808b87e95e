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
EXIT_TRANSIENT = 75  # sysexits.h EX_TEMPFAIL
EXIT_INTERRUPTED = 143  # 128 + SIGTERM

RETRYABLE_EXIT_CODES = (EXIT_TRANSIENT, EXIT_INTERRUPTED)

END_STATES = ("completed", "failed", "budget_exhausted", "preempted", "stopped")

EXIT_STATE = {EXIT_OK: "completed", EXIT_CRASH: "failed", EXIT_CONFIG: "failed", EXIT_BUDGET: "budget_exhausted",
              EXIT_LEASE_HELD: "failed", EXIT_TRANSIENT: "preempted", EXIT_INTERRUPTED: "stopped"}


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
