"""A character-level tokenizer for the tiny random models (vocab 96, no network).

Each character is one token, so two prompts take the same number of tokens exactly when they have
the same length: tests can plant pairs that the token-count check must skip.
"""

from __future__ import annotations

import string
from pathlib import Path

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]  # ids 0..3, matching the tiny configs' pad/bos/eos ids
CHARS = string.ascii_letters + string.digits + " .,'-"


def save_char_tokenizer(path: Path, vocab_size: int = 96) -> Path:
    """Write a PreTrainedTokenizerFast (pad 0, bos 1 prepended, eos 2, unk 3) into ``path``."""
    from tokenizers import Tokenizer, models, processors
    from transformers import PreTrainedTokenizerFast

    chars = CHARS[: vocab_size - len(SPECIALS)]
    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(chars))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>",
                                  eos_token="</s>", unk_token="<unk>")
    tok.save_pretrained(path)
    return path
