"""`launch init NAME --from PROFILE`: a new profile from an existing one, comments kept.

The new `clusters/NAME.yaml` is the source's text with `name:` (and the `launch ... SOURCE` commands
in its comments) changed to NAME, checked like every profile before it is written; an existing file
is never overwritten. What the copy still shares with its source (a volume or bucket name, which
would put both profiles' checkpoints on one volume) is said in the one line of what to edit next.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import click


def profile_text(source_text: str, source: str, name: str) -> str:
    """The source profile's text for a profile called `name`: the top-level `name:` line (its comment
    kept) and `launch <command> SOURCE` in comments renamed; everything else as it was."""
    out, renamed = [], False
    for line in source_text.splitlines(keepends=True):
        m = re.match(r"^name:(\s*)(\S+)(.*)$", line.rstrip("\n"))
        if m and not renamed:
            line = f"name:{m.group(1) or ' '}{name}{m.group(3)}\n"
            renamed = True
        elif line.lstrip().startswith("#"):
            line = re.sub(rf"(\blaunch [a-z]+ ){re.escape(source)}(?![\w-])", rf"\g<1>{name}", line)
            line = re.sub(rf"^# {re.escape(source)}:", f"# {name}:", line)
        out.append(line)
    text = "".join(out)
    if not renamed:
        text = f"name: {name}\n" + text
    return text


def init_profile(name: str, source: str) -> tuple[Path, list[str]]:
    """Write clusters/NAME.yaml from SOURCE; (its path, what to edit next). Raises ProfileError."""
    from payload.config import ConfigError, check_name

    from launcher.profiles import profile as profiles

    try:
        check_name(name)
    except (ConfigError, ValueError) as e:
        raise profiles.ProfileError([f"launch init {name}: {e}"]) from None
    src_path = profiles.resolve_profile_path(source)
    src = profiles.load_profile(str(src_path))  # a broken source is reported as it is
    dest = profiles.CLUSTERS_DIR / f"{name}.yaml"
    if dest.exists():
        raise profiles.ProfileError([f"{dest} already exists: pick another name, or edit it "
                                     f"(`launch validate {name}` checks it)"])
    text = profile_text(src_path.read_text(encoding="utf-8"), src.name, name)
    with tempfile.TemporaryDirectory(prefix="launch-init-") as d:
        candidate = Path(d) / f"{name}.yaml"
        candidate.write_text(text, encoding="utf-8")
        new = profiles.load_profile(str(candidate))  # the copy must validate before it is written
    with open(dest, "x", encoding="utf-8") as f:  # "x": never overwrite, even if it appeared just now
        f.write(text)
    shared = [f"{kind}.name `{s.name}`" for kind, s in (("volume", new.cluster.volume), ("bucket", new.cluster.bucket))
              if s is not None]
    edits = ([f"cluster.{s} (shared with {src.name}: give this profile its own)" for s in shared]
             + ["description", "data.sources", "budget.max_usd"])
    return dest, edits


@click.command()
@click.argument("name")
@click.option("--from", "source", required=True, metavar="PROFILE",
              help="The profile (name or path) to start from; its comments are kept.")
def init(name, source):
    """Start a new profile clusters/NAME.yaml from an existing one (never overwrites).

    Example: launch init my-h100 --from sonia-h100
    """
    from launcher.term.ui import console, hints, literal

    dest, edits = init_profile(name, source)
    try:
        shown = dest.relative_to(Path.cwd())
    except ValueError:
        shown = dest
    console().print(literal("[green]✓[/] ", f"wrote {shown} from {source}; edit next: {', '.join(edits)}"),
                    soft_wrap=True)
    hints(f"launch validate {name}", f"launch plan {name}")
