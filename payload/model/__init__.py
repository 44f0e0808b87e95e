"""The model on the GPU: how it is loaded, in which dtype, with which attention, and its memory.

`modeling` loads the tokenizer/processor and the model (bf16/fp16, QLoRA's quantization), `adapters`
decides which of its parameters train (LoRA, QLoRA, full) and in which dtype, `sharding` is DeepSpeed's
ZeRO config, `attention` picks the kernel for the batch (flash, flex, sdpa; packed, padding-free,
padded) and says why, `memory` is the GPU-memory estimate the plan and preflight share (no torch),
`tiny` builds the tiny models tests and the demo train. It may import only the payload's base
(errors, retry).
"""
