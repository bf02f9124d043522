"""Contrastive prompt pairs for fairness pruning: loading, importing, and the token-count check.

Two prompts of a pair differ only in one demographic attribute ("the young applicant" / "the
elderly applicant"); ``stereotyped`` says which side the stereotype targets, so that a signed score
can be stereotyped minus non-stereotyped. Our own sets ship as JSONL in ``surgery/data``; the public
fairness-pruning JSON (a list of records with id, category, attribute_1/2, prompt_1/2, context) is
imported as is, with attribute_2 as the stereotyped side (as its SOURCE.md documents).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ...core.counted import counted, in_number
from ...core.errors import SurgeryError, not_a_file
from ...core.strict_files import DuplicateKey, load_json

LANGUAGES = ("en", "es")
BUILTIN = "builtin"
OWN_FIELDS = (
    "id",
    "language",
    "category",
    "context",
    "attribute_1",
    "attribute_2",
    "stereotyped",
    "prompt_1",
    "prompt_2",
)
PUBLIC_FIELDS = ("id", "category", "attribute_1", "attribute_2", "prompt_1", "prompt_2")


class PairsError(SurgeryError):
    """A prompt-pair file is missing, malformed, or leaves nothing to score."""


@dataclass(frozen=True)
class PromptPair:
    """Two prompts that differ in one demographic attribute of one category."""

    id: str
    language: str
    category: str
    context: str
    attribute_1: str
    attribute_2: str
    stereotyped: int  # 1 or 2: the side whose attribute the stereotype targets
    prompt_1: str
    prompt_2: str

    @property
    def sign(self) -> int:
        """+1 when prompt_1 is the stereotyped side: (p1 − p2)·sign = stereotyped − other."""
        return 1 if self.stereotyped == 1 else -1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PairSet:
    """The pairs one run scores, with where they came from."""

    pairs: tuple[PromptPair, ...]
    source: str

    @property
    def sha256(self) -> str:
        """Hash of the canonical content (keys sorted, one pair a line): keys findings caches."""
        text = "".join(json.dumps(p.to_dict(), sort_keys=True, ensure_ascii=False) + "\n" for p in self.pairs)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def counts(self) -> dict[str, int]:
        """Pairs per category, categories sorted."""
        return dict(sorted(Counter(p.category for p in self.pairs).items()))

    def categories(self) -> list[str]:
        return list(self.counts())

    def __len__(self) -> int:
        return len(self.pairs)


def _text(record: Mapping[str, Any], key: str, where: str) -> str:
    value = record.get(key)
    if not isinstance(value, str) or not value.strip():
        raise PairsError(f"{where}: field '{key}' must be a non-empty string, got {value!r}")
    return value


def _checked(pair: PromptPair, where: str) -> PromptPair:
    if pair.prompt_1 == pair.prompt_2:
        raise PairsError(f"{where}: prompt_1 and prompt_2 are identical; a pair must differ in one attribute")
    if pair.language not in LANGUAGES:
        raise PairsError(f"{where}: language {pair.language!r} is not one of {', '.join(LANGUAGES)}")
    return pair


def from_own(record: Any, where: str) -> PromptPair:
    """One line of our JSONL format (fields in OWN_FIELDS)."""
    if not isinstance(record, Mapping):
        raise PairsError(f"{where}: expected a JSON object with {', '.join(OWN_FIELDS)}")
    missing = [k for k in OWN_FIELDS if k not in record]
    if missing:
        raise PairsError(f"{where}: missing {in_number(len(missing), 'field')} {', '.join(missing)}")
    stereotyped = record["stereotyped"]
    if stereotyped not in (1, 2) or isinstance(stereotyped, bool):
        raise PairsError(
            f"{where}: 'stereotyped' must be 1 or 2 (the side the stereotype targets), got {stereotyped!r}"
        )
    fields = {k: _text(record, k, where) for k in OWN_FIELDS if k != "stereotyped"}
    return _checked(PromptPair(stereotyped=int(stereotyped), **fields), where)


def from_public(record: Any, where: str, language: str | None) -> PromptPair:
    """One record of the public fairness-pruning JSON; attribute_2 is the stereotyped side."""
    if not isinstance(record, Mapping):
        raise PairsError(f"{where}: expected a JSON object with {', '.join(PUBLIC_FIELDS)}")
    missing = [k for k in PUBLIC_FIELDS if k not in record]
    if missing:
        raise PairsError(f"{where}: missing {in_number(len(missing), 'field')} {', '.join(missing)}")
    pair_id = _text(record, "id", where)
    # Public ids start with the language ("EN_Age_…"); a --language fills in when they do not.
    prefix = pair_id.split("_", 1)[0].lower()
    lang = prefix if prefix in LANGUAGES else language
    if lang is None:
        raise PairsError(f"{where}: cannot tell the language of id {pair_id!r}; pass --language en|es")
    return _checked(
        PromptPair(
            id=pair_id,
            language=lang,
            category=_text(record, "category", where),
            context=str(record.get("context") or "unspecified"),
            attribute_1=_text(record, "attribute_1", where),
            attribute_2=_text(record, "attribute_2", where),
            stereotyped=2,
            prompt_1=_text(record, "prompt_1", where),
            prompt_2=_text(record, "prompt_2", where),
        ),
        where,
    )


def parse_text(text: str, name: str, language: str | None = None) -> list[PromptPair]:
    """Pairs from file content: a JSON array (public format) or JSONL (our format)."""
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            records = load_json(text)
        except DuplicateKey as exc:
            raise PairsError(f"{name}: {exc.what}; give each field once") from None
        except json.JSONDecodeError as exc:
            raise PairsError(f"{name} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
        return [from_public(r, f"{name}[{i}]", language) for i, r in enumerate(records)]
    pairs = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = load_json(line)
        except DuplicateKey as exc:
            raise PairsError(f"{name} line {lineno}: {exc.key!r} is given twice in one pair; keep one") from None
        except json.JSONDecodeError as exc:
            raise PairsError(
                f"{name} line {lineno} is not valid JSON ({exc.msg}); each line must be one pair object"
            ) from None
        pairs.append(from_own(record, f"{name} line {lineno}"))
    return pairs


def builtin_text(language: str) -> str:
    """The shipped JSONL for ``language``."""
    if language not in LANGUAGES:
        raise PairsError(f"no built-in pairs for language {language!r}; choose one of {', '.join(LANGUAGES)}")
    return resources.files("surgery").joinpath("data", f"fairness_pairs_{language}.jsonl").read_text("utf-8")


def _match_categories(available: Iterable[str], wanted: Sequence[str]) -> set[str]:
    """Case-insensitive names → the spellings present; unknown names are an error."""
    by_key = {c.lower(): c for c in available}
    unknown = [w for w in wanted if w.lower() not in by_key]
    if unknown:
        raise PairsError(
            f"category {', '.join(unknown)} not in these pairs; available: {', '.join(sorted(by_key.values()))}"
        )
    return {by_key[w.lower()] for w in wanted}


def load_pairs(source: str = BUILTIN, language: str | None = None, categories: Sequence[str] | None = None) -> PairSet:
    """Load pairs from ``builtin`` (default language en) or a file, filtered by language and category."""
    if source == BUILTIN:
        language = language or "en"
        pairs = parse_text(builtin_text(language), f"builtin:{language}")
        label = f"builtin:{language}"
    else:
        path = Path(source).expanduser()
        if not path.is_file():
            raise PairsError(f"pairs file {path} {not_a_file(path)}; give a JSON/JSONL file or 'builtin'")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise PairsError(f"pairs file {path} is not UTF-8 text") from None
        pairs = parse_text(text, path.name, language)
        label = str(path)
    if language:
        pairs = [p for p in pairs if p.language == language]
        if not pairs:
            raise PairsError(f"{label} has no pairs in language {language!r}")
    if categories:
        keep = _match_categories({p.category for p in pairs}, categories)
        pairs = [p for p in pairs if p.category in keep]
    if not pairs:
        raise PairsError(f"{label} holds no prompt pairs")
    ids = Counter(p.id for p in pairs)
    dup = [i for i, n in ids.items() if n > 1]
    if dup:
        raise PairsError(f"{label}: pair id {dup[0]!r} appears {ids[dup[0]]} times; ids must be unique")
    return PairSet(tuple(pairs), label)


@dataclass(frozen=True)
class TokenCheck:
    """Which pairs tokenize to equal lengths in a tokenizer (the others are skipped)."""

    kept: PairSet
    skipped: dict[str, int]  # category → pairs skipped
    skipped_ids: tuple[str, ...]

    @property
    def total_skipped(self) -> int:
        return sum(self.skipped.values())


def check_token_counts(pairs: PairSet, tokenizer: Any, strict: bool = False) -> TokenCheck:
    """Keep pairs whose prompts take the same number of tokens; ``strict`` makes any mismatch an error.

    Equal lengths keep the two prompts position-aligned, so the pooled difference measures the
    attribute and not a length effect.
    """
    skipped: Counter[str] = Counter()
    kept, skipped_ids = [], []
    for p in pairs.pairs:
        n1 = len(tokenizer(p.prompt_1)["input_ids"])
        n2 = len(tokenizer(p.prompt_2)["input_ids"])
        if n1 == n2:
            kept.append(p)
        else:
            skipped[p.category] += 1
            skipped_ids.append(p.id)
    if skipped and strict:
        detail = ", ".join(f"{c} {n}" for c, n in sorted(skipped.items()))
        raise PairsError(
            f"{counted(sum(skipped.values()), 'pair')} tokenize to different lengths in this model's "
            f"tokenizer ({detail}), e.g. {skipped_ids[0]}; fix them or drop --strict to skip them"
        )
    if not kept:
        raise PairsError(
            f"all {len(pairs)} pairs tokenize to different lengths in this model's tokenizer; "
            "write pairs whose attributes take the same number of tokens"
        )
    return TokenCheck(PairSet(tuple(kept), pairs.source), dict(sorted(skipped.items())), tuple(skipped_ids))
