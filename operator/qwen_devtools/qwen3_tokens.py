"""Qwen3's special tokens, for the tokenizers the tooling writes (the tiny test model's, the GPU runs'
dummy-weight model's, the parser checks'): ChatML's, and those Qwen3's reasoning parser (<think>) and
the hermes tool parser (<tool_call>) look up in the vocabulary.

No imports: tools/measure/gpu/tok.py reads this with the GPU host's own Python, which has no
qwen_devtools dependencies installed.
"""

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
)
