"""Errors the payload reports as one line (no traceback unless LAUNCH_DEBUG=1)."""


class PayloadError(Exception):
    """A problem the user can fix: the message is one line naming the file/key/record and the fix."""

    exit_code = 1


class BudgetExhausted(PayloadError):
    """Training stopped because the budget was reached (a resumable checkpoint was saved)."""

    exit_code = 3
