"""Shared pieces of the cultural-binding tests: a short benchmark in our JSONL format, tiny models
with a character tokenizer (so the benchmark's text has real token positions), the N4 path."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.support.paths import REPO
from tests.support.tokenizer import TINY_VOCAB, save_char_tokenizer

# Short texts keep the character-level prompts (and the tests) small.
SMALL = [
    {"kind": "template", "qtype": 0, "text": "Who avoids {item}?", "equal": "Both"},
    {"kind": "template", "qtype": 2, "text": "Who talks on {item}?", "equal": "Either"},
    {"kind": "neutral", "qtype": 0, "item": "a cap"},
    {"kind": "neutral", "qtype": 2, "item": "taxes"},
] + [
    {
        "kind": "item",
        "item": item,
        "culture": culture,
        "qtypes": [0, 2],
        "related": related,
        "unrelated": ["a Dane", "a Finn"],
    }
    for item, culture, related in [
        ("kilts", "Scot", ["a Scot", "a Gael"]),
        ("saris", "Indian", ["an Indian", "a Tamil"]),
        ("fezzes", "Turk", ["a Turk", "an Osman"]),
        ("leis", "Hawaiian", ["a Hawaiian", "a Maui"]),
        ("ponchos", "Andean", ["a Peruvian", "an Inca"]),
        ("hanboks", "Korean", ["a Korean", "a Seoulite"]),
    ]
]
# find-heads options that keep a run on the small benchmark to seconds: 4 pairs, one random set.
FAST = ["--max-pairs", "4", "--random-sets", "1"]


def write_small_benchmark(path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in SMALL), encoding="utf-8")
    return path


def char_model(tiny, arch: str = "llama", chat_template: str | None = None, **overrides) -> Path:
    """A tiny random ``arch`` checkpoint whose tokenizer is one token per character."""
    path = tiny(arch, vocab_size=TINY_VOCAB, max_position_embeddings=512, **overrides)
    save_char_tokenizer(path, chat_template)
    return path


CHAT = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def n4_path() -> Path:
    """The shared N4 JSONL (``$SURGERY_SHARED_DATA`` or ../shared/data next to the repository)."""
    env = os.environ.get("SURGERY_SHARED_DATA")
    root = Path(env) if env else REPO.parent / "shared" / "data"
    return root / "difference_awareness" / "N4_1k.jsonl"


def assert_batching_changes_nothing(model, tok, prompts, batch_size: int, atol: float) -> None:
    """S and per-head features of ``prompts`` run ``batch_size`` at a time equal one at a time
    (padding and prompt mixes must not leak into the scores)."""
    import numpy as np

    from surgery.find.heads.attention import surgery_attention_on
    from surgery.find.heads.scores import option_token_ids, run_prompts

    ids = option_token_ids(tok)
    with surgery_attention_on(model):
        batched = run_prompts(model, prompts, ids, batch_size=batch_size, features=True)
        single = run_prompts(model, prompts, ids, batch_size=1, features=True)
    np.testing.assert_allclose(batched.s, single.s, atol=atol)
    np.testing.assert_allclose(batched.features, single.features, atol=atol)
    assert np.all(np.isfinite(batched.s))
