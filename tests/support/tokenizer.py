"""The character-level tokenizer of the tiny test models: one token per character (no network).

Token ids: 0 <pad>, 1 <s>, 2 </s>, 3 <unk>, then the characters, then any BPE ``merges``. Tiny
models are built with ``vocab_size=TINY_VOCAB`` so that every id exists. With ``bos=True`` every
encoding starts with <s> and the characters are ``SMALL_CHARS`` (letters, digits, " .,'-"), which
fit the 96-token vocabulary of the conftest models: two prompts then take the same number of
tokens exactly when they have the same length, so tests can plant pairs the token-count check
must skip.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from pathlib import Path

TINY_VOCAB = 128
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]  # ids 0..3, matching the tiny configs' pad/bos/eos ids
CHARS = sorted(set(string.printable) - set("\x0b\x0c\r"))
SMALL_CHARS = string.ascii_letters + string.digits + " .,'-"
# The merge real BPE tokenizers have: " (" as one token, unlike "(" (see char_tokenizer's merges).
SPACE_PAREN = (" ", "(")


def char_tokenizer(chat_template: str | None = None, merges: Sequence[tuple[str, str]] = (), *, bos: bool = False):
    """A ``PreTrainedTokenizerFast`` over single characters (optionally with a chat template, BPE
    ``merges`` whose results become extra tokens after the characters, and <s> prepended)."""
    from tokenizers import Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    chars = list(SMALL_CHARS) if bos else CHARS
    vocab = {tok: i for i, tok in enumerate(SPECIALS + chars + ["".join(m) for m in merges])}
    assert len(vocab) <= TINY_VOCAB, "tiny models have TINY_VOCAB embeddings"
    backend = Tokenizer(models.BPE(vocab=vocab, merges=list(merges), unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    if bos:
        backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    if chat_template:
        tok.chat_template = chat_template
    return tok


def save_char_tokenizer(path: Path, chat_template: str | None = None, *, bos: bool = False) -> Path:
    """Write the tokenizer next to a tiny checkpoint (so loaders find it)."""
    char_tokenizer(chat_template, bos=bos).save_pretrained(path)
    return path
