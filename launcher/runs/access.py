"""`launch ssh RUN` and `launch exec RUN -- CMD`: a shell, or one command, in the run's directory on
its machine, whichever backend started it (the backend builds the process: `Backend.access`).

local: a shell in the run's directory on this machine; ssh: OpenSSH with the run's stored host, key
and known_hosts; skypilot: `ssh CLUSTER` through SkyPilot's generated SSH config. The command's exit
code is launch's, so `launch exec RUN -- test -f outputs/adapter/adapter_model.safetensors` scripts.
"""

from __future__ import annotations

import os
import subprocess
import sys

import click

from launcher.errors import BackendError
from launcher.runs.refresh import backend_for


def run_access(run_id, command) -> int:
    """Start the backend's access process for the run (the terminal stays the user's); its exit code."""
    from launcher.store import registry

    run = registry.get(run_id)
    access = backend_for(run).access(run, command, tty=sys.stdin.isatty())
    try:
        return subprocess.call(access.argv, cwd=access.cwd, env={**os.environ, **access.env})
    except FileNotFoundError:
        raise BackendError(f"`{access.argv[0]}` is not installed here: install it (OpenSSH client: "
                           "apt-get install openssh-client)") from None


@click.command()
@click.argument("run_id", required=False)
def ssh(run_id):
    """Open a shell in the run's directory on its machine (default: the latest run).

    Example: launch ssh sonia-h100-20261123-141502
    """
    sys.exit(run_access(run_id, None))


@click.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("run_id")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(run_id, command):
    """Run one command in the run's directory on its machine; its exit code is launch's.

    One argument is a shell command line (`'nvidia-smi | head'`); several are passed word for word.

    Example: launch exec sonia-h100-20261123-141502 -- nvidia-smi
    """
    from launcher.backends import command_line

    sys.exit(run_access(run_id, command_line(command)))
