"""A small byte-level BPE tokenizer with Qwen3's chat template tokens, for dummy-weight engines (host.py).

The operator's flags name Qwen3's reasoning parser and the hermes tool parser, which look up <think>,
</think>, <tool_call> and </tool_call> in the vocabulary: they are special tokens here. The model's
vocabulary (151,936 rows, config.json) is the real one; ids past this tokenizer decode to nothing.

  python3 tok.py DIR
"""

import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "operator"))
from qwen_devtools.qwen3_tokens import SPECIAL_TOKENS

SPECIAL = list(SPECIAL_TOKENS)
TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)

tok = Tokenizer(models.BPE(unk_token=None))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
text = [
    f"the quick brown fox jumps over the lazy dog {i} times while serving tokens on a gpu"
    for i in range(2000)
]
trainer = trainers.BpeTrainer(
    vocab_size=2000,
    special_tokens=SPECIAL,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
)
tok.train_from_iterator(text, trainer)
fast = PreTrainedTokenizerFast(
    tokenizer_object=tok,
    eos_token="<|im_end|>",
    pad_token="<|endoftext|>",
    model_max_length=40960,
    chat_template=TEMPLATE,
)
fast.save_pretrained(sys.argv[1])
