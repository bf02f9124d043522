"""Prompt sets given by the user (find-direction's two sides, the eval's marker suite): a text file
(one prompt a line) or JSONL ({"prompt": …} a line).

Prompts go through the model's chat template as one user message when it has one (instruct
models; ``template="auto"``), so that the last prompt token is where the model starts to answer.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import ParameterError, not_a_file, what_was_given
from .strict_files import DuplicateKey, load_json


@dataclass(frozen=True)
class PromptSet:
    """One side's prompts, the file they came from and its sha256."""

    path: Path
    prompts: tuple[str, ...]
    sha256: str

    def record(self) -> dict:
        return {"file": self.path.name, "prompts": len(self.prompts), "sha256": self.sha256}


def read_prompts(path: str | Path | None, name: str) -> PromptSet:
    """The prompts of ``path`` (``name``: the parameter that gave it, for errors)."""
    if path is None:
        raise ParameterError(
            f"give both {{a}} and {{b}}: the direction is the difference between two prompt sets "
            f"({{{name}}} is missing)",
            "a",
            "b",
            name,
        )
    if not isinstance(path, (str, os.PathLike)):  # a Python list of prompts, say: Path() would fail on it
        raise ParameterError(
            f"{{{name}}} must be a prompts file (a str or pathlib.Path), got {what_was_given(path)}; "
            "write the prompts to a text file, one a line",
            name,
        )
    path = Path(path).expanduser()  # ~ as a shell would: a Python caller's string is not expanded
    if not path.is_file():
        raise ParameterError(
            f"{{{name}}}: {path} {not_a_file(path)}; give a text file (one prompt a line) or JSONL", name
        )
    if path.suffix == ".json":  # read as text, a JSON array's brackets and a JSONL object's braces were prompts
        raise ParameterError(
            f"{{{name}}}: {path} is JSON, not a prompts format (read as text, its brackets and braces would be "
            "prompts); give a text file (one prompt a line) or JSONL "
            f'({path.with_suffix(".jsonl").name}: one object with a "prompt" string a line)',
            name,
        )
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ParameterError(f"{{{name}}}: {path} is not UTF-8 text; give one prompt a line", name) from None
    prompts = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                entry = load_json(line)
            except (json.JSONDecodeError, DuplicateKey):  # a key given twice: which prompt?
                entry = None
            prompt = entry.get("prompt") if isinstance(entry, dict) else None
            if not isinstance(prompt, str) or not prompt.strip():
                raise ParameterError(
                    f"{{{name}}}: line {number} of {path} is not a JSON object with a non-empty "
                    '"prompt" string; fix that line',
                    name,
                )
            prompts.append(prompt)
        else:
            prompts.append(line.strip())
    if not prompts:
        raise ParameterError(
            f"{{{name}}}: {path} holds no prompts; give one prompt a line (or JSONL, "
            'one object with a "prompt" string a line)',
            name,
        )
    return PromptSet(path, tuple(prompts), hashlib.sha256(raw).hexdigest())


def formatted(tokenizer, prompts: tuple[str, ...], template: str) -> tuple[list[str], bool]:
    """The texts the model reads, and whether the tokenizer should add its special tokens (a chat
    template writes them itself)."""
    chat = template == "chat" or (template == "auto" and bool(getattr(tokenizer, "chat_template", None)))
    if not chat:
        return list(prompts), True
    if not getattr(tokenizer, "chat_template", None):
        raise ParameterError(
            "{template} chat, but this tokenizer has no chat template; use {template} plain", "template"
        )
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in prompts
    ], False
