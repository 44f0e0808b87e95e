"""`launch init NAME --from PROFILE`: a new profile from an existing one or a shipped example, comments kept.

The new `clusters/NAME.yaml` (of the project; in a directory with none, the project is made there) is
the source's text with `name:` (and the `launch ... SOURCE` commands
in its comments) changed to NAME, checked like every profile before it is written; an existing file
is never overwritten. What the copy still shares with its source (a volume or bucket name, which
would put both profiles' checkpoints on one volume) is said in the one line of what to edit next.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import click

from launcher import project
from launcher.term.ui import hints, note


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


def source_path(source: str) -> tuple[Path, Path]:
    """(the source profile's file, the root its relative data paths are read from): a path or a profile
    of this project first, else a shipped example (its data lies in this install: payload/samples/)."""
    from launcher.profiles import profile as profiles

    p = Path(source)
    found = project.find()
    made = found is not None and (found / project.MARKER).is_dir()  # a project already (not just named)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p, (found or p.resolve().parent)
    if made and (found / project.MARKER / f"{source}.yaml").is_file():
        return profiles.resolve_profile_path(source), found
    example = project.examples_dir() / f"{source}.yaml"
    if example.is_file():
        return example, project.PACKAGE_ROOT
    if made:
        return profiles.resolve_profile_path(source), found  # raises, naming the known profiles
    examples = ", ".join(project.example_names())
    raise profiles.ProfileError([f"no profile or shipped example `{source}`: the examples are {examples} "
                                 f"(or give a path to a .yaml file)"])


def data_to_copy(src, src_root: Path, dest_root: Path, name: str) -> dict[str, tuple[Path, str]]:
    """{path as the profile writes it: (the file to copy, its path in the new project)} for the local
    data files the source names that lie beside the source but not in the new project (an example's
    sample data); they go under data/NAME/, and the copy's text names them there."""
    from launcher.profiles.boundary import inside

    wanted = {}
    blocks = [src.data] + [st.data for st in src.stages if st.data is not None]
    for block in blocks:
        for s in block.sources:
            if not s.path or inside(dest_root, s.path) and (dest_root / s.path).is_file():
                continue  # a Hub dataset, or already in the project at that path
            rel = inside(src_root, s.path)
            if rel is not None and (src_root / rel).is_file():
                wanted[s.path] = (src_root / rel, f"data/{name}/{Path(rel).name}")
    return wanted


def with_paths(text: str, moved: dict[str, tuple[Path, str]]) -> str:
    """The profile's text with each moved data path, written as a YAML value, replaced by its new path."""
    for old, (_, new) in moved.items():
        text = re.sub(rf"(:[ \t]+)(['\"]?){re.escape(old)}\2(?=[ \t]*(#|$))", rf"\g<1>\g<2>{new}\g<2>", text,
                      flags=re.M)
    return text


def init_profile(name: str, source: str) -> tuple[Path, list[str], list[str]]:
    """Write clusters/NAME.yaml of the project (made here when there is none) from SOURCE, a profile of
    the project or a shipped example, with the sample data the example needs; (its path, what to edit
    next, the data files copied). Raises ProfileError."""
    from payload.config import ConfigError, check_name

    from launcher.profiles import profile as profiles

    try:
        check_name(name)
    except (ConfigError, ValueError) as e:
        raise profiles.ProfileError([f"launch init {name}: {e}"]) from None
    src_path, src_root = source_path(source)
    src = profiles.load_profile(str(src_path))  # a broken source is reported as it is
    dest_root = project.find() or Path.cwd().absolute()
    dest = dest_root / project.MARKER / f"{name}.yaml"
    if dest.exists():
        raise profiles.ProfileError([f"{dest} already exists: pick another name, or edit it "
                                     f"(`launch validate {name}` checks it)"])
    moved = data_to_copy(src, src_root, dest_root, name)
    text = with_paths(profile_text(src_path.read_text(encoding="utf-8"), src.name, name), moved)
    with tempfile.TemporaryDirectory(prefix="launch-init-") as d:
        candidate = Path(d) / f"{name}.yaml"
        candidate.write_text(text, encoding="utf-8")
        new = profiles.load_profile(str(candidate))  # the copy must validate before it is written
    dest.parent.mkdir(parents=True, exist_ok=True)
    copied = []
    for file, rel in moved.values():
        target = dest_root / rel
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file, target)
            copied.append(rel)
    with open(dest, "x", encoding="utf-8") as f:  # "x": never overwrite, even if it appeared just now
        f.write(text)
    shared = [f"{kind}.name `{s.name}`" for kind, s in (("volume", new.cluster.volume), ("bucket", new.cluster.bucket))
              if s is not None]
    edits = ([f"cluster.{s} (shared with {src.name}: give this profile its own)" for s in shared]
             + ["description", "data.sources", "budget.max_usd"])
    return dest, edits, copied


@click.command()
@click.argument("name")
@click.option("--from", "source", required=True, metavar="PROFILE",
              help="The profile (name or path) or shipped example to start from; its comments are kept.")
def init(name, source):
    """Start a profile clusters/NAME.yaml from a profile or a shipped example (never overwrites).

    In a directory with no launch project, the project is made there (clusters/, and the example's
    sample data under data/NAME/). `launch profiles` lists the examples.

    Example: launch init my-h100 --from sonia-h100
    """
    dest, edits, copied = init_profile(name, source)
    try:
        shown = dest.relative_to(Path.cwd())
    except ValueError:
        shown = dest
    note("[green]✓[/] ", f"wrote {shown} from {source}; edit next: {', '.join(edits)}")
    if copied:
        note("  data: ", f"copied {', '.join(copied)} (the example's sample data)")
    hints(f"launch validate {name}", f"launch plan {name}")
