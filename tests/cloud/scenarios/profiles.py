"""What a CPU pod needs changed in a shipped cloud profile, and nothing else, named once.

Every scenario runs a shipped profile from clusters/ through `launch up PROFILE` with these overrides
(`--set` for the profile, `--env` for the run's environment), each for a reason a pod of the emulated
RunPod imposes:
- the model: a tiny model of the same kind built from config (`model.tiny`), since there is no hub
  here and no GPU memory for 32B weights;
- the data: a few local records of the profile's shape (the Hugging Face datasets are out of reach);
- steps, batch and save interval: minutes of CPU, not hours of GPU;
- DeepSpeed and 4-bit quantization off, the optimizer a plain one: they need CUDA;
- the GPUs: `--env CUDA_VISIBLE_DEVICES=` (the pod has none; preflight warns, training runs on CPU);
- the payload's environment: `--env FLASH_ATTN_WHEEL=` (no flash-attn on CPU). The baked image sets
  LAUNCH_ENV_ROOT=/opt/launch-envs in its shell environment and holds there the CPU build of the
  environment under the key payload/gpu_env.sh computes for this lock (the real one installs the CUDA
  lock from the package index, which pods cannot reach); gpu_env.sh then reuses it as it would a
  complete environment on the volume.
"""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

# CUDA_VISIBLE_DEVICES empty: CUDA's own "no GPU" (the node SkyPilot asked for has GPUs; the emulated pod
# has none), which the payload's preflight reports as a warning and training takes as the CPU path.
ENV = ["--env", "FLASH_ATTN_WHEEL=", "--env", "CUDA_VISIBLE_DEVICES="]


def vl_data(dest: Path, n: int = 24, root: Path = REPO) -> list[str]:
    """n image+text records (messages format) with their images, under dest (inside the project `root`)."""
    from PIL import Image

    words = ["red", "green", "blue", "black", "white", "grey"]
    lines = []
    for i in range(n):
        colour = words[i % len(words)]
        Image.new("RGB", (32, 32), colour).save(dest / f"img{i}.png")
        lines.append(json.dumps({"messages": [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is this?"}]},
            {"role": "assistant", "content": f"It is {colour}."}], "images": [f"img{i}.png"]}))
    (dest / "vl.jsonl").write_text("\n".join(lines) + "\n")
    d = dest.relative_to(root)
    return ["--set", f"data.sources=[{{name: vl, path: {d}/vl.jsonl, format: messages, image_root: {d}, "
                     "split: {train: 0.8, val: 0.1, test: 0.1}}]"]


def text_data(dest: Path, n: int = 60) -> list[str]:
    """n alpaca records under dest (inside the repo)."""
    rows = [{"instruction": f"Describe the old house number {i}.", "input": "",
             "output": f"The house {i} stood grey and silent beyond the marsh."} for i in range(n)]
    (dest / "train_sft.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    d = dest.relative_to(REPO)
    return ["--set", f"data.sources=[{{name: lovecraft, path: {d}/train_sft.jsonl, format: alpaca, "
                     "instruction_as: system, split: {train: 0.9, val: 0.1}}]"]


SONIA_PRICE = 6.58  # $/h, RunPod 2x_H100-SXM_SECURE in the shipped catalog snapshot

TINY = "hidden_size: 64, num_layers: 2, vocab_size: 1024"


def sonia(data: Path, max_steps: int, save_steps: int, root: Path = REPO) -> list[str]:
    return [
        "--set", "model={name_or_path: tiny-qwen3-vl, kind: image_text_to_text, dtype: float32, "
                 f"attn_implementation: auto, tiny: {{arch: qwen3_vl, {TINY}}}}}",
        *vl_data(data, root=root),
        "--set", "train.deepspeed=null",
        "--set", "train.per_device_batch_size=1", "--set", "train.gradient_accumulation_steps=1",
        "--set", "train.effective_batch_size=null", "--set", "train.max_seq_length=256",
        "--set", "train.gradient_checkpointing=false", "--set", f"train.max_steps={max_steps}",
        "--set", "train.logging_steps=1", "--set", f"train.eval_steps={save_steps}",
        "--set", f"train.checkpoints.save_steps={save_steps}",
        "--set", "outputs.merge=false",
        *ENV,
    ]


def lovecraft(data: Path, max_steps: int, save_steps: int) -> list[str]:
    return [
        "--set", "model={name_or_path: tiny-qwen3, kind: causal_lm, dtype: float32, attn_implementation: auto, "
                 f"tiny: {{arch: qwen3, {TINY}}}}}",
        *text_data(data),
        "--set", "train.method=lora", "--set", "train.quantization=null", "--set", "train.optimizer=adamw_torch",
        "--set", "train.lora.r=8", "--set", "train.lora.alpha=16",
        "--set", "train.per_device_batch_size=2", "--set", "train.gradient_accumulation_steps=1",
        "--set", "train.max_seq_length=128", "--set", "train.packing=false",
        "--set", "train.gradient_checkpointing=false", "--set", f"train.max_steps={max_steps}",
        "--set", "train.logging_steps=1", "--set", f"train.eval_steps={save_steps}",
        "--set", f"train.checkpoints.save_steps={save_steps}", "--set", "train.checkpoints.expected_preemption_hours=null",
        "--set", "train.early_stopping_patience=null", "--set", "outputs.export_mlx=false",
        *ENV,
    ]


QWEN_PRICE = 4.10 * 8 * 2  # $/h: the profile's cluster.slurm.price_per_gpu_hour x 8 GPUs x 2 nodes


def qa_csv(dest: Path, n: int = 64) -> list[str]:
    """n records of runbook 004's CSV (prompt, question, response) under dest (inside the repo)."""
    import csv

    with (dest / "training_data.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["prompt", "question", "response"])
        for i in range(n):
            w.writerow(["You are concise.", f"What is {i} plus {i}?", f"{i} plus {i} is {2 * i}."])
    d = dest.relative_to(REPO)
    return ["--set", f"data.sources=[{{name: qa, path: {d}/training_data.csv, format: prompt_response, "
                     "split: {train: 0.9, val: 0.1}}]"]


def qwen3_32b(data: Path, max_steps: int, save_steps: int) -> list[str]:
    """qwen3-32b-4x4-a100 (runbook 004) on the emulated Slurm site: its full fine-tune of a tiny Qwen3,
    on both nodes, 8 ranks per node (the 8 GRES GPUs SkyPilot schedules; torchrun's ranks on CPU), its
    cluster.slurm as shipped but for /shared's layout, and its DeepSpeed ZeRO-3 as shipped: on CPU it runs
    on DeepSpeed's CPU accelerator, gloo between the 16 ranks, float32 (what differs on GPUs: bf16, NCCL
    over InfiniBand, the speed)."""
    return [
        "--set", "cluster.infra=slurm/hpc",
        "--set", "model={name_or_path: tiny-qwen3, kind: causal_lm, dtype: float32, attn_implementation: auto, "
                 f"tiny: {{arch: qwen3, {TINY}}}}}",
        *qa_csv(data),
        "--set", "train.gradient_checkpointing=false",
        "--set", "train.per_device_batch_size=1", "--set", "train.gradient_accumulation_steps=1",
        "--set", "train.effective_batch_size=null", "--set", "train.max_seq_length=128",
        "--set", f"train.max_steps={max_steps}", "--set", "train.logging_steps=1",
        "--set", f"train.eval_steps={save_steps}", "--set", f"train.checkpoints.save_steps={save_steps}",
        "--set", "train.report_to=[]",
        *ENV,
    ]
