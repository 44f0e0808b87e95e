"""The GPU check's results: one JSON file and a markdown table under bench/results/, named by GPU
and date, and the summary printed at the end. Rows pair each payload run with its plain-Trainer
baseline: speed ratio (real tokens/s) and, for both, the preflight estimate against the peak."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

TARGETS = {"speedup": 1.5, "mfu": 0.40, "estimate_error": 0.15}


def slug(device: Optional[str]) -> str:
    return re.sub(r"[^a-z0-9]+", "-", (device or "cpu").lower()).strip("-")


def ratio(a, b) -> Optional[float]:
    return round(a / b, 3) if a and b else None


def pair(rows: list[dict]) -> list[dict]:
    """Payload rows with their baseline (their own or the shared `baseline_of` one) and the ratios."""
    base = {r["mode"]: r for r in rows if r.get("role") == "baseline"}
    out = []
    for r in rows:
        if r.get("role") != "payload":
            continue
        b = base.get(r.get("baseline_of") or r["mode"]) or {}
        out.append({**r, "baseline": b, "speedup": ratio(r.get("tokens_per_s"), b.get("tokens_per_s")),
                    "estimate_ratio": ratio(r.get("estimate_gb"), r.get("measured_peak_gb")),
                    "baseline_estimate_ratio": ratio(b.get("estimate_gb"), b.get("measured_peak_gb"))})
    return out


def write(results: dict, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{slug(results.get('device'))}-{results['date']}" + ("-smoke" if results.get("smoke") else "")
    jpath, mpath = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    jpath.write_text(json.dumps(results, indent=1, default=str) + "\n")
    mpath.write_text(markdown(results))
    return jpath, mpath


def _f(x, fmt="{:,.0f}", none="-"):
    return none if x is None else fmt.format(x)


def _gb(r: dict) -> str:
    return f"{_f(r.get('peak_allocated_gb'), '{:.1f}')} / {_f(r.get('measured_peak_gb'), '{:.1f}')}"


def _status(r: dict) -> str:
    return "ok" if r.get("status") == "ok" else f"{r.get('status')}: {r.get('reason', '')}".replace("|", "/")


def markdown(results: dict) -> str:
    env = results.get("env", {})
    vers = ", ".join(f"{k} {v}" + (" (carried)" if env.get("origin", {}).get(k) == "carried wheel" else "")
                     for k, v in env.get("versions", {}).items() if v)
    lines = [
        f"# GPU check: {results.get('device') or 'CPU (smoke)'}, {results['date']}", "",
        f"`{results['command']}`; {results['steps']} steps ({results['warmup']} warm-up steps not timed), "
        f"batch {results['batch']} x seq {results['seq']}, data: {results['data']}.", "",
        *(["**Smoke run (tiny shapes on CPU): it proves the harness, its figures measure nothing.**", ""]
          if results.get("smoke") else []),
        f"Versions: Python {env.get('python')}, {vers}.",
        f"Peak for MFU: {results.get('peak_source')}.", "",
        "Memory: allocated / measured peak GiB (torch's peak reserved + CUDA memory outside torch); "
        "estimate = payload/model/memory.py; ratio = estimate / measured peak. Speed = real (non-pad) tokens/s; "
        "baseline = plain transformers Trainer, same model/data/batch/seq, padded batches, checkpointing on. "
        "loss: the payload's training loss at its log points, first -> last (n points).", "",
        "| mode | payload tok/s | MFU | mem GiB | est GiB (ratio) | ckpt / liger / pad-free | attn | loss | "
        "baseline tok/s | MFU | mem GiB | est GiB (ratio) | speedup | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in pair(results["rows"]):
        b = r["baseline"]
        lines.append(
            f"| {r['mode']} | {_f(r.get('tokens_per_s'))} | {_f(r.get('mfu'), '{:.1%}')} | {_gb(r)} | "
            f"{_f(r.get('estimate_gb'), '{:.1f}')} ({_f(r.get('estimate_ratio'), '{:.2f}')}) | "
            f"{_yn(r.get('gradient_checkpointing'))} / {_yn(r.get('liger'))} / {_yn(r.get('padding_free'))} | "
            f"{r.get('attn_used') or '-'} | {loss_path(r)} | {_f(b.get('tokens_per_s'))} | {_f(b.get('mfu'), '{:.1%}')} | {_gb(b)} | "
            f"{_f(b.get('estimate_gb'), '{:.1f}')} ({_f(b.get('baseline_estimate_ratio') or r.get('baseline_estimate_ratio'), '{:.2f}')}) | "
            f"{_f(r.get('speedup'), '{:.2f}x')} | {_status(r)}; baseline {_status(b) if b else 'shared/none'} |")
    lines += ["", "Targets: payload LoRA bf16 >= 1.5x the baseline's real tokens/s; MFU >= 40% on the 8B "
              "shape at seq 4096; estimate within +-15% of the measured peak (ratio 0.85-1.15).", ""]
    return "\n".join(lines)


def loss_path(r: dict) -> str:
    pts = r.get("losses") or []
    if len(pts) < 2:
        return _f(r.get("last_loss"), "{:.3f}")
    return f"{pts[0][1]:.3f} -> {pts[-1][1]:.3f} ({len(pts)})"


def _yn(x) -> str:
    return "-" if x is None else ("on" if x else "off")


CATALOG_NAME = {"H100 SXM": "H100-SXM", "H100 PCIe": "H100", "H200": "H200", "A100": "A100-80GB", "L40S": "L40S"}


def citations(results: dict, json_path: str) -> list[str]:
    """`launcher/plan/throughput.py` MEASURED entries for the payload rows that ran (paste them there)."""
    from gpu_flops import gpu_key

    accel = CATALOG_NAME.get(gpu_key(results.get("device") or "") or "")
    out = []
    for r in pair(results["rows"]):
        if accel and r.get("status") == "ok" and r.get("tokens_per_s") and r.get("params_b"):
            method = "full" if r["mode"].startswith("full") else "qlora" if r["mode"].startswith("qlora") else "lora"
            out.append(f'("{accel}", "{method}"): ({r["tokens_per_s"]}, {r["params_b"]}, "{json_path}#{r["mode"]}"),')
    return out


def summary(results: dict) -> str:
    lines = [f"gpu-check on {results.get('device') or 'CPU (smoke)'}: {len(results['rows'])} runs"]
    for r in pair(results["rows"]):
        if r.get("status") != "ok":
            lines.append(f"  {r['mode']:<16} {_status(r)}")
            continue
        lines.append(f"  {r['mode']:<16} {_f(r.get('tokens_per_s'))} tok/s, MFU {_f(r.get('mfu'), '{:.1%}')}, "
                     f"{_f(r.get('speedup'), '{:.2f}x')} baseline, peak {_f(r.get('measured_peak_gb'), '{:.1f}')} "
                     f"GiB vs estimate {_f(r.get('estimate_gb'), '{:.1f}')}")
    return "\n".join(lines)
