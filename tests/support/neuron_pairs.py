"""A small prompt-pairs file for find-neurons, in our JSONL format, for the character-level tokenizer."""

from __future__ import annotations

import json
from itertools import product

TEMPLATES = ("The {} clerk said", "A {} tenant asked why", "Then the {} pupil wrote")
ATTRIBUTES = {
    "Age": [("young", "older", 2), ("older", "young", 1)],
    "Gender": [("male", "lady", 2)],
    "SES": [("rich", "poor", 2), ("fat", "thin", 2)],
}  # fat/thin: lengths differ (skipped)


def write_pairs(path) -> str:
    """A small pairs file in our JSONL format for the character-level tiny tokenizer."""
    lines = []
    for (cat, attrs), (k, template) in product(ATTRIBUTES.items(), enumerate(TEMPLATES)):
        for a1, a2, st in attrs:
            lines.append(
                json.dumps(
                    {
                        "id": f"{cat}-{a1}-{a2}-{k}",
                        "language": "en",
                        "category": cat,
                        "context": ["labour", "housing", "educational"][k],
                        "attribute_1": a1,
                        "attribute_2": a2,
                        "stereotyped": st,
                        "prompt_1": template.format(a1),
                        "prompt_2": template.format(a2),
                    }
                )
            )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)
