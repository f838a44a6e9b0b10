"""An offline character-level tokenizer for the tiny models.

One token per character of a fixed charset: newline and printable ASCII (space
to ``~``), which covers every task, the prompt template and ``\\boxed{}``. Four
special tokens come first: ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2, ``<unk>`` 3.
Any other character encodes to ``<unk>``.

Encoding adds no special tokens (like Qwen3's tokenizers, so lm-eval's ``hf``
model sees the same ids with its defaults): a training sequence is
``encode(prompt) + encode(solution) + [EOS_ID]``, and because tokens are single
characters, ``encode(a + b) == encode(a) + encode(b)`` always holds.

Built with the ``tokenizers`` library in code - nothing is downloaded - and
wrapped as a ``transformers.PreTrainedTokenizerFast``, so ``save_pretrained`` /
``AutoTokenizer.from_pretrained(directory)`` round-trip it offline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the tokenizer libraries load on first build: the vocabulary needs neither
    from transformers import PreTrainedTokenizerFast

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3

CHARSET = "\n" + "".join(chr(code) for code in range(32, 127))
"""The characters with a token of their own, in id order after the special tokens."""

VOCAB_SIZE = len(SPECIAL_TOKENS) + len(CHARSET)
"""Ids actually used: 4 special tokens + 96 characters = 100."""

VOCAB_PAD_MULTIPLE = 128
VOCAB_SIZE_PADDED = -(-VOCAB_SIZE // VOCAB_PAD_MULTIPLE) * VOCAB_PAD_MULTIPLE
"""Embedding / LM-head rows: ``VOCAB_SIZE`` rounded up to a multiple of 128 (so a
128-blockwise FP8 scheme can take the LM head). Ids at or above ``VOCAB_SIZE``
are never produced by the tokenizer."""


def vocabulary() -> dict[str, int]:
    """Token string -> id: the special tokens, then ``CHARSET`` in order."""
    tokens = list(SPECIAL_TOKENS) + list(CHARSET)
    return {token: index for index, token in enumerate(tokens)}


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The character-level tokenizer, built in code (no network, no files)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(vocab=vocabulary(), unk_token=UNK_TOKEN))
    # Every character is its own piece; "[\s\S]" also matches the newline.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        clean_up_tokenization_spaces=False,
        model_input_names=["input_ids", "attention_mask"],
    )
