"""A small byte-level BPE tokenizer trained by ``tokenizers`` on text generated in code.

The corpus is made from a seeded ``random.Random``: invented words built from syllables,
sentences, numbers, code-like lines and chat-like turns, so the merges look like a real
tokenizer's (common words become one token) while any byte string stays encodable. Nothing
is downloaded; the same seed and size give the same ``tokenizer.json``.

Three families, as the real checkpoints they mimic: Qwen (ChatML tokens, no BOS, NFC and
Qwen's pre-tokenizer split, which transformers' ``Qwen2Tokenizer`` rebuilds on load, so the
saved ``tokenizer.json`` must already use it), Llama 3 (header tokens, a BOS added by the
post-processor, GPT-2's byte-level split) and Gemma 3 (turn tokens and a BOS as Llama 3's;
the real one is a SentencePiece-style BPE, but only the special tokens and the template
matter to the engine).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass

from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

_ONSETS = ("b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
           "z", "st", "tr", "ch", "sh", "pl", "gr", "qu", "")
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ou", "ea", "y")
_CODAS = ("", "", "n", "r", "s", "t", "l", "m", "nd", "ck", "ng", "x")
_PUNCT = (".", ".", ".", ",", "?", "!", ";", ":")
# Qwen2's pre-tokenizer split (contractions, letters, single digits, punctuation runs,
# newlines, spaces), as in its tokenizer.json and transformers' Qwen2Tokenizer.
QWEN_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
              r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
_KEYWORDS = ("def", "return", "if", "else", "for", "in", "import", "class", "while", "None",
             "True", "False", "self", "print", "len", "range")


@dataclass(frozen=True, slots=True)
class ChatFormat:
    """A family's special tokens and chat template."""

    special_tokens: tuple[str, ...]
    bos_token: str | None
    eos_token: str  # the tokenizer's eos (what ends a turn)
    stop_tokens: tuple[str, ...]  # generation_config's eos_token_id list
    chat_template: str
    tokenizer_class: str  # tokenizer_config.json's, which picks transformers' class
    split_regex: str | None  # a Split pre-tokenizer before byte-level, else GPT-2's


CHATML = ChatFormat(
    special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    bos_token=None,
    eos_token="<|im_end|>",
    stop_tokens=("<|im_end|>", "<|endoftext|>"),
    chat_template=(
        "{%- for message in messages %}\n"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n"
        "{{- '<|im_start|>assistant\\n' }}\n"
        "{%- endif %}\n"
    ),
    tokenizer_class="Qwen2Tokenizer",
    split_regex=QWEN_SPLIT,
)

LLAMA3 = ChatFormat(
    special_tokens=("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                    "<|end_header_id|>", "<|eot_id|>"),
    bos_token="<|begin_of_text|>",
    eos_token="<|eot_id|>",
    stop_tokens=("<|eot_id|>", "<|end_of_text|>"),
    chat_template=(
        "{{- bos_token }}\n"
        "{%- for message in messages %}\n"
        "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}\n"
        "{{- message['content'] | trim + '<|eot_id|>' }}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n"
        "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
        "{%- endif %}\n"
    ),
    tokenizer_class="PreTrainedTokenizerFast",
    split_regex=None,
)


# Gemma 3's chat template (the released one, for string contents): a system message is
# prefixed to the first user turn, roles must alternate, the assistant is ``model``. The
# special tokens' order gives Gemma's ids: <pad> 0, <eos> 1, <bos> 2.
GEMMA3 = ChatFormat(
    special_tokens=("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"),
    bos_token="<bos>",
    eos_token="<end_of_turn>",
    stop_tokens=("<end_of_turn>", "<eos>"),
    chat_template=(
        "{{ bos_token }}\n"
        "{%- if messages[0]['role'] == 'system' -%}\n"
        "    {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
        "    {%- set loop_messages = messages[1:] -%}\n"
        "{%- else -%}\n"
        "    {%- set first_user_prefix = '' -%}\n"
        "    {%- set loop_messages = messages -%}\n"
        "{%- endif -%}\n"
        "{%- for message in loop_messages -%}\n"
        "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
        "        {{ raise_exception('Conversation roles must alternate "
        "user/assistant/user/assistant/...') }}\n"
        "    {%- endif -%}\n"
        "    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}\n"
        "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}\n"
        "    {{- message['content'] | trim }}\n"
        "    {{- '<end_of_turn>\\n' }}\n"
        "{%- endfor -%}\n"
        "{%- if add_generation_prompt -%}\n"
        "    {{ '<start_of_turn>model\\n' }}\n"
        "{%- endif -%}\n"
    ),
    tokenizer_class="PreTrainedTokenizerFast",
    split_regex=None,
)


def _lexicon(rng: random.Random, size: int) -> list[str]:
    words: set[str] = set()
    while len(words) < size:
        n = rng.choice((1, 1, 2, 2, 2, 3, 3, 4))
        words.add("".join(rng.choice(_ONSETS) + rng.choice(_NUCLEI) + rng.choice(_CODAS)
                          for _ in range(n)))
    return sorted(words)


def corpus(seed: int, lines: int) -> Iterator[str]:
    """``lines`` lines of deterministic text (Zipf-like word frequencies)."""
    rng = random.Random(seed)
    words = _lexicon(rng, 3000)
    cum_weights = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(len(words))))

    def sentence() -> str:
        n = rng.randint(4, 18)
        ws = rng.choices(words, cum_weights=cum_weights, k=n)
        ws[0] = ws[0].capitalize()
        return " ".join(ws) + rng.choice(_PUNCT)

    for _ in range(lines):
        kind = rng.random()
        if kind < 0.6:
            yield " ".join(sentence() for _ in range(rng.randint(1, 4)))
        elif kind < 0.75:
            a, b = rng.randint(0, 99999), rng.randint(0, 999)
            yield f"{sentence()} {a} + {b} = {a + b}, and {rng.random():.4f}."
        elif kind < 0.9:
            name = "_".join(rng.choices(words[:300], k=2))
            yield (f"{rng.choice(_KEYWORDS)} {name}({rng.choice(words[:200])}): "
                   f"{rng.choice(_KEYWORDS)} {name}[{rng.randint(0, 64)}]")
        else:
            role = rng.choice(("user", "assistant", "system", "tool"))
            yield f"{role}: {sentence()}\n"


def train_tokenizer(fmt: ChatFormat, vocab_size: int, seed: int, corpus_lines: int) -> Tokenizer:
    """A byte-level BPE of at most ``vocab_size`` tokens (special tokens included)."""
    tok = Tokenizer(models.BPE())
    if fmt.split_regex is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(fmt.split_regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(fmt.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed, corpus_lines), trainer=trainer)
    if fmt.bos_token is not None:
        bos_id = tok.token_to_id(fmt.bos_token)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{fmt.bos_token} $A",
            pair=f"{fmt.bos_token} $A {fmt.bos_token} $B",
            special_tokens=[(fmt.bos_token, bos_id)],
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok
