"""GPU-memory estimate of a training run, from the model's shape: pure Python, no torch.

One idea at ~440 lines: the GPU-memory estimate, from the model's shape (a config.json, the known
shapes, the size in the name) to the per-GPU total and the gradient-checkpointing choice it implies. The
shape lookup stays with it: nothing uses the shapes without the estimate (payload/model/dims.py finds the
shape on the machine and hands it here).

Used by the payload's preflight (before any GPU minute is spent) and by `launch plan`/`validate` on
the user's machine (the launcher may import this module, like `payload.config`: it imports neither
torch nor transformers).

Model size comes from a `config.json` dict (`dims_from_config`) or, when none is at hand, from a
table of known Qwen shapes looked up by name ("Qwen3-VL-32B-Instruct" -> qwen3-vl/32), else the
size in the name ("70B" -> 70e9 parameters, shape of the nearest known row).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Optional

from payload.model.attention import Machine, batch_kind, listed, order

GIB = 2**30


# ------------------------------------------------------------------------------------ model shape


@dataclass(frozen=True)
class ModelDims:
    """Decoder shape; parameter counts are derived from it (Qwen2/Qwen3 blocks, SwiGLU MLP)."""

    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    vision_params: float = 0.0
    source: str = ""
    qk_norm: bool = False  # Qwen3's per-head RMSNorm on q and k (Qwen2.5 has none)

    @property
    def module_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer of one decoder block, by PEFT target-module name."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    @property
    def block_params(self) -> int:
        return sum(a * b for a, b in self.module_shapes.values()) + 2 * self.hidden

    @property
    def linear_params(self) -> int:
        """Parameters in decoder-block linear layers (what 4-bit quantization shrinks)."""
        return self.layers * sum(a * b for a, b in self.module_shapes.values())

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2)

    @property
    def params(self) -> float:
        return self.layers * self.block_params + self.embed_params + self.hidden + self.vision_params


# family/size -> (hidden, layers, intermediate, heads, kv_heads, head_dim, vocab, tied, vision params).
# From the models' config.json files; vision params approximate (Qwen3-VL-32B: 33.3B total, runbook 000).
KNOWN_QWEN = {
    "qwen2.5/0.5": (896, 24, 4864, 14, 2, 64, 151936, True, 0),
    "qwen2.5/1.5": (1536, 28, 8960, 12, 2, 128, 151936, True, 0),
    "qwen2.5/3": (2048, 36, 11008, 16, 2, 128, 151936, True, 0),
    "qwen2.5/7": (3584, 28, 18944, 28, 4, 128, 152064, False, 0),
    "qwen2.5/14": (5120, 48, 13824, 40, 8, 128, 152064, False, 0),
    "qwen2.5/32": (5120, 64, 27648, 40, 8, 128, 152064, False, 0),
    "qwen2.5/72": (8192, 80, 29568, 64, 8, 128, 152064, False, 0),
    "qwen3/0.6": (1024, 28, 3072, 16, 8, 128, 151936, True, 0),
    "qwen3/1.7": (2048, 28, 6144, 16, 8, 128, 151936, True, 0),
    "qwen3/4": (2560, 36, 9728, 32, 8, 128, 151936, True, 0),
    "qwen3/8": (4096, 36, 12288, 32, 8, 128, 151936, False, 0),
    "qwen3/14": (5120, 40, 17408, 40, 8, 128, 151936, False, 0),
    "qwen3/32": (5120, 64, 25600, 64, 8, 128, 151936, False, 0),
    "qwen3-vl/2": (2048, 28, 6144, 16, 8, 128, 151936, True, 0.4e9),  # text = Qwen3-1.7B's shape
    "qwen3-vl/8": (4096, 36, 12288, 32, 8, 128, 151936, False, 0.58e9),
    "qwen3-vl/32": (5120, 64, 25600, 64, 8, 128, 151936, False, 0.54e9),
}


def dims_from_config(data: dict, source: str = "config.json") -> ModelDims:
    """ModelDims from a transformers config dict (text_config for vision-language models)."""
    text = data.get("text_config") or data
    heads = text["num_attention_heads"]
    vision = data.get("vision_config") or {}
    vparams = 0.0
    if vision:
        vh, vi = vision.get("hidden_size", 0), vision.get("intermediate_size", 0)
        vparams = vision.get("depth", 0) * (4 * vh * vh + 2 * vh * vi)
    tied = data.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    return ModelDims(
        hidden=text["hidden_size"], layers=text["num_hidden_layers"], intermediate=text["intermediate_size"],
        heads=heads, kv_heads=text.get("num_key_value_heads") or heads,
        head_dim=text.get("head_dim") or text["hidden_size"] // heads, vocab=text["vocab_size"],
        tied=bool(tied), vision_params=vparams, source=source,
        qk_norm=str(text.get("model_type") or data.get("model_type") or "").startswith("qwen3"),
    )


def known_dims(key: str, source: str = "") -> ModelDims:
    """ModelDims of a KNOWN_QWEN row ("qwen3/8")."""
    return ModelDims(*KNOWN_QWEN[key], source=source or f"known shape {key}", qk_norm=key.startswith("qwen3"))


def dims_from_name(name: str) -> Optional[ModelDims]:
    """Known Qwen shape by name, else the "<N>B" in the name with the nearest known shape."""
    base = name.rstrip("/").split("/")[-1].lower().replace("_", ".")
    size = re.search(r"(?<![\d.])(\d+(?:\.\d+)?)b(?![a-z])", base)
    if size is None:
        return None
    family = "qwen3-vl" if re.search(r"qwen3-?vl", base) else "qwen3" if "qwen3" in base else (
        "qwen2.5" if re.search(r"qwen2\.?5", base) else None)
    key = f"{family}/{size.group(1)}"
    if key in KNOWN_QWEN:
        return known_dims(key)
    want = float(size.group(1)) * 1e9
    nearest = min(KNOWN_QWEN, key=lambda k: abs(math.log(ModelDims(*KNOWN_QWEN[k]).params / want)))
    d = known_dims(nearest)
    scale = want / d.params  # keep the nearest shape, scale the depth to the named size
    return ModelDims(**{**asdict(d), "layers": max(1, round(d.layers * scale)),
                        "source": f"{size.group(1)}B from the name, shape of {nearest}"})


# ---------------------------------------------------------------------------------- GPU memory


@dataclass(frozen=True)
class Kernels:
    """How a run computes, as far as its memory goes: what a `make gpu-check` row records
    (attn_used, liger, padding_free) and what the config alone cannot say (`kernels_of`)."""

    attention: str = "sdpa"  # flash_attention_2 | flex_attention | sdpa | eager
    liger: bool = False
    padding_free: bool = False  # packed or padding-free: each batch is one flattened row of B x S tokens
    padded_len: Optional[int] = None  # padded batches: the longest row they pad to (default max_seq_length)
    kbit_upcast: bool = False  # qlora prepared by peft's prepare_model_for_kbit_training (payload before 2026-11-26)


def kernels_of(cfg, machine=None, **given) -> Kernels:
    """Kernels from the config: the first listed attention, or for `auto` the first `attention.order`
    gives on `machine` (default: a CUDA GPU with flash-attn, which setup installs), Liger only when
    `true` (`auto` is decided on the GPU: off counts more memory), padding-free when packing (or
    `train.padding_free: true`)."""
    t = cfg.train
    free = bool(t.packing) or getattr(t, "padding_free", False) is True
    attn = (listed(cfg) or [order(batch_kind(bool(t.packing), free),
                                  machine or Machine(cuda=True, flash_attn=True))[0][0]])[0]
    base = dict(attention=attn, liger=t.liger is True, padding_free=free)
    return Kernels(**{**base, **{k: v for k, v in given.items() if v is not None}})


def planned_kernels(cfg, gpu_has_bf16: bool) -> Kernels:
    """`kernels_of` for a plan, on the GPU the profile rents with flash-attn installed (setup installs
    it): a GPU without bf16 (T4, V100: compute capability below 8.0) runs neither flash-attn nor flex."""
    return kernels_of(cfg, machine=Machine(cuda=True, capability=None if gpu_has_bf16 else (7, 5), flash_attn=True))


def estimate_gpu_memory_gb(cfg, gpu_mem_gb: Optional[float], num_gpus: int, dims: Optional[ModelDims] = None,
                           fused_lm_head: bool = True, kernels: Optional[Kernels] = None) -> dict:
    """Peak GPU memory per GPU, in GiB (2**30 bytes, as torch and nvidia-smi count), by component.

    P = parameters, N = `num_gpus` (all GPUs of the job), B = per-device batch, S = max_seq_length,
    H/I/L/V = hidden, intermediate, layers, vocab; Q = heads x head_dim, K = kv_heads x head_dim.

    weights      lora: 2P (bf16/fp16; 4P if model.dtype float32). qlora: 0.55 B/param for the block
                 linears (NF4 + scales), bf16 for embeddings/lm_head/vision. ZeRO-3: divided by N.
    train_state  lora: T x 16 B, T = L x sum(r x (in + out)) over the targeted block linears (PEFT
                 keeps adapters in fp32: weight 4 + grad 4 + AdamW m,v 8; 8-bit Adam: 10 B).
                 full: 16 B/param (bf16 weight 2 + grad 2 + fp32 master/m/v 12, ZeRO paper's K=12);
                 ZeRO-2 shards the 14 B of grads+optimizer over N, ZeRO-3 all 16 B; offload_optimizer
                 moves the 12 B to CPU, offload_params the 2 B. ZeRO-3 adds a working set: 3 x the
                 largest gathered unit (a block or the embedding) x 2 B (current + prefetch + grads).
    activations  T = the tokens of a batch as the model sees them: B x S in one flattened row when
                 padding-free or packed (`Kernels.padding_free`), else B rows padded to the longest
                 record of the batch (`Kernels.padded_len`, default S: a whole epoch meets the
                 longest record). Checkpointing on: L x T x H x 2 B (each block's bf16 input) + 2 x
                 one block recomputed in backward, T x (4H + 4Q + 4K + 4I [+ 5H + Q + I copies when
                 LoRA dropout > 0] [+ 2(Q + K): Qwen3's q/k RMSNorm keeps fp32 copies]) x 2 B; off:
                 L x that block set; every n-th layer: the checkpointed layers' inputs + the other
                 layers' block sets. Corrections, each named with the bench/results row that shows it:
                 - Liger (RMSNorm keeps its bf16 input, not an fp32 copy; SwiGLU recomputes silu):
                   - (2H + Q + K + I) x 2 B per token (lora-bf16-flex: 80.7 GiB estimated vs 75.4);
                 - sdpa/eager given a mask (padding, or a flattened row's block-diagonal mask):
                   transformers repeats k and v to every head, + 2(Q - K) x 2 B per token, and each
                   layer keeps a rows x length^2 bf16 mask for backward (lora-bf16-sdpa vs
                   lora-bf16-flex: 7.9 GiB apart measured; modelled 3.4 + 4.5 at 8,192 tokens);
                 - padded batches: T from the longest row, not S (lora-bf16-vl and lora-fp16 padded
                   to 1,790 tokens in their 15 steps: estimated 34.6 GiB at S vs 19.8 measured);
                 - QLoRA prepared with peft's fp32 upcast (`Kernels.kbit_upcast`, the payload before
                   2026-11-26): activations x 1.30 and fp32 embeddings/norms/LM head (qlora-4bit:
                   96.3 GiB measured, 79.8 estimated without it). The payload no longer upcasts.
                 Flash/flex attention keep no S^2. `gradient_checkpointing: auto` is resolved first.
    logits       the payload (TRL >= 1.16 SFTTrainer) never materializes the T x V logits: its
                 fused LM head scores tiles of 4096 tokens x 32768 vocab (2 B each) and keeps per
                 token the scored hidden state (2 B x H), its fp32 gradient (4 B x H) and the cast
                 back (2 B x H); a trainable LM head (full) adds an fp32 gradient accumulator and its
                 cast, 6 B x V x H. `fused_lm_head=False` (a plain transformers Trainer): T x V x
                 10 B (bf16 logits, fp32 upcast for the loss, fp32 log-softmax/grad).
    train_state  (lora) fp32 adapters, 16 B each; QLoRA in bf16 keeps bf16 adapters (payload.model.adapters.
                 dtype_plan, as TRL does): 8 B each.
    overhead     1.5 GiB (CUDA context, NCCL, cuBLAS workspace) + 5 % (allocator fragmentation); with
                 unfused logits + half the logits term (freed logits blocks stay cached: the three
                 baseline rows reserve 2.7-5.3 GiB more than they allocate).

    `kernels` (attention, Liger, padding-free, padded length, QLoRA upcast) defaults to what the
    config says (`kernels_of`: `liger: auto` counts as off). No CPU-offloaded activations, vision-
    tower activations ignored (no image row measured yet). An estimate for a go/no-go before
    paying: tests/payload/model/test_memory_measured.py holds it within +-15 % of every GPU row in bench/results/.
    """
    dims = dims or dims_from_name(cfg.model.name_or_path)
    if dims is None:
        return {"known": False, "detail": f"unknown size of `{cfg.model.name_or_path}`"}
    t, n = cfg.train, max(1, int(num_gpus))
    ds = t.deepspeed
    k = kernels or kernels_of(cfg)
    every, why = choose_checkpointing(cfg, gpu_mem_gb, n, dims, k)
    comp = _components(cfg, dims, n, every, fused_lm_head, k)
    total = sum(comp.values()) / GIB
    out = {
        "known": True, "model": cfg.model.name_or_path, "params_b": round(dims.params / 1e9, 2),
        "shape_source": dims.source, "method": t.method, "num_gpus": n,
        "zero_stage": ds.zero_stage if ds else None, "batch": t.per_device_batch_size, "seq": t.max_seq_length,
        "kernels": asdict(k),
        "gradient_checkpointing": every > 0, "checkpoint_every_n_layers": every,
        "gradient_checkpointing_reason": why,
        "components_gb": {k: round(v / GIB, 2) for k, v in comp.items()},
        "total_gb": round(total, 1), "gpu_mem_gb": gpu_mem_gb,
        "fraction": round(total / gpu_mem_gb, 3) if gpu_mem_gb else None,
    }
    if t.method in ("lora", "qlora"):
        out["trainable_params_m"] = round(lora_trainable_params(cfg, dims) / 1e6, 1)
    return out


def estimate_stage_memory_gb(cfg, gpu_mem_gb: Optional[float], num_gpus: int,
                             dims: Optional[ModelDims] = None, kernels: Optional[Kernels] = None) -> dict:
    """`estimate_gpu_memory_gb` for one stage of a run with `stages:` (payload/config/stages.py); an SFT
    stage or a config without stages is estimated as it is.

    dpo   chosen and rejected run as one batch: activations (and the logit tiles) of 2 x B sequences.
          The reference is the previous stage's adapter kept as a frozen second adapter on the same
          base (TRL's `ref` adapter copy; peft), so no second model: + T x 4 B (fp32 LoRA copy); its
          forward holds no activations for backward.
    grpo  B counts completions (prompts x num_generations per device batch); each sequence is prompt
          + completion, at most max_seq_length. Generation adds the KV cache of B sequences of that
          length, 2 (K, V) x layers x kv_heads x head_dim x 2 B per token, and the completion logits
          TRL scores for the log-probs, B x max_completion_length x V x 4 B (fp32). The reference
          is the frozen adapter copy as for dpo (+ T x 4 B; beta 0 drops it).
    """
    stage = getattr(cfg, "stage", None)
    if stage is None or stage.kind == "sft":
        return estimate_gpu_memory_gb(cfg, gpu_mem_gb, num_gpus, dims, kernels=kernels)
    dims = dims or dims_from_name(cfg.model.name_or_path)
    if dims is None:
        return {"known": False, "detail": f"unknown size of `{cfg.model.name_or_path}`"}
    t = cfg.train
    batch = t.per_device_batch_size * (2 if stage.kind == "dpo" else 1)
    sized = cfg.model_copy(update={"train": t.model_copy(update={"per_device_batch_size": batch})})
    est = estimate_gpu_memory_gb(sized, gpu_mem_gb, num_gpus, dims, kernels=kernels)
    extra = {}
    trainable = lora_trainable_params(cfg, dims) if t.method != "full" else 0
    if stage.kind == "dpo" or stage.grpo.beta > 0:
        extra["reference_adapter"] = trainable * 4
    if stage.kind == "grpo":
        g = stage.grpo
        kv = 2 * dims.layers * dims.kv_heads * dims.head_dim * 2
        extra["generation_kv_cache"] = t.per_device_batch_size * t.max_seq_length * kv
        extra["completion_logits"] = t.per_device_batch_size * g.max_completion_length * dims.vocab * 4
    comp = dict(est["components_gb"], **{k: round(v / GIB, 2) for k, v in extra.items()})
    total = est["total_gb"] + sum(extra.values()) / GIB * 1.05
    est.update(components_gb=comp, total_gb=round(total, 1), stage=stage.label, kind=stage.kind,
               fraction=round(total / gpu_mem_gb, 3) if gpu_mem_gb else None)
    return est


AUTO_CHECKPOINTING_FRACTION = 0.85  # `auto` keeps activations only below this share of the GPU
PARTIAL_EVERY_N = (4, 3, 2)  # `auto` tries checkpointing every 4th, 3rd, 2nd layer before every layer


def choose_checkpointing(cfg, gpu_mem_gb: Optional[float], num_gpus: int,
                         dims: Optional[ModelDims] = None, kernels: Optional[Kernels] = None) -> tuple[int, str]:
    """(every_n_layers, why) for `train.gradient_checkpointing`: 0 = off, 1 = every decoder layer,
    n = every n-th layer (transformers' `every_n_layers`: the others keep their activations, so less
    is recomputed). `auto` takes the least checkpointing whose estimate needs at most 85 % of the
    GPU (the estimate's own +-15 % target): off, else every 4th/3rd/2nd layer, else every layer."""
    setting = cfg.train.gradient_checkpointing
    if isinstance(setting, bool):
        return int(setting), "set in train.gradient_checkpointing"
    dims = dims or dims_from_name(cfg.model.name_or_path)
    if not gpu_mem_gb:
        return 1, "auto: GPU memory unknown, on to be safe"
    if dims is None:
        return 1, "auto: model size unknown, on to be safe"
    n, limit = max(1, int(num_gpus)), AUTO_CHECKPOINTING_FRACTION * gpu_mem_gb
    kern = kernels or kernels_of(cfg)
    need = {k: sum(_components(cfg, dims, n, k, True, kern).values()) / GIB for k in (0, *PARTIAL_EVERY_N, 1)}
    where = f"{limit:.1f} GiB (85% of {gpu_mem_gb:.1f})"
    if need[0] <= limit:
        return 0, f"auto: off, ~{need[0]:.1f} GiB without it fits {where}"
    for k in PARTIAL_EVERY_N:
        if need[k] <= limit:
            return k, f"auto: 1 layer in {k}, ~{need[k]:.1f} GiB fits {where} (~{need[0]:.1f} GiB without)"
    return 1, f"auto: every layer, ~{need[PARTIAL_EVERY_N[-1]]:.1f} GiB with every 2nd exceeds {where}"


def choose_gradient_checkpointing(cfg, gpu_mem_gb: Optional[float], num_gpus: int,
                                  dims: Optional[ModelDims] = None) -> tuple[bool, str]:
    """(on?, why): `choose_checkpointing` as a yes/no."""
    every, why = choose_checkpointing(cfg, gpu_mem_gb, num_gpus, dims)
    return every > 0, why


def _components(cfg, dims: ModelDims, n: int, every: int, fused_lm_head: bool, k: Kernels) -> dict:
    ds = cfg.train.deepspeed
    comp = {
        "weights": _weights_bytes(cfg, dims, n, k),
        "train_state": _train_state_bytes(cfg, dims, n, k),
        "activations": _activation_bytes(cfg, dims, every, k),
        "logits": _logits_bytes(cfg, dims, fused_lm_head, k),
    }
    if ds and ds.zero_stage == 3:
        comp["zero3_working"] = 3 * max(dims.block_params, dims.vocab * dims.hidden) * 2
    comp["overhead"] = 1.5 * GIB + 0.05 * sum(comp.values())
    if not fused_lm_head:  # the allocator keeps freed logits blocks cached: reserved ~ allocated + half of them
        comp["overhead"] += 0.5 * comp["logits"]  # (the three baseline rows of the H200 table: +2.7 to +5.3 GiB)
    return comp


def _rows(cfg, k: Kernels) -> tuple[int, int]:
    """(rows, tokens per row) of a batch as the model sees it: one flattened row of B x S tokens when
    padding-free (or packed), else B rows padded to the longest (`padded_len`, at most S)."""
    t = cfg.train
    if k.padding_free:
        return 1, t.per_device_batch_size * t.max_seq_length
    return t.per_device_batch_size, min(k.padded_len or t.max_seq_length, t.max_seq_length)


FUSED_TOKEN_TILE, FUSED_VOCAB_TILE = 4096, 32768  # trl/kernels/chunked_logprob.py, trl/trainer/utils.py


def _logits_bytes(cfg, dims: ModelDims, fused: bool, k: Kernels) -> float:
    t = cfg.train
    rows, length = _rows(cfg, k)
    tokens = rows * length
    if not fused:
        return tokens * dims.vocab * 10
    per = 4 if cfg.model.dtype == "float32" else 2
    tile = min(tokens, FUSED_TOKEN_TILE) * min(dims.vocab, FUSED_VOCAB_TILE) * per
    head_grad = 6 * dims.vocab * dims.hidden if t.method == "full" else 0
    return tile + tokens * dims.hidden * 8 + head_grad


def lora_trainable_params(cfg, dims: ModelDims) -> int:
    """LoRA parameters over the decoder blocks: sum of r x (in + out) of the targeted linears."""
    targets = cfg.train.lora.target_modules
    shapes = dims.module_shapes
    names = shapes if targets == "all-linear" else [m for m in targets if m in shapes]
    return dims.layers * sum(cfg.train.lora.r * sum(shapes[m]) for m in names)


def _weights_bytes(cfg, dims: ModelDims, n: int, k: Kernels) -> float:
    t = cfg.train
    if t.method == "full":
        return 0.0  # counted in train_state (16 B/param)
    per = 4 if cfg.model.dtype == "float32" else 2
    if t.method == "qlora":
        rest = 4 if k.kbit_upcast else per  # the upcast cast embeddings, LM head, norms, vision to fp32
        w = 0.55 * dims.linear_params + rest * (dims.params - dims.linear_params)
    else:
        w = per * dims.params
    return w / n if t.deepspeed and t.deepspeed.zero_stage == 3 else w


def _train_state_bytes(cfg, dims: ModelDims, n: int, k: Kernels) -> float:
    t, ds = cfg.train, cfg.train.deepspeed
    if t.method == "full":
        weights, grads, optim = 2 * dims.params, 2 * dims.params, 12 * dims.params
    else:
        trainable = lora_trainable_params(cfg, dims)
        # fp32 adapters, except QLoRA in bf16 (payload.model.adapters.dtype_plan): bf16 weight, grad and AdamW m, v
        per = 2 if t.method == "qlora" and cfg.model.dtype == "bfloat16" and not k.kbit_upcast else 4
        optim_b = 2 if t.optimizer == "paged_adamw_8bit" else 2 * per
        weights, grads, optim = per * trainable, per * trainable, optim_b * trainable
    if ds:
        optim = 0 if ds.offload_optimizer else optim / n
        grads /= n
        if ds.zero_stage == 3:
            weights = 0 if ds.offload_params else weights / n
    return weights + grads + optim


# Activations kept by a layer whose batch was upcast to fp32 by prepare_model_for_kbit_training, per the
# same layer in bf16: the qlora-4bit row (94.9 GiB allocated) against lora-bf16-sdpa (81.8), same shape,
# batch, attention and Liger, with the weights' difference (4-bit blocks, fp32 embeddings) taken out.
KBIT_UPCAST_ACTIVATIONS = 1.30


def _activation_bytes(cfg, dims: ModelDims, every: int, k: Kernels) -> float:
    t = cfg.train
    rows, length = _rows(cfg, k)
    tokens = rows * length
    h, i = dims.hidden, dims.intermediate
    q, kv = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    per_token = 4 * h + 4 * q + 4 * kv + 4 * i
    if t.method != "full" and t.lora.dropout > 0:
        per_token += 5 * h + q + i  # PEFT applies dropout per adapted linear: one input copy each
    if dims.qk_norm:
        per_token += 2 * (q + kv)  # q_norm/k_norm keep an fp32 copy of q and k (eager RMSNorm)
    if k.liger:  # Liger's RMSNorm keeps its bf16 input, not an fp32 copy; its SwiGLU recomputes silu(gate)
        per_token -= 2 * h + (q + kv if dims.qk_norm else 0) + i
    masked = k.attention in ("sdpa", "eager")
    if masked:  # transformers repeats k and v to every head when sdpa gets a mask (no enable_gqa)
        per_token += 2 * (q - kv)
    block = tokens * per_token * 2
    # sdpa/eager get a dense mask per layer (padding, or the block-diagonal mask of a flattened row) and
    # keep it for backward: rows x length^2 x 2 B (bf16)
    mask = rows * length * length * 2 if masked else 0
    if k.kbit_upcast:
        block *= KBIT_UPCAST_ACTIVATIONS
    if every <= 0:
        return dims.layers * (block + mask)
    kept = dims.layers - math.ceil(dims.layers / every)  # layers that keep all their activations
    return (dims.layers - kept) * tokens * h * 2 + kept * (block + mask) + 2 * block + mask
