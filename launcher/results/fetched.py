"""What a run produced, looked at from here: `launch checkpoints RUN`, `launch eval RUN`, `launch chat RUN`.

- checkpoints: one row per checkpoint (step, eval loss, generation metric, size, verified or not).
  A run of the local backend is read in place (each checkpoint's files checked against its COMPLETE
  marker, payload/volume/verify.py); any other run from the checkpoint index the payload rewrites at
  every save (`outputs/checkpoints.json`), read on its machine the way `launch status` reads
  status.json (ssh: the stored connection; SkyPilot: ssh to the cluster while up, else the volume),
  else from the fetched `checkpoints.json` (`launch down --fetch-artifacts`).
- eval: `payload eval` on this machine, with the fetched adapter and the run's resolved config; the
  split is rebuilt by the data stage (hub datasets need network), scores land beside the artifacts.
- chat: base model + fetched adapter on CPU (payload/outputs/infer.py, the same generation as eval).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Optional

import click

from launcher import project, trainenv
from launcher.errors import BackendError
from launcher.runs.refresh import backend_for
from launcher.term.tables import Column, print_table
from launcher.term.ui import cell, console, err_console, note
from launcher.term.units import human_size, json_text

from payload import layout

DEST_HELP = "Where `launch down --fetch-artifacts` put the run's artifacts."


def _say(line: str) -> None:
    note("  ", line, out=err_console())


def _run(run_id: Optional[str]):
    from launcher.store import registry

    return registry.get(run_id)


def _local_run_dir(run) -> Optional[Path]:
    if run.backend != "local":
        return None
    from launcher.backends.local import LocalBackend

    d = LocalBackend().run_dir(run)
    return d if d.is_dir() else None


def checkpoint_rows(run, dest: Path) -> tuple[list[dict], str]:
    """(rows, where they came from)."""
    from payload.volume import checkpoints as ck
    from payload.volume import verify

    rd = _local_run_dir(run)
    if rd is not None:  # the rows carry the markers' eval loss and generation metrics (eval_cer, ...)
        root = ck.checkpoints_dir(rd)
        return [{**row, "verified": row["complete"] and not verify.verify_checkpoint(root / row["name"])}
                for row in ck.checkpoint_listing(rd)], str(root)
    live, why = _live_index(run)
    listing = Path(dest) / run.id / "checkpoints.json"
    if live is not None:
        rows, source = live, f"the run's {layout.CHECKPOINT_LISTING} on its {run.backend} machine (live)"
    elif listing.is_file():
        rows, source = _rows(listing.read_text()), str(listing)
    else:
        raise BackendError(f"no checkpoint listing for {run.id}: {why or 'the run has none yet'}, and none "
                           f"fetched here ({listing}); fetch it with `launch down {run.id} --fetch-artifacts` "
                           "(or give --dest)")
    # The machine wrote the listing after checking each checkpoint against its marker (complete = verified there).
    return [{**r, "verified": bool(r.get("complete"))} for r in rows if isinstance(r, dict)], source


def _rows(text: Optional[str]) -> Optional[list]:
    try:
        rows = json.loads(text) if text else None
    except ValueError:
        return None
    return rows if isinstance(rows, list) else None


def _live_index(run) -> tuple[Optional[list], Optional[str]]:
    """(rows, None) from the checkpoint index the payload rewrites at every save
    (payload/checkpoints.write_index), read where the run is by its backend (as `launch status`
    reads status.json); (None, why not) when it cannot be had there."""
    try:
        text = backend_for(run).read_run_file(run, layout.CHECKPOINT_LISTING)
    except BackendError as e:
        return None, f"its machine could not be read ({e})"
    rows = _rows(text)
    return (rows, None) if rows is not None else (None, "its machine has no checkpoint index (or is gone)")


@click.command()
@click.argument("run_id", required=False)
@click.option("--dest", type=click.Path(file_okay=False), default=project.artifacts_default,
              show_default="the project's artifacts/", help=DEST_HELP)
@click.option("--json", "as_json", is_flag=True)
def checkpoints(run_id, dest, as_json):
    """List a run's checkpoints: step, eval loss, CER/WER, size, verified.

    Example: launch checkpoints well-log-ocr-spot-20261123-101500
    """
    from rich.text import Text

    run = _run(run_id)
    rows, source = checkpoint_rows(run, Path(dest))
    if not as_json:
        console().print(cell(f"{run.id}: {len(rows)} checkpoint(s) from {source}"), soft_wrap=True)
    columns = [Column("checkpoint", lambda r: str(r.get("name")), must_copy=True),
               Column("step", lambda r: str(r.get("step")), justify="right"),
               Column("eval loss", lambda r: _fmt(r.get("eval_loss")), priority=1, justify="right"),
               Column("cer", lambda r: _fmt(r.get("eval_cer")), priority=2, justify="right"),
               Column("wer", lambda r: _fmt(r.get("eval_wer")), priority=3, justify="right"),
               Column("size", lambda r: _size(r.get("bytes")), priority=4, justify="right"),
               Column("verified", lambda r: Text("✓", style="green") if r["verified"] else Text("✗", style="red"))]
    print_table(rows, columns, as_json, console=console(),
                json_value={"run": run.id, "source": source, "checkpoints": rows})


def _fmt(v) -> str:
    return "-" if not isinstance(v, (int, float)) else f"{v:.4f}"


def _size(n) -> str:
    return human_size(int(n)) if isinstance(n, (int, float)) else "-"


# ------------------------------------------------------------------------------------ eval / chat


def local_config(run, dest: Path):
    """(run config, adapter dir, output dir) for a run evaluated here: the run's resolved config with
    its run directory under `{dest}/{run_id}/.eval` (data, the tiny base), the adapter as fetched (a
    local-backend run: in place). Scores go to `{dest}/{run_id}/eval/`, outside every file the run's
    MANIFEST describes, so scoring never stops a later `launch down --fetch-artifacts` from verifying."""
    from payload.config import load_run_config

    rd = _local_run_dir(run)
    if rd is not None:
        _require_adapter(run, rd / "outputs" / "adapter", fetched=True)
        return load_run_config(rd / "config.yaml", env={}), rd / "outputs" / "adapter", Path(dest) / run.id / "eval"
    target = Path(dest) / run.id
    adapter = target / "adapter"
    config = _config_for(run)
    _require_adapter(run, adapter, fetched=target.is_dir())
    cfg = load_run_config(config, env={})
    rt = cfg.runtime.model_copy(update={"volume": str(target.resolve() / ".eval"), "run_id": run.id})
    return cfg.model_copy(update={"runtime": rt}), adapter, target / "eval"


def _require_adapter(run, adapter: Path, fetched: bool) -> None:
    """One line naming the real fix when `adapter` is not there: fetch it, or (a run that ended
    before training finished: the adapter is written at its end) resume it or start a new one."""
    if adapter.is_dir() and any(adapter.iterdir()):
        return
    if not fetched:
        raise BackendError(f"no fetched adapter for {run.id} at {adapter}: run `launch down {run.id} "
                           "--fetch-artifacts` first (or give --dest)")
    if run.active:
        raise BackendError(f"{run.id} has no adapter yet: it is {run.state}, and training writes the adapter "
                           f"when it ends; follow it with `launch logs {run.id} --follow`")
    kept = _kept_checkpoint(adapter)
    why = (f"it ended {run.state} before training finished, and the adapter is written when training ends "
           f"({kept} is kept)" if kept else f"it ended {run.state} before training saved a checkpoint "
           f"(see `launch logs {run.id}`)")
    raise BackendError(f"{run.id} has no adapter: {why}; continue it with `launch up {run.profile} --resume "
                       f"{run.id}` or start a new run with `launch up {run.profile}`")


def _kept_checkpoint(adapter: Path) -> Optional[str]:
    """The newest complete checkpoint a run left, as `checkpoint-N` (None when it saved none): in its run
    directory (`adapter` is <run dir>/outputs/adapter), else in the checkpoint listing beside the adapter
    (<run dir>/outputs/checkpoints.json, or the fetched artifacts' checkpoints.json)."""
    from payload.volume import checkpoints as ck

    newest = ck.latest_complete(ck.checkpoints_dir(adapter.parent.parent))
    if newest is not None:
        return newest.name
    try:
        rows = json.loads((adapter.parent / "checkpoints.json").read_text())
    except (OSError, ValueError):
        return None
    steps = [r["step"] for r in rows if isinstance(r, dict) and r.get("complete") and isinstance(r.get("step"), int)] \
        if isinstance(rows, list) else []
    return f"checkpoint-{max(steps)}" if steps else None


def _config_for(run) -> Path:
    from launcher.profiles.render import config_path
    from launcher.store.state import state_dir

    private = state_dir() / "rendered" / run.id / f"{run.profile}.yaml"
    return private if private.is_file() else config_path(run.profile)


@click.command("eval")
@click.argument("run_id", required=False)
@click.option("--split", type=click.Choice(["val", "test"]), default=None,
              help="Split to score (default: the profile's evaluation.final_split).")
@click.option("--dest", type=click.Path(file_okay=False), default=project.artifacts_default,
              show_default="the project's artifacts/", help=DEST_HELP)
@click.option("--json", "as_json", is_flag=True)
def eval_(run_id, split, dest, as_json):
    """Score a run's adapter here (CER/WER/exact match, greedy: the same numbers as on the machine).

    Example: launch eval well-log-ocr-spot-20261123-101500 --split test
    """
    from payload.outputs import evaluate
    from payload.volume import observe

    run = _run(run_id)
    cfg, adapter, out = local_config(run, Path(dest))
    out.mkdir(parents=True, exist_ok=True)  # a --dest it cannot write: said before the model loads and scores
    trainenv.reexec(say=_say)  # the model loads in this process: with the training stack's Python
    observe.setup_logging(to="stderr")  # the payload's progress lines: never into --json on stdout
    with console().status(f"evaluating {run.id} on {split or 'the final split'}..."), _base_model_reach(cfg.model):
        result = evaluate.main(cfg, split, str(adapter), out_dir=out)
    if as_json:
        click.echo(json_text(result))
        return
    scores = ", ".join(f"{k} {result[k]:.4f}" for k in ("cer", "wer", "exact_match") if result.get(k) is not None)
    note("[green]✓[/] ", f"{run.id} {result['split']}: {result['n']} samples, {scores}")
    note("  ", result["file"])


@click.command()
@click.argument("run_id", required=False)
@click.option("--prompt", help="Answer this one prompt and exit (default: a prompt loop, which an empty line, "
              "/exit or /quit ends; the model loads again at the next `launch chat`).")
@click.option("--image", type=click.Path(exists=True, dir_okay=False), help="An image for vision-language models.")
@click.option("--max-new-tokens", type=int, default=256, show_default=True)
@click.option("--dest", type=click.Path(file_okay=False), default=project.artifacts_default,
              show_default="the project's artifacts/", help=DEST_HELP)
def chat(run_id, prompt, image, max_new_tokens, dest):
    """Talk to a run's fine-tuned adapter on this machine (base model + adapter, CPU is fine).

    Example: launch chat well-log-ocr-spot-20261123-101500 --prompt "Hello" --image header.png
    """
    from payload.outputs import infer
    from payload.volume import observe

    run = _run(run_id)
    cfg, adapter, _ = local_config(run, Path(dest))
    if image:
        _check_image(cfg.model, image)  # before seconds (or minutes) of loading the model
    trainenv.reexec(say=_say)  # the model loads in this process: with the training stack's Python
    observe.setup_logging(to="stderr")  # stdout carries the replies only
    with console().status(f"loading {cfg.model.name_or_path} + {adapter}..."), _base_model_reach(cfg.model):
        model, processing = infer.load(cfg, adapter)
    prompts = [prompt] if prompt is not None else None
    while True:
        text = prompts.pop(0) if prompts else (None if prompts is not None else _ask())
        if text is None:
            return
        reply = infer.answer(model, processing, [infer.chat_turns(text, image)], max_new_tokens)[0]
        click.echo(reply)


@contextlib.contextmanager
def _base_model_reach(model):
    """The base model comes from the Hub or its cache here: out of reach, one line naming it and the
    fix (transformers says so with a bare OSError, the Hub with its own errors), not a traceback."""
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        yield
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as e:
        if isinstance(e, OSError) and e.errno is not None:  # a file here: the CLI's own line names it
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise BackendError(f"cannot load {model.name_or_path} here: {first} It comes from the Hugging Face Hub "
                           f"or its cache on this machine: connect (HF_TOKEN for a gated model), or download it "
                           f"first: hf download {model.name_or_path}") from None


def _check_image(model, image: str) -> None:
    """`--image` only for a model that sees images (a text model's chat template drops it without a
    word), and only a file PIL can open."""
    if model.kind != "image_text_to_text":
        raise BackendError(f"--image: {model.name_or_path} is a text-only model (model.kind {model.kind}): it "
                           "would answer without seeing the image; drop --image")
    from PIL import Image

    try:
        with Image.open(image) as img:
            img.verify()
    except Exception as e:  # noqa: BLE001 - PIL raises several kinds for a file that is no image
        raise BackendError(f"--image {image}: not an image PIL can read ({type(e).__name__}); give a PNG or "
                           "JPEG file") from None


def _ask() -> Optional[str]:
    try:
        text = click.prompt(">", prompt_suffix=" ", default="", show_default=False)
    except (EOFError, click.exceptions.Abort):
        return None
    return text if text.strip() not in ("", "/exit", "/quit") else None
