"""Each profile trains what its runbook trained, or says why not (../shared/seeds/, issue #25).

FACTS is the list of runbook facts checked, one test each (`pytest -v` names them): what the runbook
says, read back from the profile, its rendered SkyPilot task (sky/NAME.yaml) and the run config
the payload reads (sky/config/NAME.yaml). A fact the profile deliberately changes is not in FACTS
with the runbook's value: it is in DIFFERS, and the profile's header block "Differs from runbook
NNN" must name it, so a later change cannot drift silently in either direction."""

from pathlib import Path

import pytest
import yaml

from launcher.profiles.profile import load_profile
from payload.config import RunConfig
from payload.data.records import canonicalize
from payload.config.evaluation import best_metric, exported_checkpoint

REPO = Path(__file__).resolve().parents[2]
PROFILES = {"000": "sonia-h100", "001": "lovecraft-a100-spot", "002": "well-log-ocr-spot",
            "003": "spatial-vl-t4", "004": "qwen3-32b-4x4-a100"}


class View:
    """One profile as the user reads it, as SkyPilot runs it and as the payload trains it."""

    def __init__(self, name: str):
        self.p = load_profile(name)
        self.task = yaml.safe_load((REPO / "sky" / f"{name}.yaml").read_text())
        self.cfg = RunConfig.model_validate(yaml.safe_load((REPO / "sky" / "config" / f"{name}.yaml").read_text()))
        self.t = self.cfg.train

    @property
    def gpus(self):
        r = self.task["resources"]
        return r.get("accelerators") or [a["accelerators"] for a in r["any_of"]]

    def attention(self, batch: str) -> list[str]:
        """The kernels the run tries for `batch` on an H100 with flash-attn, flex_attention left out
        (the runbooks knew only flash-attention 2, sdpa and eager)."""
        from payload.model.attention import Machine, candidates

        machine = Machine(cuda=True, capability=(9, 0), flash_attn=True)
        return [i for i, _ in candidates(self.cfg, batch, machine) if i != "flex_attention"]

    def env(self, key):
        return self.task["envs"].get(key)

    def layout(self, i: int = 0) -> list[tuple[str, str]]:
        """(role, content) of an alpaca/CSV record as the data stage turns it into chat turns."""
        src = self.cfg.data.sources[i]
        raw = {"instruction": "INSTRUCTION", "input": "INPUT", "output": "OUTPUT", "prompt": "PROMPT",
               "question": "QUESTION", "response": "RESPONSE"}
        msgs = canonicalize(raw, src.format, None, src.instruction, src.instruction_as)
        return [(m["role"], m["content"]) for m in msgs]

    def exported(self) -> str:
        what = "weights" if self.t.method == "full" else "adapter"
        extra = " + merged" * self.cfg.outputs.merge + " + mlx" * self.cfg.outputs.export_mlx
        return f"{what}{extra} from {'last' if self.t.method == 'full' else best_metric(self.cfg)[0]}"


_VIEWS: dict = {}


def view(runbook: str) -> View:
    if runbook not in _VIEWS:
        _VIEWS[runbook] = View(PROFILES[runbook])
    return _VIEWS[runbook]


# (runbook, fact, the runbook's value, how to read it from the profile / rendered task / run config)
FACTS = [
    # 000 Sonia: "Pod Specification", "Model", "Training Configuration", "Required Environment Variables"
    ("000", "GPU 2x H100 SXM 80GB, on-demand", ["H100-SXM:2", False], lambda v: [v.gpus, v.task["resources"]["use_spot"]]),
    ("000", "container image runpod/pytorch, Python 3.11, CUDA devel (deliberately 2.8/12.8: see DIFFERS)",
     ("docker:runpod/pytorch:", "py3.11", "devel"),
     lambda v: tuple(x for x in ("docker:runpod/pytorch:", "py3.11", "devel") if x in v.task["resources"]["image_id"])),
    ("000", "volume at /workspace, 420 GB", ("/workspace", 420), lambda v: (v.p.cluster.volume.mount, v.p.cluster.volume.size_gb)),
    ("000", "model VocaborSilentii/Qwen3-VL-32B-Instruct (AutoModelForImageTextToText)",
     ("VocaborSilentii/Qwen3-VL-32B-Instruct", "image_text_to_text"), lambda v: (v.cfg.model.name_or_path, v.cfg.model.kind)),
    ("000", "method LoRA bf16, no quantization", ("lora", "bfloat16", None), lambda v: (v.t.method, v.cfg.model.dtype, v.t.quantization)),
    ("000", "LoRA r 32 / alpha 64 / dropout 0.05", (32, 64, 0.05), lambda v: (v.t.lora.r, v.t.lora.alpha, v.t.lora.dropout)),
    ("000", "targets q,k,v,o,gate,up,down_proj, vision tower frozen",
     (["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], True),
     lambda v: (v.t.lora.target_modules, v.t.lora.language_only)),
    ("000", "lr 1.5e-4 cosine, 3% warmup, 2 epochs", (1.5e-4, "cosine", 0.03, 2), lambda v: (v.t.learning_rate, v.t.lr_scheduler, v.t.warmup_ratio, v.t.epochs)),
    ("000", "batch 2 x accum 8 x 2 GPUs = 32, seq 4096", (2, 8, 32, 4096),
     lambda v: (v.t.per_device_batch_size, v.t.gradient_accumulation_steps, v.t.effective_batch_size, v.t.max_seq_length)),
    ("000", "AdamW (torch), weight decay 0.01, gradient checkpointing", ("adamw_torch", 0.01, True),
     lambda v: (v.t.optimizer, v.t.weight_decay, v.t.gradient_checkpointing)),
    ("000", "flash-attention 2, falling back to sdpa then eager (auto adds flex_attention: DIFFERS)",
     ["flash_attention_2", "sdpa", "eager"], lambda v: v.attention("padding_free")),
    ("000", "assistant-only loss", True, lambda v: v.t.assistant_only_loss),
    ("000", "eval/save every 200 steps", (200, 200), lambda v: (v.t.eval_steps, v.t.checkpoints.save_steps)),
    ("000", "glm: strip <think>, inject Sonia prompt, 95/5 split; dedup", (True, "sonia", {"train": 0.95, "val": 0.05}, True),
     lambda v: next((s.strip_think, s.system_prompt, s.split, v.cfg.data.dedup) for s in v.cfg.data.sources if s.name == "glm")),
    ("000", "PYTORCH_CUDA_ALLOC_CONF expandable_segments:True,max_split_size_mb:256",
     "expandable_segments:True,max_split_size_mb:256", lambda v: v.env("PYTORCH_CUDA_ALLOC_CONF")),
    ("000", "NCCL_P2P_LEVEL=NVL, HF_HOME on the volume", ("NVL", "/workspace/.hf"), lambda v: (v.env("NCCL_P2P_LEVEL"), v.env("HF_HOME"))),
    ("000", "exported: merged model (adapter merged into the base)", "adapter + merged from eval_loss", View.exported),
    # 001 Lovecraft: "Requirements", "Step 4: Training Configuration", "Prompt Format (Critical)", "Step 7"
    ("001", "GPU A100 SXM 80GB (RunPod's SXM row, not the PCIe A100-80GB)", "A100-80GB-SXM:1", lambda v: v.gpus),
    ("001", "model Qwen/Qwen2.5-32B, trust_remote_code", ("Qwen/Qwen2.5-32B", True), lambda v: (v.cfg.model.name_or_path, v.cfg.model.trust_remote_code)),
    ("001", "QLoRA 4-bit (quantization_bit: 4), bf16", ("qlora", 4, "bfloat16"), lambda v: (v.t.method, v.t.quantization.bits, v.cfg.model.dtype)),
    ("001", "LoRA r 64 / alpha 256 / dropout 0.05, lora_target all", (64, 256, 0.05, "all-linear"),
     lambda v: (v.t.lora.r, v.t.lora.alpha, v.t.lora.dropout, v.t.lora.target_modules)),
    ("001", "cutoff_len 2048, packing", (2048, True), lambda v: (v.t.max_seq_length, v.t.packing)),
    ("001", "batch 1 x accum 16", (1, 16), lambda v: (v.t.per_device_batch_size, v.t.gradient_accumulation_steps)),
    ("001", "lr 1e-4 cosine, warmup 0.05, 3 epochs capped at 600 steps", (1e-4, "cosine", 0.05, 3, 600),
     lambda v: (v.t.learning_rate, v.t.lr_scheduler, v.t.warmup_ratio, v.t.epochs, v.t.max_steps)),
    ("001", "optim paged_adamw_32bit, gradient checkpointing (flash_attn sdpa: DIFFERS)", ("paged_adamw_32bit", True),
     lambda v: (v.t.optimizer, v.t.gradient_checkpointing)),
    ("001", "val_size 0.05, eval/save/logging every 100/100/10 steps", ({"train": 0.95, "val": 0.05}, 100, 100, 10),
     lambda v: (v.cfg.data.sources[0].split, v.t.eval_steps, v.t.checkpoints.save_steps, v.t.logging_steps)),
    ("001", "prompt layout: system = instruction, user = input, assistant = output (template: qwen)",
     [("system", "INSTRUCTION"), ("user", "INPUT"), ("assistant", "OUTPUT")], lambda v: v.layout()),
    ("001", "best checkpoint by val loss, PEFT -> MLX adapter, no merge", "adapter + mlx from eval_loss", View.exported),
    # 002 Well-log OCR: "Base Configuration", "Cost Estimates", "Features", "Monitoring"
    ("002", "spot GPUs incl. RTX 3090 / RTX 4090 / A100 / H100", {"RTX3090:1", "RTX4090:1", "A100-80GB:1", "H100:1"},
     lambda v: set(v.gpus) if v.task["resources"]["use_spot"] else None),
    ("002", "model Qwen3-VL-2B-Instruct loaded in 4 bits", ("Qwen/Qwen3-VL-2B-Instruct", "qlora", 4),
     lambda v: (v.cfg.model.name_or_path, v.t.method, v.t.quantization.bits)),
    ("002", "LoRA r 16 / alpha 16 / dropout 0", (16, 16, 0.0), lambda v: (v.t.lora.r, v.t.lora.alpha, v.t.lora.dropout)),
    ("002", "500 steps, lr 2e-4, batch 2 x accum 4", (500, 2e-4, 2, 4),
     lambda v: (v.t.max_steps, v.t.learning_rate, v.t.per_device_batch_size, v.t.gradient_accumulation_steps)),
    ("002", "dataset wrath/well-log-headers-ocr", "wrath/well-log-headers-ocr", lambda v: v.cfg.data.sources[0].hf_dataset),
    ("002", "W&B project well-log-ocr", "well-log-ocr", lambda v: v.cfg.wandb.project),
    ("002", "best 5 + recent 5 checkpoints, early stopping", (5, 5, True),
     lambda v: (v.t.checkpoints.keep_best, v.t.checkpoints.keep_recent, bool(v.t.early_stopping_patience))),
    ("002", "budget cap $10, warn at 90%", (10, 0.9), lambda v: (v.p.budget.max_usd, v.p.budget.warn_fraction)),
    ("002", "CER/WER computed", {"cer", "wer"}, lambda v: set(v.cfg.evaluation.metrics) & {"cer", "wer"}),
    # 003 Spatial VL on a T4: "GPU Tiers", "Configuration Options", "Training Pipeline"
    ("003", "GPU T4 (16 GB, no bf16: fp16 via dtype auto)", ("T4:1", "auto"), lambda v: (v.gpus, v.cfg.model.dtype)),
    ("003", "model Qwen/Qwen3-VL-2B-Instruct", "Qwen/Qwen3-VL-2B-Instruct", lambda v: v.cfg.model.name_or_path),
    ("003", "T4 tier: LoRA r16, seq 2048, grad accum 8", (16, 2048, 8),
     lambda v: (v.t.lora.r, v.t.max_seq_length, v.t.gradient_accumulation_steps)),
    ("003", "stages SFT -> DPO -> GRPO", ["sft", "dpo", "grpo"], lambda v: [s.kind for s in v.cfg.stages]),
    ("003", "MAX_SAMPLES 1000 / 500 / 300, SFT 1 epoch", (1000, 500, 300, 1),
     lambda v: (v.cfg.data.sources[0].max_records, v.cfg.stages[1].data.sources[0].max_records,
                v.cfg.stages[2].data.sources[0].max_records, v.t.epochs)),
    ("003", "DPO data: RLHF-V from the hub (public)", "openbmb/RLHF-V-Dataset", lambda v: v.cfg.stages[1].data.sources[0].hf_dataset),
    ("003", "GRPO num_generations 4", 4, lambda v: v.cfg.stages[2].grpo.num_generations),
    ("003", "save_steps low (100-200 or less)", True, lambda v: v.t.checkpoints.save_steps <= 200),
    # 004 Qwen3-32B: "System Requirements", "Training Parameters", "Performance Tips", "Monitoring"
    ("004", "16 A100 80GB", ("A100-80GB", 16), lambda v: (v.p.cluster.accelerator_name, v.p.cluster.gpus_per_node * v.p.cluster.num_nodes)),
    ("004", "model Qwen/Qwen3-32B, full fine-tune, ZeRO-3, bf16", ("Qwen/Qwen3-32B", "full", 3, "bfloat16"),
     lambda v: (v.cfg.model.name_or_path, v.t.method, v.t.deepspeed.zero_stage, v.cfg.model.dtype)),
    ("004", "flash-attention 2, SDPA fallback", ["flash_attention_2", "sdpa"], lambda v: v.attention("padding_free")[:2]),
    ("004", "seq 8192, batch 1 x accum 8", (8192, 1, 8), lambda v: (v.t.max_seq_length, v.t.per_device_batch_size, v.t.gradient_accumulation_steps)),
    ("004", "lr 5e-5 cosine, warmup 0.1, 3 epochs", (5e-5, "cosine", 0.1, 3), lambda v: (v.t.learning_rate, v.t.lr_scheduler, v.t.warmup_ratio, v.t.epochs)),
    ("004", "gradient checkpointing", True, lambda v: v.t.gradient_checkpointing),
    ("004", "CSV data with prompt, question, response (prompt = system turn)",
     [("system", "PROMPT"), ("user", "QUESTION"), ("assistant", "RESPONSE")], lambda v: v.layout()),
    ("004", "TF32 on A100s", "1", lambda v: v.env("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE")),
    ("004", "TensorBoard", ["tensorboard"], lambda v: v.t.report_to),
    ("004", "exported: the trained weights", "weights from last", View.exported),
]


@pytest.mark.parametrize("runbook,fact,expected,read", FACTS, ids=[f"{r}: {f}" for r, f, _, _ in FACTS])
def test_runbook_fact(runbook, fact, expected, read):
    assert read(view(runbook)) == expected, f"runbook {runbook}: {fact}"


# Deliberate differences: each must be named in the profile's "Differs from runbook NNN" block.
DIFFERS = {
    "000": ["hub push", "ZeRO-3", "best checkpoint by eval loss", "container image torch 2.8 / CUDA 12.8",
            "padding-free batches", "flex_attention"],
    "001": ["spot", "best checkpoint by val loss", "MLX", "LLaMA-Factory", "attention `auto` instead of the runbook's sdpa"],
    "002": ["CER", "unsloth", "which code produced a run"],
    "003": ["spot T4", "RLHF-V", "SFT and GRPO sets", "best checkpoint by eval loss"],
    "004": ["one job over 16 GPUs", "CPU offload", "last checkpoint", "padding-free batches", "flex_attention"],
}


def header_block(name: str) -> str:
    """The profile's `# Differs from runbook NNN` comment block (up to the next blank comment line)."""
    lines = (REPO / "clusters" / f"{name}.yaml").read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("# Differs from runbook"))
    block = []
    for ln in lines[start:]:
        if not ln.startswith("#") or ln.strip() == "#":
            break
        block.append(ln.lstrip("# "))
    return " ".join(block)


@pytest.mark.parametrize("runbook", sorted(PROFILES))
def test_every_difference_is_in_the_profile_header(runbook):
    block = header_block(PROFILES[runbook])
    assert block.startswith(f"Differs from runbook {runbook}"), block
    for what in DIFFERS[runbook]:
        assert what in block, f"{PROFILES[runbook]}: header does not name the difference `{what}`"


def test_the_exported_checkpoint_is_said_not_silent():
    assert exported_checkpoint(view("002").cfg).startswith("the best checkpoint by cer (lower wins")
    assert exported_checkpoint(view("001").cfg).startswith("the best checkpoint by eval loss (lower wins")
    assert exported_checkpoint(view("004").cfg) == "the last complete checkpoint (full fine-tuning)"


def test_the_header_of_every_profile_has_the_block():
    from launcher.profiles.profile import profile_names

    assert set(PROFILES.values()) <= set(profile_names())
    for name in profile_names():
        assert "# Differs from runbook" in (REPO / "clusters" / f"{name}.yaml").read_text(), name


# ------------------------------------------------------------------ 003: data that is the user's own


@pytest.mark.parametrize("fmt", ["messages", "alpaca", "prompt_response", "image_text", "preference", "prompt_answer"])
def test_the_example_validate_prints_is_data_the_stage_accepts(tmp_path, fmt):
    from PIL import Image

    from launcher.profiles.datahints import examples
    from payload.config import DataConfig
    from payload.data import prepare

    images = fmt in ("messages", "image_text", "prompt_answer", "preference")
    for name in ("room1.jpg", "table2.jpg", "room3.jpg", "header1.png", "header2.png", "header3.png"):
        Image.new("RGB", (32, 32), "white").save(tmp_path / name)
    lines = examples(fmt, images)
    assert len(lines) == 3
    path = tmp_path / ("data.csv" if fmt == "prompt_response" else "data.jsonl")
    path.write_text("\n".join(lines) + "\n")
    data = DataConfig(sources=[{"name": "x", "path": str(path), "format": fmt, "image_root": str(tmp_path)}],
                      dedup=False, strict=True)
    stats = prepare(data, tmp_path / "out", log=lambda _: None)
    assert stats["totals"]["train"] == (2 if fmt == "prompt_response" else 3)  # a CSV's first line is its header


def test_validate_says_what_the_users_files_hold():
    from click.testing import CliRunner

    from launcher.cli import cli

    out = CliRunner().invoke(cli, ["validate", "spatial-vl-t4"], terminal_width=400).output
    sft = next(ln for ln in out.splitlines() if "data.sources.0.path" in ln and "stages" not in ln)
    assert "data/spatial/sft.jsonl not found" in sft and "format messages: JSONL" in sft and "images under data/spatial/images/" in sft
    grpo = out[out.index("stages.2.data.sources.0.path"):]
    assert "data/spatial/grpo.jsonl not found" in grpo and "`prompt`, `answer`" in grpo
    assert grpo.splitlines()[1].strip().startswith('{"prompt": "How many chairs are there?", "answer": "Three"')
    assert len([ln for ln in out.splitlines() if ln.startswith("      {")]) == 6 and "Traceback" not in out
