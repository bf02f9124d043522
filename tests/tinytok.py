"""A character-level tokenizer for tiny test models: every printable ASCII character is one token.

Tiny models are built with ``vocab_size=TINY_VOCAB`` so that every id of this tokenizer exists.
Token ids: 0 <pad>, 1 <s>, 2 </s>, 3 <unk>, then the characters.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Sequence

TINY_VOCAB = 128
CHARS = sorted(set(string.printable) - set("\x0b\x0c\r"))
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]


# The merge real BPE tokenizers have: " (" as one token, unlike "(" (see char_tokenizer's merges).
SPACE_PAREN = (" ", "(")


def char_tokenizer(chat_template: str | None = None, merges: Sequence[tuple[str, str]] = ()):
    """A ``PreTrainedTokenizerFast`` over single characters (optionally with a chat template, and
    BPE ``merges`` whose results become extra tokens after the characters)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS + ["".join(m) for m in merges])}
    assert len(vocab) <= TINY_VOCAB, "tiny models have TINY_VOCAB embeddings"
    backend = Tokenizer(models.BPE(vocab=vocab, merges=list(merges), unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>",
                                  eos_token="</s>", unk_token="<unk>")
    if chat_template:
        tok.chat_template = chat_template
    return tok


def save_char_tokenizer(path: Path, chat_template: str | None = None) -> Path:
    """Write the tokenizer next to a tiny checkpoint (so loaders find it)."""
    char_tokenizer(chat_template).save_pretrained(path)
    return path
