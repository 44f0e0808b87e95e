"""Errors that several layers of the launcher raise, in a leaf that imports nothing of theirs: the
backends, artifacts, volumes, results and the CLI all raise or catch these, and none of them has
to import another layer (or a backend package and its factory) to name one.

Each is shown as one `✗` line without a traceback (launcher/cli.py), unless LAUNCH_DEBUG is set.
"""


class BackendError(Exception):
    """A one-line, user-fixable problem with a run's machine or its files (shown without traceback)."""


class StateError(Exception):
    """launch's own state dir (`$LAUNCH_HOME`, default `~/.launch`) or a folder in it cannot be made or
    written: one line naming the path and LAUNCH_HOME (shown without traceback)."""
