"""Tiny models and a tiny tokenizer built from config: the local demo and the tests need no download.

One idea at ~380 lines: a tiny model built from config, with the tokenizer, processor and files that
make it load like a real one through `from_pretrained`; the shapes the GPU checks materialize
(`materialize_shape`) are the same builder at another size.

`build_tiny_tokenizer` trains a byte-level BPE on a few KB of built-in text (deterministic), with
Qwen's special tokens and a ChatML template that carries `{% generation %}` markers, so
`return_assistant_tokens_mask=True` (and TRL's `assistant_only_loss`) work.
`build_tiny_model` builds a random Qwen3 causal LM or Qwen3-VL image-text-to-text model with a fixed
seed (same call, byte-identical weights). `materialize_tiny` saves both to a directory once, so every
later stage loads the "base model" with `from_pretrained` exactly as it would a hub model.
`materialize_shape` does the same at a real model's shape (Qwen3-8B, Qwen3-VL-2B: random weights,
built on the GPU) for `make gpu-check`, which measures speed and memory without any download.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

SPECIAL_TOKENS = (
    "<|endoftext|>",  # 0: pad
    "<|im_start|>",  # 1
    "<|im_end|>",  # 2: eos (end of turn)
    "<think>",  # 3
    "</think>",  # 4
    "<|vision_start|>",  # 5
    "<|vision_end|>",  # 6
    "<|image_pad|>",  # 7
    "<|video_pad|>",  # 8: the processor and Qwen3VLConfig expect a video token too
)
BASE_MODEL_DIR = "base_model"  # {run_dir}/base_model/: where a tiny "base model" is materialized
TINY_SEED = 1234
_DONE = ".materialized"

# ChatML; user/system content may be a string or a list of parts ({"type": "text"|"image"}).
# Assistant output (content + <|im_end|>) sits inside {% generation %} so assistant masks work.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- generation -%}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>' -}}"
    "{%- endgeneration -%}"
    "{{- '\\n' -}}"
    "{%- else -%}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or 'image' in part -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_CORPUS = """\
system user assistant. You are a concise assistant. Answer the question in one or two sentences.
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Hello! How can I help you today? Say hello in one sentence. Thank you, that was helpful.
What is the capital of France? The capital of France is Paris. What is two plus two? It is four.
Explain photosynthesis briefly. Plants turn light, water and carbon dioxide into sugar and oxygen.
Write a short poem about the sea. The sea is wide, the waves are slow, the wind will come and go.
Translate "good morning" into Spanish. In Spanish, "good morning" is "buenos dias".
Summarize the following text. The report says sales grew by ten percent in the last quarter.
Give me three tips for better sleep: keep a regular schedule, avoid screens late, and keep the room cool.
Instruction: list the primary colors. Input: none. Output: red, yellow and blue.
The model reads an image and describes it. The picture shows a red square on a white background.
Describe the image. There is a blue circle and a green triangle. Count the objects in the picture.
Training a language model needs data, a tokenizer, a model, an optimizer and a learning rate schedule.
The loss goes down as the model learns. Checkpoints are saved every few steps so training can resume.
def add(a, b):
    return a + b
for i in range(10):
    print(i * 2)
{"role": "user", "content": "hi"} {"role": "assistant", "content": "hello"}
Numbers: 0 1 2 3 4 5 6 7 8 9 10 20 42 100 1000 3.14 2024-01-01 12:30 $5.38 90% 1e-4
Why is the sky blue? Sunlight scatters off air molecules, and blue light scatters the most.
Who wrote Hamlet? William Shakespeare wrote Hamlet around the year 1600.
Please think step by step. First, read the question. Then, reason about it. Finally, answer clearly.
I am not sure about that, but I can explain what I know and where to look for more information.
Water boils at one hundred degrees Celsius at sea level. Ice melts at zero degrees.
The cat sat on the mat. The dog ran in the park. Birds sing in the morning and rest at night.
Can you recommend a book? Try a classic novel, a short story collection, or a book about science.
Error: file not found. Check the path and try again. Warning: the budget is almost spent.
"""


def build_tiny_tokenizer(path_or_none: str | os.PathLike | None = None, vocab_size: int = 1024):
    """A byte-level BPE tokenizer trained on the built-in corpus; saved to `path_or_none` if given.

    Deterministic: the same `vocab_size` gives the same vocabulary and merges on every machine.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=list(SPECIAL_TOKENS[1:]),
        model_max_length=4096,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    if path_or_none is not None:
        fast.save_pretrained(str(path_or_none))
    return fast


def _head_dims(hidden_size: int) -> tuple[int, int, int]:
    heads = 4 if hidden_size % 4 == 0 else 1
    kv = 2 if heads % 2 == 0 else 1
    return heads, kv, hidden_size // heads


def _text_shape(tiny_cfg) -> dict:
    """The decoder's shape: what the model's size and memory follow from (no token ids: no tokenizer)."""
    heads, kv, head_dim = _head_dims(tiny_cfg.hidden_size)
    return dict(
        vocab_size=tiny_cfg.vocab_size,
        hidden_size=tiny_cfg.hidden_size,
        intermediate_size=2 * tiny_cfg.hidden_size,
        num_hidden_layers=tiny_cfg.num_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )


def _text_config(tiny_cfg, tokenizer) -> dict:
    if len(tokenizer) > tiny_cfg.vocab_size:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens, more than model.tiny.vocab_size "
                         f"{tiny_cfg.vocab_size}")
    return dict(
        _text_shape(tiny_cfg),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        initializer_range=0.1,  # 0.02 (default) leaves a frozen random model near-uniform: LoRA barely moves it
    )


def _vision_shape(tiny_cfg) -> dict:
    return dict(
        depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16, spatial_merge_size=2,
        temporal_patch_size=2, out_hidden_size=tiny_cfg.hidden_size, num_position_embeddings=64,
        deepstack_visual_indexes=[0],
    )


def tiny_dims(tiny_cfg):
    """The tiny model's ModelDims from its shape alone: what preflight and the memory estimate need,
    without building the tokenizer or importing transformers (and torch with it: ~2 s of CPU)."""
    from payload.model.memory import dims_from_config

    text = _text_shape(tiny_cfg)
    if tiny_cfg.arch == "qwen3":
        return dims_from_config({**text, "model_type": "qwen3"}, "tiny config")
    return dims_from_config({"model_type": "qwen3_vl", "text_config": {**text, "model_type": "qwen3_vl_text"},
                             "vision_config": _vision_shape(tiny_cfg), "tie_word_embeddings": True}, "tiny config")


def _mrope_section(head_dim: int) -> list[int]:
    """Three sections (t, h, w) summing to head_dim/2, as Qwen3-VL requires (else it silently breaks)."""
    half = head_dim // 2
    hw = (half * 3) // 8
    return [half - 2 * hw, hw, hw]


def tiny_config(tiny_cfg, tokenizer):
    """The transformers config of the tiny model (Qwen3Config or Qwen3VLConfig)."""
    from transformers import Qwen3Config, Qwen3VLConfig

    text = _text_config(tiny_cfg, tokenizer)
    if tiny_cfg.arch == "qwen3":
        return Qwen3Config(**text)
    text["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "mrope_section": _mrope_section(text["head_dim"]),
        "mrope_interleaved": True,
    }
    ids = tokenizer.convert_tokens_to_ids
    return Qwen3VLConfig(
        text_config=text,
        vision_config=_vision_shape(tiny_cfg),
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=True,
    )


# Qwen3-VL-2B's vision tower (its text model has Qwen3-1.7B's shape, memory.KNOWN_QWEN "qwen3-vl/2")
QWEN3_VL_2B_VISION = dict(
    depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, patch_size=16, spatial_merge_size=2,
    temporal_patch_size=2, num_position_embeddings=2304, deepstack_visual_indexes=[5, 11, 17],
)


def shape_config(arch: str, dims, tokenizer, vision: dict | None = None):
    """A transformers config at a given decoder shape (`payload.model.memory.ModelDims`, e.g. a real
    Qwen3-8B's), for a random model that trains exactly like the real one costs. The model's vocab
    is `dims.vocab` (151936 for Qwen) even though the local tokenizer uses only its first ids."""
    from transformers import Qwen3Config, Qwen3VLConfig

    text = dict(
        vocab_size=dims.vocab, hidden_size=dims.hidden, intermediate_size=dims.intermediate,
        num_hidden_layers=dims.layers, num_attention_heads=dims.heads, num_key_value_heads=dims.kv_heads,
        head_dim=dims.head_dim, max_position_embeddings=40960, tie_word_embeddings=dims.tied,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    if arch == "qwen3":
        return Qwen3Config(**text)
    half = dims.head_dim // 2
    section = [24, 20, 20] if half == 64 else _mrope_section(dims.head_dim)  # Qwen3-VL's own at head_dim 128
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": section,
                               "mrope_interleaved": True}
    vis = dict(vision or dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                              spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                              deepstack_visual_indexes=[0]))
    vis["out_hidden_size"] = dims.hidden
    ids = tokenizer.convert_tokens_to_ids
    return Qwen3VLConfig(
        text_config=text, vision_config=vis, tie_word_embeddings=dims.tied,
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
    )


def materialize_shape(dest_dir: str | os.PathLike, arch: str, dims, vision: dict | None = None,
                      device: str = "cpu", dtype: str = "bfloat16", seed: int = TINY_SEED) -> Path:
    """Save a random model of shape `dims` (+ the local tokenizer, + image processor for VL) to
    `dest_dir` once, atomically, for `from_pretrained`. Built directly on `device` in `dtype`
    (an 8B model: ~16 GB, seconds on a GPU), so no fp32 copy ever exists in host memory."""
    import torch
    from transformers import Qwen3ForCausalLM, Qwen3VLForConditionalGeneration

    def build(tmp: Path) -> str:
        tokenizer = build_tiny_tokenizer(None)
        config = shape_config(arch, dims, tokenizer, vision)
        cls = Qwen3ForCausalLM if arch == "qwen3" else Qwen3VLForConditionalGeneration
        with torch.random.fork_rng(devices=[]), torch.device(device):
            torch.manual_seed(seed)
            model = cls._from_config(config, dtype=getattr(torch, dtype))
        model.save_pretrained(str(tmp))
        del model
        if arch == "qwen3_vl":
            build_tiny_image_processor().save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        return json.dumps({"arch": arch, "hidden": dims.hidden, "layers": dims.layers, "vocab": dims.vocab,
                           "dtype": dtype}) + "\n"

    return _materialize_atomically(Path(dest_dir), build)


def build_tiny_model(tiny_cfg, tokenizer, seed: int = TINY_SEED):
    """A random tiny model (fp32, CPU); the same arguments give byte-identical weights.

    The global RNG state is left untouched (weights come from a forked RNG).
    """
    import torch
    from transformers import Qwen3ForCausalLM, Qwen3VLForConditionalGeneration

    config = tiny_config(tiny_cfg, tokenizer)
    cls = Qwen3ForCausalLM if tiny_cfg.arch == "qwen3" else Qwen3VLForConditionalGeneration
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config).to(torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    return model.eval()


def build_tiny_image_processor():
    """The PIL Qwen2-VL image processor (no torchvision), sized for tiny images: 32-64 px a side."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        patch_size=16, merge_size=2, temporal_patch_size=2,
        min_pixels=32 * 32, max_pixels=64 * 64,
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
    )


def image_only_processor(image_processor, tokenizer, chat_template=None):
    """A Qwen3-VL processor for images (and text) without a video processor.

    The Qwen3-VL video processor needs torchvision, which CPU-only installs lack; images go through
    the PIL image processor and never need it.
    """
    from transformers import Qwen3VLProcessor

    global _ImageOnlyProcessor
    if _ImageOnlyProcessor is None:

        class ImageOnlyQwen3VLProcessor(Qwen3VLProcessor):
            def check_argument_for_proper_class(self, argument_name, argument):
                if argument_name == "video_processor" and argument is None:
                    return None
                return super().check_argument_for_proper_class(argument_name, argument)

            def save_pretrained(self, save_directory, **kwargs):
                """Tokenizer (with the chat template) + image processor config: what loading needs."""
                os.makedirs(save_directory, exist_ok=True)
                self.tokenizer.chat_template = self.chat_template or self.tokenizer.chat_template
                self.image_processor.save_pretrained(save_directory)
                self.tokenizer.save_pretrained(save_directory)
                return [str(save_directory)]

        _ImageOnlyProcessor = ImageOnlyQwen3VLProcessor
    return _ImageOnlyProcessor(
        image_processor=image_processor, tokenizer=tokenizer, video_processor=None,
        chat_template=chat_template or tokenizer.chat_template,
    )


_ImageOnlyProcessor = None


def build_tiny_processor(tokenizer):
    """Processor of the tiny Qwen3-VL model (images + text)."""
    return image_only_processor(build_tiny_image_processor(), tokenizer, CHAT_TEMPLATE)


def _tiny_of(cfg):
    """Accept a RunConfig, a ModelConfig or a TinyModel."""
    model = getattr(cfg, "model", cfg)
    tiny = getattr(model, "tiny", model)
    if tiny is None or not hasattr(tiny, "arch"):
        raise ValueError("materialize_tiny needs a config with `model.tiny` set")
    return tiny


def materialize_tiny(cfg, dest_dir: str | os.PathLike) -> Path:
    """Save the tiny model + tokenizer (+ processor for VL) to `dest_dir` once; return the path."""
    dest = Path(dest_dir)
    if (dest / _DONE).is_file():
        return dest
    tiny = _tiny_of(cfg)

    def build(tmp: Path) -> str:
        tokenizer = build_tiny_tokenizer(None, vocab_size=tiny.vocab_size)
        model = build_tiny_model(tiny, tokenizer)
        model.save_pretrained(str(tmp))
        if tiny.arch == "qwen3_vl":
            build_tiny_image_processor().save_pretrained(str(tmp))  # preprocessor_config.json
        tokenizer.save_pretrained(str(tmp))
        return f"{tiny.model_dump_json()}\n"

    return _materialize_atomically(dest, build)


def _materialize_atomically(dest: Path, build) -> Path:
    """Run `build(tmp_dir) -> marker text` in a temporary sibling and rename it into place, so a killed
    process never leaves a half-written base model, and concurrent processes (torchrun ranks) agree
    on one copy."""
    if (dest / _DONE).is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-" + dest.name + "-", dir=dest.parent))
    try:
        (tmp / _DONE).write_text(build(tmp))
        if dest.exists() and not (dest / _DONE).is_file():
            shutil.rmtree(dest, ignore_errors=True)  # a leftover from an older, interrupted layout
        try:
            os.chmod(tmp, 0o755)
            os.rename(tmp, dest)
        except OSError:
            if not (dest / _DONE).is_file():  # lost a race to a process that has not finished: odd
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
