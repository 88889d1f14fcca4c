"""The tiny random Qwen3 model the tests and the benchmark serve (no weights can be downloaded here),
and its Hugging Face cache layout, which engines in containers resolve Qwen/Qwen3-32B to.

Built by the vLLM venv's Python, which has torch, transformers and tokenizers (the project venv has
not): a random Qwen3ForCausalLM (head_dim 64: the CPU attention kernels refuse 16) with a byte-level
BPE tokenizer that knows ChatML and Qwen3's reasoning and tool-call tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from .qwen3_tokens import SPECIAL_TOKENS
from .vllm_env import vllm_python

#: Run by the vLLM venv's Python: a random 2-layer Qwen3ForCausalLM and a byte-level BPE tokenizer with
#: ChatML and the special tokens Qwen3's reasoning (<think>) and tool-call (<tool_call>) parsers look up.
_TINY_MODEL_SCRIPT = r"""
import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

out = Path(sys.argv[1])
hidden, layers = int(sys.argv[2]), int(sys.argv[3])
special = json.loads(sys.argv[4])
text = ["The quick brown fox jumps over the lazy dog.", "Qwen3 serves chat completions on vLLM.",
        "Kubernetes operators reconcile desired state.", "Hello, world! 0123456789 {}[]():;,.\"'",
        '{"name": "get_weather", "arguments": {"city": "Paris"}}'] * 20
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(text, trainers.BpeTrainer(
    vocab_size=480, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False))
chat_template = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>\n{%- for t in tools %}\n{{ t | tojson }}"
    "{%- endfor %}\n</tools>\nCall a tool as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>"
    "<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] or '' }}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{%- endif %}"
    "{%- endif %}"
)
fast = PreTrainedTokenizerFast(
    tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
    additional_special_tokens=special[1:], chat_template=chat_template, model_max_length=4096)
fast.save_pretrained(out)
torch.manual_seed(0)
config = Qwen3Config(
    vocab_size=512, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
    num_attention_heads=2,
    num_key_value_heads=1, head_dim=64, max_position_embeddings=4096, rope_theta=1_000_000.0,
    tie_word_embeddings=False, eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
    pad_token_id=fast.convert_tokens_to_ids("<|endoftext|>"), bos_token_id=None,
    torch_dtype="bfloat16")
Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
print("tiny model written to", out)
"""


def build_tiny_model(dest: Path, hidden_size: int = 128, num_layers: int = 2) -> Path:
    """Write the tiny random Qwen3 model and tokenizer into dest (about 5 s); returns dest.

    The defaults make the tests' model; the benchmark asks for a wider, deeper one so that prefill
    costs enough for prefix caching to show. Two heads of 64 and one KV head whatever the width.
    """
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            str(vllm_python()),
            "-c",
            _TINY_MODEL_SCRIPT,
            str(dest),
            str(hidden_size),
            str(num_layers),
            json.dumps(SPECIAL_TOKENS),
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    return dest


def write_hf_cache(root: Path, model_dir: Path, name: str = "Qwen/Qwen3-32B") -> Path:
    """Lay ``model_dir`` out as the Hugging Face cache entry of ``name`` under ``root``; returns the snapshot.

    With ``HF_HOME=root`` and ``HF_HUB_OFFLINE=1``, vLLM (through huggingface_hub) resolves ``name`` to
    ``root/hub/models--<org>--<name>/snapshots/<revision>/``, the revision read from ``refs/main``. The
    files are copied, not linked to blobs, so that the tree works wherever it is mounted (a PV, a
    container's volume). The revision is a hash of the files: the same model gives the same tree.
    """
    files = sorted(p for p in model_dir.rglob("*") if p.is_file())
    digest = hashlib.sha1(usedforsecurity=False)
    for path in files:
        digest.update(str(path.relative_to(model_dir)).encode() + b"\0" + path.read_bytes())
    revision = digest.hexdigest()
    repo = root / "hub" / f"models--{name.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    for path in files:
        target = snapshot / path.relative_to(model_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot
