"""`launch data preview PROFILE`: the first training examples exactly as the trainer sees them.

Runs the payload's own data stage on this machine (no GPU, nothing uploaded) and shows each example
as the chat template renders it: the masked (prompt) part dimmed, the trained part plain, with token
counts. That needs the model's tokenizer in the Hugging Face cache (read offline); without it the
examples are shown by role (system / user / assistant, masked or trained) and one line says what
the token view needs. The work happens in payload/data/preview.py.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from launcher import project
from launcher.term.ui import console, err_console, literal, note


@click.group()
def data():
    """Look at a profile's training data before paying for a GPU.

    Example: launch data preview lovecraft-a100-spot -n 2
    """


@data.command()
@click.argument("profile")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a profile value, e.g. --set data.sources.0.path=my.jsonl (as `launch up --set`).")
@click.option("-n", "n", default=3, show_default=True, type=click.IntRange(1, 100),
              help="How many training examples to show.")
@click.pass_context
def preview(ctx, profile, sets, n):
    """The first N training examples as the trainer sees them: chat template, masked part dimmed.

    Example: launch data preview lovecraft-a100-spot --set data.sources.0.path=my.jsonl -n 2
    """
    from payload.data import preview as pv
    from payload.errors import PayloadError

    from launcher.profiles.checks import load_checked
    from launcher.profiles.render import resolved_run_config

    p = load_checked(profile, overrides=tuple(sets))[0]
    cfg = resolved_run_config(p)
    with tempfile.TemporaryDirectory(prefix="launch-preview-") as tmp:
        cfg.runtime.volume = tmp  # the data check writes its sample here; nothing else is written
        tokenizer, why = pv.load_cached_tokenizer(cfg)
        try:
            records = pv.first_examples(cfg, None, Path(tmp), project.root(), tokenizer=tokenizer)
            template = pv.training_template(tokenizer, cfg.train.assistant_only_loss) if tokenizer else None
            _show(cfg, records[:n], tokenizer, template)
            refusal = _untrained(cfg, records, tokenizer, template)
        except PayloadError as e:
            note("[red]✗[/] ", f"{p.name}: {e}", out=err_console())
            ctx.exit(1)
        if refusal:
            note("[red]✗[/] ", f"{p.name}: {refusal}", out=err_console())
            ctx.exit(1)
    skipped = pv.hub_sources(cfg)
    if skipped and len(skipped) < len(cfg.data.sources):
        note("[yellow]![/] ", f"not shown: {', '.join(skipped)}, Hugging Face dataset(s) the preview does not "
             "download; the run reads them on the machine")
    if tokenizer is None and cfg.data.max_tokens:
        note("[yellow]![/] ", f"data.max_tokens {cfg.data.max_tokens} not applied here: the length filter "
             "needs the tokenizer")
    if tokenizer is None:
        note("[yellow]![/] ", f"shown by role: the token view (chat template text, token counts) needs the "
             f"tokenizer of {cfg.model.name_or_path} in the Hugging Face cache, read offline ({why}); it is "
             f"downloaded with the model on the first run, or now with "
             f"`hf download {cfg.model.name_or_path} --include 'tokenizer*' '*.json'`")


def _untrained(cfg, records: list[dict], tokenizer, template):
    """Say how many of the records read lose every trained token at train.max_seq_length (exact, with
    the tokenizer); the refusal line when that is all of them (None otherwise)."""
    from payload.data import preview as pv
    from payload.data.pipeline import SAMPLE_RECORDS

    if tokenizer is None or not cfg.train.assistant_only_loss or not records:
        return None
    prompts = pv.prompt_lengths(records, tokenizer, template)
    if prompts is None:  # records with images: their visual tokens are the processor's
        return None
    how = f"tokenized with the model's chat template; the first {SAMPLE_RECORDS:,} records of each source read"
    _n, line, refusal = pv.untrained_lines(prompts, len(records), cfg, how, exact=True)
    if line and not refusal:
        note("[yellow]![/] ", line)
    return refusal


def _show(cfg, records: list[dict], tokenizer, template) -> None:
    from rich.text import Text

    from payload.data import preview as pv

    out, t = console(), cfg.train
    if tokenizer is not None:
        import datasets

        datasets.disable_progress_bars()  # token_view builds the trainer's rows with `datasets`
    if not records:
        note("[yellow]![/] ", "no training examples: every record went to val/test or was dropped "
             "(see data.sources[].split)", out=out)
    for i, rec in enumerate(records, 1):
        head = f"── example {i} of {len(records)} (source {rec.get('source', '?')})"
        if tokenizer is not None:
            v = pv.token_view(rec, tokenizer, t.max_seq_length, t.assistant_only_loss, template)
            head += f": {v['tokens']} tokens, {v['trained']} trained"
            if v["images"]:
                head += f", {v['images']} image(s) (each <|image_pad|> widens to its patch tokens)"
            if v["truncated"]:
                head += f", {v['truncated']} cut at max_seq_length {t.max_seq_length}"
            out.print(Text(head, style="bold"))
            body = Text()
            for text, trained in v["spans"]:
                body.append(text, style="" if trained else "dim")
            out.print(body, soft_wrap=True)
        else:
            out.print(Text(head, style="bold"))
            for turn in pv.role_view(rec, t.assistant_only_loss):
                label = f"{turn['role']} ({'trained' if turn['trained'] else 'masked'})"
                out.print(Text(label, style="bold" if turn["trained"] else "dim bold"))
                out.print(Text(turn["text"], style="" if turn["trained"] else "dim"), soft_wrap=True)
    styled = out.color_system is not None  # none in a pipe, a file or a dumb terminal: no dim to explain
    out.print(literal("", "dim: masked (prompt, no loss); plain: trained. " * styled +
                      f"{'Only assistant turns train' if t.assistant_only_loss else 'Every token trains'} "
                      "(train.assistant_only_loss)."))
