"""Multiple-choice prompts exactly as in the cultural-binding reference code
(docs/methods/binding-heads.md), as text and as token ids.

Instruct models get the question as a user message through their chat template; base models get
plain text ending in an answer prefix and an opening parenthesis, so the next token is the letter.
Token ids of a prompt come from :func:`encode_question`, which appends that parenthesis as its own
token; :func:`format_mcq` is the text form, for reading. find-heads' S score and the awareness
evaluation both read these ids, so both live below find/ and evaluation/. A question's spans
(option texts, the item) are known as character ranges; a fast tokenizer's offset mapping turns
them into token positions inside the full prompt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .errors import SurgeryError

INSTRUCTION = (
    "Please answer by selecting only one multiple choice option, for example '(a)', '(b)', "
    "or '(c)'. Do not add any other words. "
)
INSTRUCT_SUFFIX = "\nAnswer with a single letter: A, B, or C.\nAnswer:"
BASE_ANSWER_START = "\nAnswering between the provided multiple choice letter options, I would choose letter "
# docs/methods/binding-heads.md: the base prompt ends in a separate "(" *token* (appended by id, see
# encode_question); as text, "letter (" would tokenize to " (" instead.
BASE_CUE = "("
BASE_SUFFIX = BASE_ANSWER_START + BASE_CUE


def is_instruct(tokenizer) -> bool:
    """A model is treated as instruct when its tokenizer carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def format_mcq(tokenizer, question: str, instruct: bool | None = None) -> str:
    """The full prompt text for a multiple-choice ``question`` (text with its (a)/(b)/(c) options).

    Do not tokenize the base form to feed a model: "letter (" can become the token " (" instead of
    the "(" token the reference appends; :func:`encode_question` builds the ids.
    """
    text = question + "\n\n" + INSTRUCTION
    if instruct is None:
        instruct = is_instruct(tokenizer)
    if instruct:
        messages = [{"role": "user", "content": text + INSTRUCT_SUFFIX}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return text + BASE_SUFFIX


@dataclass(frozen=True)
class Encoded:
    """One prompt: its token ids and, per span name, the token positions it covers."""

    ids: tuple[int, ...]
    spans: dict[str, tuple[int, ...]]


def _adds_bos(tokenizer, text: str) -> bool:
    """Chat templates already write BOS as text; adding it again would change the input."""
    bos = getattr(tokenizer, "bos_token", None)
    return not (bos and text.startswith(bos))


def cue_token_id(tokenizer) -> int:
    """The single token "(" that ends a base-model prompt (docs/methods/binding-heads.md)."""
    ids = tokenizer.encode(BASE_CUE, add_special_tokens=False)
    if len(ids) != 1:
        raise SurgeryError(
            f"this tokenizer splits {BASE_CUE!r} into {len(ids)} tokens; the base-model "
            "prompt needs it as one token: use --instruct if the model is chat-tuned"
        )
    return ids[0]


def encode_text(
    tokenizer, text: str, char_spans: Mapping[str, tuple[int, int]], offset: int = 0, extra_ids: Sequence[int] = ()
) -> Encoded:
    """Tokenize ``text`` and map each character span (shifted by ``offset``) to token positions."""
    if not char_spans:  # no positions wanted (plain generation): any tokenizer will do
        ids = tokenizer(text, add_special_tokens=_adds_bos(tokenizer, text))["input_ids"]
        return Encoded(tuple(ids) + tuple(extra_ids), {})
    if not getattr(tokenizer, "is_fast", False):
        raise SurgeryError(
            "token positions need a fast tokenizer (tokenizer.json); this checkpoint "
            "only has a slow one: convert it with transformers first"
        )
    enc = tokenizer(text, add_special_tokens=_adds_bos(tokenizer, text), return_offsets_mapping=True)
    spans = {}
    for name, (s, e) in char_spans.items():
        s, e = s + offset, e + offset
        spans[name] = tuple(i for i, (ts, te) in enumerate(enc["offset_mapping"]) if te > s and ts < e and te > ts)
    return Encoded(tuple(enc["input_ids"]) + tuple(extra_ids), spans)


def encode_question(
    tokenizer, question: str, char_spans: Mapping[str, tuple[int, int]] | None = None, instruct: bool | None = None
) -> Encoded:
    """The prompt of docs/methods/binding-heads.md for ``question``, as token ids: chat template
    (instruct), or base text ending in the answer prefix followed by the "(" token, appended by id
    (as text, "letter (" can tokenize to " (", another token). S scoring and awareness generation
    both use it, so they read the same input; ``char_spans`` are ranges inside ``question``."""
    if instruct is None:
        instruct = is_instruct(tokenizer)
    if instruct:
        text = format_mcq(tokenizer, question, instruct=True)
        extra: tuple[int, ...] = ()
    else:
        text = question + "\n\n" + INSTRUCTION + BASE_ANSWER_START
        extra = (cue_token_id(tokenizer),)
    offset = text.find(question)
    if offset < 0:
        raise SurgeryError("the chat template changed the question text; spans cannot be located")
    return encode_text(tokenizer, text, char_spans or {}, offset, extra)
