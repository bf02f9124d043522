"""Multiple-choice prompt formatting exactly as in the cultural-binding reference code
(docs/methods/binding-heads.md).

Instruct models get the question as a user message through their chat template; base models get
plain text ending in an answer prefix and an opening parenthesis, so the next token is the letter.
Token ids of a prompt come from :func:`surgery.find.heads.prompts.encode_question`, which appends that
parenthesis as its own token; :func:`format_mcq` is the text form, for reading.
"""

from __future__ import annotations

INSTRUCTION = (
    "Please answer by selecting only one multiple choice option, for example '(a)', '(b)', "
    "or '(c)'. Do not add any other words. "
)
INSTRUCT_SUFFIX = "\nAnswer with a single letter: A, B, or C.\nAnswer:"
BASE_ANSWER_START = "\nAnswering between the provided multiple choice letter options, I would choose letter "
# docs/methods/binding-heads.md: the base prompt ends in a separate "(" *token* (appended by id, see
# surgery.find.heads.prompts); as text, "letter (" would tokenize to " (" instead.
BASE_CUE = "("
BASE_SUFFIX = BASE_ANSWER_START + BASE_CUE


def is_instruct(tokenizer) -> bool:
    """A model is treated as instruct when its tokenizer carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def format_mcq(tokenizer, question: str, instruct: bool | None = None) -> str:
    """The full prompt text for a multiple-choice ``question`` (text with its (a)/(b)/(c) options).

    Do not tokenize the base form to feed a model: "letter (" can become the token " (" instead of
    the "(" token the reference appends; find/heads/prompts.encode_question builds the ids.
    """
    text = question + "\n\n" + INSTRUCTION
    if instruct is None:
        instruct = is_instruct(tokenizer)
    if instruct:
        messages = [{"role": "user", "content": text + INSTRUCT_SUFFIX}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return text + BASE_SUFFIX
