"""torchrun over the train stage, with the payload's deliberate ends reported as ends, not as crashes.

    python -m payload.train.torchrun [torchrun's arguments] -m payload train --config RUN.yaml

is `torchrun` (torch.distributed.run, run in this process) with two differences:

- the workers that failed exited with one code the payload chose and explained in a line of its
  own (payload/errors.py: 2 config/data, 3 budget, 4 lease held, 5 stopped by `launch down`, 75
  transient, 143 stopped by a signal), any others dying of the signal torchrun ends them with:
  torchrun would print its `ChildFailedError` traceback after that line and exit 1. Here the job
  exits with that code and the log ends with the payload's own end line (rank 0 names the run's
  end and its checkpoint: payload/__main__.py; after a stop every rank agreed on, the other ranks
  of rank 0's node exit 0, so that torchrun, which ends every worker once one exits non-zero,
  leaves rank 0 to finish writing the run's end).
- the agent was told to stop (SIGTERM/SIGINT: a preemption notice, `launch down` on the local and
  SSH backends): torchrun hands the signal to its workers, waits for them (they save if a save
  fits, and write status.json) and then raises `SignalException` with a traceback. Here it exits
  128 + the signal (143 for SIGTERM), as a shell's child killed by it would, after one line.

A crash (exit 1, a worker killed by a signal, a failed rendezvous) keeps torchrun's report and its
exit code: its table names the rank and the error file, which is what a crash needs.
"""

from __future__ import annotations

import gc
import logging
import sys
from typing import Optional

from payload.errors import EXIT_CRASH, EXIT_OK, EXIT_STATE
from payload.volume.observe import stacks_on_usr1

gc.set_threshold(10_000)  # before torch's import: fewer collections while it loads (payload/__main__.py)

DELIBERATE = frozenset(EXIT_STATE) - {EXIT_OK, EXIT_CRASH}
AGENT_LOGGER = "torch.distributed.elastic.multiprocessing.api"  # logs "failed (exitcode: N)" for any end


class _DeliberateEnds(logging.Filter):
    """Drops the agent's `failed (exitcode: N) local_rank: ...` line for a deliberate N."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (str(record.msg).startswith("failed (exitcode:") and args and args[0] in DELIBERATE)


def deliberate_code(exitcodes: list[int]) -> Optional[int]:
    """The job's code when the failed workers that exited ended deliberately with one code, the others
    dying of a signal (torchrun ends the workers still running once one exits non-zero); None for a
    crash, signals alone, or codes that disagree: those stay torchrun's report."""
    codes = {c for c in exitcodes if c >= 0}
    if len(codes) == 1 and codes <= DELIBERATE:
        return codes.pop()
    return None


def main(argv: Optional[list[str]] = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    logging.getLogger(AGENT_LOGGER).addFilter(_DeliberateEnds())
    stacks_on_usr1()  # a look at a hung agent, as at its workers (SIGUSR1 would end it otherwise)
    try:
        torchrun(sys.argv[1:] if argv is None else argv)
    except ChildFailedError as e:
        code = deliberate_code([f.exitcode for f in e.failures.values()])
        if code is None:
            raise
        return code
    except SignalException as e:
        print(f"torchrun: stopped by {e.sigval.name}; its workers were handed the signal and have ended",
              file=sys.stderr)
        return 128 + int(e.sigval)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
