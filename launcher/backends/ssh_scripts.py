"""The shell the ssh backend runs on the remote host: the driver that runs a node's script detached
(surviving a dropped connection) and records its exit code, and the commands that start, inspect, stop
and list a run there. The scripts are files of launcher/backends/sh/ (shellcheck reads them: `make
lint`); a script's parameters are shell variables that `format` sets above its text, from values
launcher/backends/ssh.py has shell-quoted."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SH = Path(__file__).resolve().parent / "sh"


def text(*names: str) -> str:
    """The files of sh/, one after the other (a script after the functions it calls)."""
    return "".join((SH / name).read_text() for name in names)


@dataclass(frozen=True)
class Script:
    """A script of sh/ (after the function files it calls) whose parameters are set above it."""

    names: tuple[str, ...]

    def format(self, **quoted: object) -> str:
        """The script with a `name=value` line per parameter first (after its `#!` line, if it has one);
        each value is already shell-quoted by the caller (or a number)."""
        body = text(*self.names)
        params = "".join(f"{name}={value}\n" for name, value in quoted.items())
        if body.startswith("#!"):
            shebang, _, rest = body.partition("\n")
            return f"{shebang}\n{params}{rest}"
        return params + body


DRIVER = Script(("driver.sh",))  # the run's driver.sh: log_dir, log, mark
FREE_PORT = text("free_port.sh")  # part of node.sh, after its exports
START = text("ours.sh", "start.sh")  # the run's start.sh: its NAME/value pairs come on stdin
STATUS_CMD = Script(("ours.sh", "status.sh"))  # root, status
DOWN_CMD = Script(("ours.sh", "down.sh"))  # root, ticks, marker, volume
SEED_AND_LIST = Script(("seed_and_list.sh",))  # w, root
PROBE = text("probe.sh")  # home, gpus, busy, python: one name=value a line
