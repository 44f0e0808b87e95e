"""A plan's dollars: the middle figure (every billed phase x $/hour, `billed`) and what `launch plan`
adds around it: the low-high range of hours and dollars, the eval by generation phase, spot told
honestly, what the checkpoint cadence costs, and the over-budget line (`launch up` asks: budget_gate.py).

- Range: training (and the stages, and the spot recoveries that scale with training) take the
  throughput range of launcher/plan/speed.py; every other phase keeps its figure. low = the fast end.
- Eval by generation (CER/WER, `evaluation:`): every `eval_steps`, `max_samples` validation records,
  then the final split; each generation batch (per_device_eval_batch_size) decodes up to
  max_new_tokens at throughput.decode_steps_per_s, plus its prompt's prefill (negligible).
  Test records: counted for local data, else `max_test_samples`, else 10% of the train records
  (assumption: a 90/10 split when the hub dataset's test size is not known offline).
- Spot: where the catalog's spot price is not below on-demand (SkyPilot's RunPod catalog), spot
  only adds expected recoveries: the plan says so. Each alternative is priced with its own hours
  (spot with recoveries, on-demand with idle-before-autostop instead).
- Save cadence: where checkpoint saves are over SAVE_SHARE_NOTE of the bill (a full fine-tune's
  checkpoint holds weights + Adam state, 14 bytes per parameter), one line with their hours and
  dollars and the first of SAVE_FACTORS x train.checkpoints.save_steps that brings them under it.
"""

from __future__ import annotations

import math
import random
from typing import Optional

from launcher.term.units import hours, money  # money: sub-cent figures keep their digits, "$0.0042", never "$0.00"

SCALES_WITH_TRAINING = ("training", "spot recoveries")
TEST_SHARE_ASSUMED = 0.1
SAVE_SHARE_NOTE = 0.10  # checkpoint saves above this share of the planned dollars get a line
SAVE_FACTORS = (2, 5, 10, 20, 50)


def billed(phases: list, price: float) -> tuple[float, float, float]:
    """The plan's middle figure: (training hours, total billed hours, dollars) of its billed phases
    (launcher/plan/phases.py) at `price` per hour."""
    train_h = sum(ph.hours for ph in phases if ph.name == "training")
    total_h = sum(ph.hours for ph in phases)
    return train_h, total_h, round(total_h * price, 4)


def eval_generation_hours(p, decode_steps_per_s: float, steps: int, test_records: Optional[int]) -> tuple[float, str]:
    """(hours, source) of generation-based evaluation during and after training."""
    ev = p.evaluation
    if ev is None or not decode_steps_per_s:
        return 0.0, ""
    batch = max(p.train.per_device_eval_batch_size, 1)
    evals = steps // max(p.train.eval_steps or 0, 1) if (ev.during_training and p.train.eval_steps) else 0
    during = evals * math.ceil(ev.max_samples / batch) * ev.max_new_tokens / decode_steps_per_s
    final, n_test = 0.0, 0
    if ev.final_split:
        n_test = test_records if test_records is not None else int(
            (p.estimate.train_records or 0) * TEST_SHARE_ASSUMED)
        if ev.max_test_samples:
            n_test = min(n_test, ev.max_test_samples)
        final = math.ceil(n_test / batch) * ev.max_new_tokens / decode_steps_per_s
    src = (f"{evals} x {ev.max_samples} val + {n_test} {ev.final_split or ''} records x {ev.max_new_tokens} "
           f"tokens at ~{decode_steps_per_s:.0f} decode steps/s, batch {batch}")
    return (during + final) / 3600, src


def ranged(phases: list, train_low_factor: float, train_high_factor: float, price: float) -> dict:
    """{hours: {low, mid, high}, usd: {...}} from the phases; training-like phases scale by the
    throughput range (factor = mid speed / low-or-high speed)."""
    mid = sum(ph.hours for ph in phases)
    scaled = sum(ph.hours for ph in phases if ph.name in SCALES_WITH_TRAINING)
    low = mid - scaled + scaled * train_low_factor
    high = mid - scaled + scaled * train_high_factor
    exact = {"low": low, "mid": mid, "high": high}
    # dollars from the unrounded hours, to the 4 decimals of the middle figure (a CPU demo costs $0.0010)
    return {"hours": {k: round(v, 3) for k, v in exact.items()},
            "usd": {k: round(v * price, 4) for k, v in exact.items()}}


def spot_note(use_spot: bool, price: float, total_usd: float, alt: Optional[dict]) -> Optional[str]:
    """One line when spot saves nothing in the catalog (spot price >= on-demand price): which of the
    two is cheaper for this run, each with its own hours."""
    if not alt:
        return None
    spot_price, od_price = (price, alt["price_per_hour"]) if use_spot else (alt["price_per_hour"], price)
    if spot_price < od_price:
        return None
    spot_usd, od_usd = (total_usd, alt["total_usd"]) if use_spot else (alt["total_usd"], total_usd)
    cheaper = "on-demand" if od_usd <= spot_usd else "spot (no idle time before autostop)"
    return (f"the catalog has no spot discount here (spot ${spot_price:,.2f}/h, on-demand ${od_price:,.2f}/h): "
            f"spot adds expected recoveries; for this run {cheaper} is cheaper "
            f"(spot ~${spot_usd:,.2f}, on-demand ~${od_usd:,.2f})")


def over_budget(plan) -> Optional[str]:
    """One line when the planned cost (middle figure) exceeds the profile's own budget cap."""
    if not plan.budget_usd or plan.total_usd <= plan.budget_usd:
        return None
    usd = plan.ranges.get("usd", {}) if plan.ranges else {}
    rng = f" (range {money(usd['low'])}-{money(usd['high'])})" if usd else ""
    return (f"planned ~{money(plan.total_usd)}{rng} is over the budget cap {money(plan.budget_usd)}: the run stops "
            f"at the cap with a resumable checkpoint; raise budget.max_usd or shorten the run")



def padding_share(lengths: list, batch: int, seed: int) -> float:
    """Share of padding in padded batches of `batch` records, in a seeded random order (the Trainer's)."""
    order = list(lengths)
    random.Random(seed).shuffle(order)
    padded = sum(len(order[i:i + batch]) * max(order[i:i + batch]) for i in range(0, len(order), batch))
    return 1.0 - sum(order) / padded if padded else 0.0


def packing_note(p, data, train_hours: float, price: float) -> Optional[str]:
    """One line: what `train.packing` would save for this profile, from the counted record lengths."""
    from launcher.profiles.schema import total_gpus

    t = p.train
    if t.packing:
        return None
    if not data.lengths:
        return "off; what it would save needs the records' lengths (counted from local data files only)"
    lengths = [min(x, t.max_seq_length) for x in data.lengths]
    share = padding_share(lengths, t.per_device_batch_size, t.seed)
    per_step = t.per_device_batch_size * t.gradient_accumulation_steps * total_gpus(p)
    steps = f"{math.ceil(len(lengths) / per_step):,} -> {math.ceil(sum(lengths) / t.max_seq_length / per_step):,}"
    if t.padding_free is False:
        return (f"off: padded batches of {t.per_device_batch_size} are ~{share:.0%} padding; train.packing: true "
                f"would save ~{hours(train_hours * share)}, ~{money(train_hours * share * price)} (steps/epoch "
                f"{steps}), train.padding_free: auto the same time with the same math")
    images = " (records with images: padded)" if p.model.kind == "image_text_to_text" else ""
    return (f"off: padding-free batches{images}, so the ~{share:.0%} padding of padded batches of "
            f"{t.per_device_batch_size} costs nothing; packing (changes the records per step) would cut steps/epoch "
            f"{steps}: per-step overhead only, ~0 h of compute")


def save_note(save_steps: int, phases: list, total_hours: float, price: float) -> Optional[str]:
    """One line when checkpoint saves are over SAVE_SHARE_NOTE of the bill: what they cost in hours
    and dollars, and a save_steps (a multiple of today's, so eval and save stay aligned) under it.
    The count is the saves phase's own (plan.phases: `N x SIZE GB at ...`)."""
    saves = next((ph for ph in phases if ph.name == "checkpoint saves"), None)
    if saves is None or not total_hours or saves.hours / total_hours <= SAVE_SHARE_NOTE:
        return None
    saves_h, n = saves.hours, int(saves.source.split(" x ", 1)[0])
    steps = n * save_steps  # to within one save interval
    each, rest = saves_h / n, total_hours - saves_h
    line = (f"checkpoint saves are {saves_h / total_hours:.0%} of the bill: {n} saves, one every {save_steps:,} "
            f"steps, ~{saves_h:.1f} h, ~${saves_h * price:,.2f}")
    for k in SAVE_FACTORS:
        m = steps // (save_steps * k)
        if m * each / (rest + m * each) <= SAVE_SHARE_NOTE:
            return (f"{line}; train.checkpoints.save_steps: {save_steps * k} would make it {m} saves, "
                    f"~{m * each:.1f} h, ~${m * each * price:,.2f} (a longer interval loses more work "
                    "when the run fails)")
    return f"{line}; raise train.checkpoints.save_steps"
