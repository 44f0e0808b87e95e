"""`launch`: fine-tune LLMs on rented GPUs from profiles in your project's clusters/.

`launch --help` loads this module and the command modules it registers, no more (launcher/heavy.py
STARTUP): what a command needs beyond them it imports inside itself.

One idea at ~450 lines: the command line's frame: the group and its global options (`--project`),
the planning commands that are a few lines each, and the one place where an error, a Ctrl-C or a
signal becomes the user's one line; the run and result commands live in their groups' modules.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import signal
import sys
import textwrap
import threading

import click

from . import __version__, project
from .errors import BackendError, StateError
from .project import NoProject
from launcher.term.ui import err_console, note
from launcher.term.units import json_text
from .trainenv import TrainEnvError

# Fewer cyclic-GC passes while a command imports what it needs (a `plan` that counts tokens through TRL
# imports torch and transformers: 3.1 -> 2.7 CPU-s); the payload's reason: payload/__main__.py.
gc.set_threshold(10_000)


class LaunchGroup(click.Group):
    """Every known user-facing error becomes one `✗` line and exit 1 (LAUNCH_DEBUG=1: traceback)."""

    def make_context(self, *args, **kwargs):
        with closed_pipe_ends_quietly():  # `launch --help | head -1`
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        try:
            with closed_pipe_ends_quietly():
                done = super().invoke(ctx)
            signals_end_at_once()  # the command's work is done: a signal now needs no cleanup
            return done
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except KeyboardInterrupt:  # Ctrl-C: what it stopped, and what goes on billing (not click's `Aborted!`)
            if os.environ.get("LAUNCH_DEBUG"):
                raise
            e = sys.exc_info()[1]
            how = _how(e)
            run_id = getattr(e, "run_id", None) or next(iter(ctx.meta.get(RECORDED) or ()), None)
            mark, line = interrupted_line(ctx.invoked_subcommand, how, run_id)
            with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
                note(mark, line, out=err_console())
            ctx.exit(128 + int(getattr(signal, how)) if how in INTERRUPTING else 130)  # as the shell reports it
        except Exception as e:  # mapped below, re-raised when unknown or debugging
            if os.environ.get("LAUNCH_DEBUG"):
                # SkyPilot's print_exception_no_traceback leaks sys.tracebacklimit = 0 on errors.
                if hasattr(sys, "tracebacklimit"):
                    del sys.tracebacklimit
                raise
            lines = user_error_lines(e)
            if lines is None:
                raise
            for line in lines:  # error text carries user and remote text: printed literally, never as markup
                note("[red]✗[/] ", line, out=err_console())
            ctx.exit(1)

    SECTIONS = (("Plan", ("profiles", "validate", "data", "plan", "render", "init")),
                ("Run", ("up", "logs", "status", "ssh", "exec", "down")),
                ("Results", ("checkpoints", "eval", "compare", "chat", "cost", "volumes")))

    def format_commands(self, ctx, formatter):
        """Commands in the order a run happens (plan, run, results; the rest under Other), each with
        its one-line help and the `Example:` line of its docstring."""
        known = {name: cmd for name in self.list_commands(ctx)
                 if (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden}
        placed = {n for _, names in self.SECTIONS for n in names}
        sections = [(title, [n for n in names if n in known]) for title, names in self.SECTIONS]
        sections.append(("Other", [n for n in known if n not in placed]))
        for title, names in sections:
            if not names:
                continue
            rows = []
            # write_dl's width for the text column; an example is wrapped at spaces only (click's wrap
            # breaks at hyphens: a run id split over two lines is no run id when copied)
            width = max(formatter.width - min(max(map(len, names)), 30) - 4, 10)
            for n in names:
                rows.append((n, known[n].get_short_help_str(200)))  # wrapped, not cut
                example = command_example(known[n])
                if example:
                    lines = textwrap.wrap(f"e.g. {example}", width, break_on_hyphens=False, break_long_words=False)
                    rows.append(("", "\b\n" + "\n".join(lines)))  # \b: click keeps these lines as they are
            with formatter.section(title):
                formatter.write_dl(rows)


@contextlib.contextmanager
def closed_pipe_ends_quietly():
    """Output to a reader that has gone (`launch plan | head -1`) ends the command quietly with status 0,
    as a Unix tool stops when its reader stops (click's own handler exits 1: a `set -o pipefail`
    script broke). stdout and stderr are pointed at /dev/null first, so nothing written or flushed
    afterwards (rich, the interpreter's exit) meets the closed pipe again."""
    try:
        yield
    except OSError as e:
        if e.errno != errno.EPIPE:
            raise
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            try:
                os.dup2(devnull, stream.fileno())
            except (OSError, ValueError, AttributeError):  # not a real file (a test's capture)
                pass
        raise SystemExit(0) from None


def command_example(cmd) -> str:
    """The command line after `Example:` in a command's docstring ('' when it has none)."""
    for line in (cmd.help or "").splitlines():
        if line.strip().startswith("Example:"):
            return line.strip().removeprefix("Example:").strip()
    return ""


def interrupted_line(command, how: str = "Ctrl-C", run_id=None) -> tuple[str, str]:
    """(mark, line) for a command stopped by Ctrl-C (or SIGTERM/SIGHUP, `how`): a run started or followed
    goes on, a `down` may not have happened; either way the user is told what still bills and the
    command that stops it (`run_id`: the run `up` had recorded when it was stopped)."""
    goes_on = ("the run goes on on its machine and bills until it ends or is stopped: `launch status` shows "
               "it, `launch down` stops it")
    if command == "logs":
        return "[yellow]![/] ", f"stopped following ({how}); {goes_on}"
    if command == "up" and run_id:
        return "[yellow]![/] ", (f"interrupted ({how}) once {run_id} was recorded: it may be running and billing; "
                                 f"`launch status {run_id}` shows it, `launch down {run_id}` stops it")
    if command == "up":
        return "[yellow]![/] ", f"interrupted ({how}) before anything started: nothing runs or bills"
    if command == "down":
        return "[red]✗[/] ", (f"interrupted ({how}) before the run was down: it may still run and bill; run the "
                              "same `launch down` again (`launch status` shows it)")
    return "[red]✗[/] ", f"interrupted ({how})"


def _how(e) -> str:
    """What interrupted: Ctrl-C, or the signal `interrupt_on_signals` raised KeyboardInterrupt for."""
    name = e.args[0] if e is not None and e.args else None
    return name if name in INTERRUPTING else "Ctrl-C"


INTERRUPTING = ("SIGTERM", "SIGHUP")


def interrupt_on_signals() -> None:
    """SIGTERM and SIGHUP (a closed terminal, a dropped ssh session, a CI timeout) stop launch as Ctrl-C
    does: as a KeyboardInterrupt, so each command's own Ctrl-C handling runs (`up` keeps the run's
    record and names it, `down` says to run again) instead of the process dying mid-write. A second
    signal of the same kind ends the process at once (its default action)."""
    def interrupt(signum, frame):
        signal.signal(signum, signal.SIG_DFL)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for name in INTERRUPTING:
        signal.signal(getattr(signal, name), interrupt)


def signals_end_at_once() -> None:
    """SIGTERM and SIGHUP back to their default action (the process ends), once a command is done."""
    for name in INTERRUPTING:
        signal.signal(getattr(signal, name), signal.SIG_DFL)


def user_error_lines(e: Exception):
    from payload.config import ConfigError
    from payload.errors import PayloadError  # a payload step run here (eval, chat): its one line

    from .catalog import PlanError
    from launcher.store.registry import RegistryError, RunNotFound

    if isinstance(e, ConfigError):
        n = len(e.problems)
        head = [f"{n} problem{'s' if n > 1 else ''} in the profile:"] if n > 1 else []
        return head + list(e.problems)
    if isinstance(e, (BackendError, PlanError, RunNotFound, RegistryError, PayloadError, StateError, NoProject,
                      TrainEnvError)):
        return [str(e)]
    if isinstance(e, OSError) and getattr(e, "errno", None) == 28:
        return [f"disk full: {e.filename or ''} - free space or set LAUNCH_HOME to a larger disk"]
    if isinstance(e, OSError) and e.filename and e.errno in UNWRITABLE:  # --dest, --plot, a file of a run
        return [f"cannot write {e.filename}: {e.strerror}; choose a path you can write to"]
    return None


def _use_project(value) -> None:
    """`--project DIR`: the project for this command and for every process it starts (LAUNCH_PROJECT)."""
    if value:
        os.environ["LAUNCH_PROJECT"] = os.path.abspath(os.path.expanduser(value))


# A path the user named that cannot be written: read-only, no permission, a file in the way.
UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST, errno.EISDIR)


@click.group(cls=LaunchGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="launch")
@click.option("--project", type=click.Path(file_okay=False), metavar="DIR", expose_value=False, is_eager=True,
              callback=lambda ctx, param, value: _use_project(value),
              help="The project (a directory with clusters/); default: the nearest one from here up "
                   "(env LAUNCH_PROJECT).")
def cli():
    """Fine-tune LLMs on rented GPUs, from a profile in your project's clusters/.

    \b
      launch plan sonia-h100          what runs where, how long, at what cost
      launch up sonia-h100            render the SkyPilot task, upload, start
      launch logs --follow            follow training
      launch down --fetch-artifacts   fetch the artifacts verified, then tear down
    """


# ---------------------------------------------------------------------------------- profiles


@cli.command()
@click.argument("profile")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a profile value (YAML) as `launch up --set` would, e.g. --set train.max_steps=100.")
def validate(profile, sets=()):
    """Check a profile (name or path) and its local data files; report every problem at once.

    Example: launch validate clusters/sonia-h100.yaml
    """
    from launcher.profiles.checks import load_checked
    from launcher.plan.estimate import MEMORY_FIX, memory_verdict
    from launcher.profiles.profile import ProfileError, resolve_profile_path

    p, data_files = load_checked(profile, tuple(sets))
    mem = memory_verdict(p)
    if mem["status"] == "does not fit":
        raise ProfileError([f"{resolve_profile_path(profile)}: train: GPU memory {mem['detail']} does not fit "
                            f"{p.cluster.accelerators_label}; {MEMORY_FIX}"])
    note("[green]✓[/] ", f"{p.name}: valid ({p.cluster.accelerators_label} x "
         f"{p.cluster.num_nodes} node(s), {p.train.method}, {p.model.name_or_path})")
    for line in data_files:
        note("  data: ", line)
    from payload.config.evaluation import exported_checkpoint

    outputs = ["adapter" if p.train.method != "full" else "weights"] + ["merged model"] * p.outputs.merge + \
        ["MLX adapter"] * p.outputs.export_mlx + \
        [f"GGUF ({', '.join(p.outputs.export_gguf)})"] * bool(p.outputs.export_gguf)
    note("  exports: ", f"{', '.join(outputs)} from {exported_checkpoint(p)}")
    if mem["status"] not in ("n/a",):
        mark = "[yellow]![/]" if mem["status"] in ("tight", "unknown") else "[green]✓[/]"
        note(f"{mark} ", f"GPU memory {mem['status']}: {mem['detail']} (estimate, +-20%)")


@cli.command()
@click.argument("profiles", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Render every profile in clusters/.")
@click.option("--check", is_flag=True, help="Do not write; exit 1 with a diff when sky/ is stale (CI).")
def render(profiles, all_, check):
    """Render profiles to SkyPilot tasks in sky/ (and resolved run configs in sky/config/).

    Example: launch render --all --check
    """
    from .catalog import plan_price
    from launcher.profiles.profile import profile_names
    from launcher.profiles.render import render_all, stale, write

    names = list(profiles) or (profile_names() if all_ or check else None)
    if not names:
        raise click.UsageError("name a profile, or use --all")
    rendered = render_all(names, plan_price)
    if check:
        diffs = stale(rendered)
        if diffs:
            for _, diff in diffs:
                click.echo(diff)
            click.echo(f"✗ {len(diffs)} rendered file(s) are stale: run `launch render --all` and commit sky/",
                       err=True)
            sys.exit(1)
        note("[green]✓[/] ", f"sky/ is up to date ({len(rendered)} files)")
        return
    written = write(rendered)
    for path in written:
        note("[green]✓[/] ", f"wrote {path.relative_to(path.parents[1])}")
    if not written:
        note("[green]✓[/] ", "nothing to do: sky/ is up to date")


@cli.command()
@click.argument("profile")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--rehearse", is_flag=True, help="Plan the quick validation run (`launch up --rehearse`).")
@click.option("--compare", is_flag=True, help="Every catalog GPU/count/cloud that fits, ranked by total $.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a profile value (YAML) as `launch up --set` would, e.g. --set train.max_steps=100.")
def plan(profile, as_json, rehearse=False, compare=False, sets=()):
    """Instance, $/hour, duration and total cost of a run - offline, no credentials needed.

    Example: launch plan sonia-h100
    """
    from launcher.profiles.checks import resolve
    from launcher.plan.estimate import plan_profile
    from launcher.plan.show import print_plan

    r = resolve(profile, tuple(sets))  # planning costs nothing: missing data is a warning here
    if rehearse:  # the rehearsal's cuts on the file already read
        from launcher.runs.rehearse import overrides

        r = resolve(r.file, overrides=(*sets, *overrides(r.profile)))
    p, data_problems = r.profile, r.data_problems
    result = plan_profile(p)
    if compare:
        from launcher.plan.compare import compare as compare_options, print_compare

        print_compare(compare_options(p, result), as_json)
    elif as_json:
        click.echo(json_text({**result.to_dict(), "data_problems": data_problems}))
    else:
        print_plan(p, result)
    from rich.text import Text

    for line in data_problems:  # user text: printed literally
        err_console().print(Text.assemble(("! ", "yellow"), f"{line}; `launch up` refuses until it is fixed"))


@cli.command()
@click.option("--json", "as_json", is_flag=True)
def profiles(as_json):
    """List the project's profiles (clusters/) with GPUs, spot, $ and estimated cost; then the examples.

    Example: launch profiles
    """
    from launcher.plan.show import print_profiles

    print_profiles(as_json)


# ------------------------------------------------------------------------------------ runs

from launcher.runs.lifecycle import cost, logs, status  # noqa: E402  (click commands; light imports only)
from launcher.runs.teardown import down  # noqa: E402
from launcher.runs.start import RECORDED, up  # noqa: E402

for _cmd in (up, logs, status, down, cost):
    cli.add_command(_cmd)

from launcher.runs.volumes import volumes  # noqa: E402  (click group; imports SkyPilot only when run)

cli.add_command(volumes)

from launcher.profiles.scaffold import init  # noqa: E402  (click command; light imports only)

cli.add_command(init)

from launcher.runs.access import exec_, ssh  # noqa: E402  (click commands; light imports only)

cli.add_command(ssh)
cli.add_command(exec_)

from launcher.results.fetched import (  # noqa: E402  (checkpoints/eval/chat of a run; light imports)
    chat,
    checkpoints,
    eval_,
)

for _cmd in (checkpoints, eval_, chat):
    cli.add_command(_cmd)

from launcher.profiles.preview import data  # noqa: E402  (`launch data preview`; light imports only)

cli.add_command(data)

from launcher.results.compare import compare  # noqa: E402  (runs side by side; light imports)

cli.add_command(compare)

from launcher.term.completion import attach, completion  # noqa: E402  (click only)


def _profile_names():
    from launcher.profiles.profile import profile_names

    return profile_names()


def _source_names():
    """What `launch init --from` copies: the project's profiles and the shipped examples."""
    return sorted({*_profile_names(), *project.example_names()})


def _run_choices():
    """(id, state and backend) of the runs this machine knows, newest first; a TAB creates no registry."""
    from launcher.store import registry

    runs = registry.all_runs() if registry.db_path().is_file() else []
    return [(r.id, f"{r.state}, {r.backend}") for r in runs]


cli.add_command(completion)
attach(cli, _profile_names, _run_choices, _source_names)  # last: every command above completes profiles and run ids


# What a finished command's process still waits on before it exits, and how long it may: Python joins
# every non-daemon thread (threading._shutdown: SkyPilot's SDK and concurrent.futures pools, whose
# own exit hook joins their workers), then runs the atexit handlers (SkyPilot's request DB `_cleanup`,
# sky/server/requests/requests.py, closes it with asyncio.run: it waits on that SQLite file's lock
# while another `launch status` beside it holds it). None of that is the command's work: every
# registry write is a committed SQLite transaction by the time the command returns, and its output is
# flushed first. So after EXIT_GRACE_S the process ends with the command's exit code (os._exit): an
# SQLite file left unclosed is consistent (its journal), a pool thread's result has no reader left.
EXIT_GRACE_S = 5.0


def _bounded_exit(code) -> None:
    """Let the interpreter exit as usual, but for at most EXIT_GRACE_S (a daemon thread that outlives
    the joins and the atexit handlers, and ends the process if they still run)."""
    status = code if isinstance(code, int) else 0 if code is None else 1

    def flush():
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed pipe, a dead terminal: nothing more to say there
                stream.flush()

    def end():
        flush()
        os._exit(status)

    flush()
    timer = threading.Timer(EXIT_GRACE_S, end)
    timer.daemon = True
    timer.start()


def main():
    interrupt_on_signals()
    try:
        try:
            cli(prog_name="launch")
        finally:
            signals_end_at_once()
    except SystemExit as e:  # click's standalone mode ends every command so
        _bounded_exit(e.code)
        raise
    except KeyboardInterrupt as e:  # a signal as the command ended (its work done): its code, quietly
        code = 128 + int(getattr(signal, _how(e))) if _how(e) in INTERRUPTING else 130
        _bounded_exit(code)
        raise SystemExit(code) from None


if __name__ == "__main__":
    main()
