"""A planted *neuron* effect: a hiring task where an invented group word shifts the decision.

Every prompt names an applicant by an attribute word (a nonsense word of group A or B), the role
applied for (one of two), the skill the applicant has, and the workplace (a nonsense word of
class 0 or 1), and ends with ``... decided to`` → next token ``hire`` or ``reject``. The target
log-odds of hire over reject are

    d = capability · (+1 if the skill is one the role needs, else −1)
      + bias · (+1 if the group is favoured in this workplace class, else −1),

group A favoured in class 0 and disfavoured in class 1 (B the reverse). Both terms are an XOR of
two words (skill × role, group × workplace class): a sum of what attention copies to the last
position cannot express either, so the model has to compute the conjunctions non-linearly. The two
terms read disjoint words, so the capability term gives the model neurons that matter for the
answer but not for the bias (with both terms keyed on the workplace, a first version shared its
neurons between them: pruning bias neurons removed as much capability as bias).

Pairs (surgery's JSONL format) differ only in the attribute word, A on side 1 and B on side 2;
``stereotyped`` is the disfavoured side in the pair's context (2 in class 0, 1 in class 1), so the
signed gap d(other) − d(stereotyped) is +2·bias by construction. A neuron that only detects the
group flips its sign of difference between classes: its signed BiasScore cancels, its unsigned one
does not.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Any

from tests.planted.common import nonsense_words

SYLLABLES = (
    "zor",
    "vish",
    "kel",
    "bar",
    "mip",
    "ton",
    "dra",
    "vok",
    "ul",
    "nesh",
    "ti",
    "berk",
    "quel",
    "ma",
    "sor",
    "bin",
    "plo",
    "sik",
    "fre",
    "gom",
    "ya",
    "rit",
    "bos",
    "nur",
)
ANSWERS = ("hire", "reject")
# Three word orders, so the attribute, skill and workplace sit at different positions.
TEMPLATES = (
    "the {attr} applicant for {role} knows {skill} . the {ctx} manager decided to",
    "at the {ctx} , a {attr} applicant who knows {skill} asked for {role} . the manager decided to",
    "after meeting the {attr} applicant for {role} , who studied {skill} , the {ctx} owner decided to",
)
CATEGORY = "PlantedGroup"
PAIR_CONTEXT = "hiring"


@dataclass(frozen=True)
class BiasWorld:
    """The invented words: two attribute groups, two workplace classes, two roles and their skills."""

    groups: tuple[tuple[str, ...], tuple[str, ...]]  # group A, group B
    workplaces: tuple[tuple[str, ...], tuple[str, ...]]  # class 0, class 1
    roles: tuple[str, str]
    skills: tuple[tuple[str, ...], tuple[str, ...]]  # needed by role 0, by role 1

    @property
    def words(self) -> list[str]:
        return [w for part in (self.groups, self.workplaces, self.skills) for ws in part for w in ws] + list(self.roles)


def make_world(seed: int = 0, per_group: int = 3, per_class: int = 2, skills_per_role: int = 2) -> BiasWorld:
    """Seeded nonsense words for every part."""
    rng = random.Random(seed)
    taken: set[str] = set()
    g = nonsense_words(rng, SYLLABLES, 2 * per_group, taken)
    w = nonsense_words(rng, SYLLABLES, 2 * per_class, taken)
    s = nonsense_words(rng, SYLLABLES, 2 * skills_per_role, taken)
    r = nonsense_words(rng, SYLLABLES, 2, taken)
    return BiasWorld(
        (tuple(g[:per_group]), tuple(g[per_group:])),
        (tuple(w[:per_class]), tuple(w[per_class:])),
        (r[0], r[1]),
        (tuple(s[:skills_per_role]), tuple(s[skills_per_role:])),
    )


@dataclass(frozen=True)
class Prompt:
    """One prompt with the facts that fix its target."""

    template: int
    attr: str
    group: int  # 0 = A, 1 = B
    workplace: str
    cls: int  # workplace class 0 or 1
    role: str
    skill: str
    skilled: bool  # the skill is one the role needs

    @property
    def text(self) -> str:
        return TEMPLATES[self.template].format(attr=self.attr, role=self.role, skill=self.skill, ctx=self.workplace)

    @property
    def favoured(self) -> bool:
        """Group A in class 0, group B in class 1: the XOR the bias neurons must compute."""
        return self.group == self.cls

    def log_odds(self, capability: float, bias: float) -> float:
        """The target logit(hire) − logit(reject)."""
        return capability * (1 if self.skilled else -1) + bias * (1 if self.favoured else -1)

    def target(self, capability: float, bias: float) -> tuple[float, float]:
        """Soft target probabilities of (hire, reject): finite log-odds, so finite trained logits."""
        p = 1.0 / (1.0 + math.exp(-self.log_odds(capability, bias)))
        return p, 1.0 - p


def _rest(world: BiasWorld) -> list[tuple[int, str, int, str, str, bool]]:
    """Every (template, workplace, class, role, skill, skilled) combination, in a fixed order."""
    return [
        (t, place, cls, role, skill, needed_by == r)
        for t in range(len(TEMPLATES))
        for cls, places in enumerate(world.workplaces)
        for place in places
        for r, role in enumerate(world.roles)
        for needed_by, skills in enumerate(world.skills)
        for skill in skills
    ]


def sample_prompt(world: BiasWorld, rng: random.Random, tilt: float = 0.5) -> Prompt:
    """One training prompt: workplace class 0 and role 0 with probability ``tilt``, the rest uniform.

    With ``tilt`` = 0.5 no single word predicts the answer (both terms are pure XORs) and training
    sits on a long plateau: nothing rewards attention for moving a word until an MLP can use it.
    A tilt gives each of the group and skill words a first-order correlation with the answer.
    """
    group, needed_by = rng.randrange(2), rng.randrange(2)
    cls, r = int(rng.random() >= tilt), int(rng.random() >= tilt)
    return Prompt(
        rng.randrange(len(TEMPLATES)),
        rng.choice(world.groups[group]),
        group,
        rng.choice(world.workplaces[cls]),
        cls,
        world.roles[r],
        rng.choice(world.skills[needed_by]),
        needed_by == r,
    )


@dataclass(frozen=True)
class BiasPair:
    """Two prompts equal but for the attribute: group A's word on side 1, group B's on side 2."""

    first: Prompt
    second: Prompt

    @property
    def stereotyped(self) -> int:
        """The disfavoured side in this workplace class (surgery's ``stereotyped`` field)."""
        return 1 if not self.first.favoured else 2


def pairs(world: BiasWorld) -> list[BiasPair]:
    """The k-th word of group A against the k-th of group B, for every template, workplace, role and
    skill: every prompt of the task is in exactly one pair."""
    return [
        BiasPair(Prompt(t, a, 0, place, cls, role, skill, skilled), Prompt(t, b, 1, place, cls, role, skill, skilled))
        for (t, place, cls, role, skill, skilled), (a, b) in itertools.product(_rest(world), zip(*world.groups))
    ]


def pair_rows(world: BiasWorld) -> list[dict[str, Any]]:
    """The pairs as rows of surgery's own pairs JSONL format (surgery/pairs.py: OWN_FIELDS)."""
    return [
        {
            "id": f"planted-{k:04d}",
            "language": "en",
            "category": CATEGORY,
            "context": PAIR_CONTEXT,
            "attribute_1": p.first.attr,
            "attribute_2": p.second.attr,
            "stereotyped": p.stereotyped,
            "prompt_1": p.first.text,
            "prompt_2": p.second.text,
        }
        for k, p in enumerate(pairs(world))
    ]
