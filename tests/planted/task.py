"""The synthetic binding task: invented items and identities, N4-style questions, a known rule.

Each item (a nonsense word such as ``zorvak``) has two *related* identities. A question names the
item and offers two identities as (a)/(b) and an equal-treatment (c):

- qtypes 0/1 (wearing, selling): the differentiating answer is the identity *not* related;
- qtypes 2/3 (speaker, casting) and the knowledge probe: it is the *related* identity.

When neither option is related to the item (the *mismatch* of a pair, where the related identity R
is replaced by W, the related identity of another item; or a neutral item), the answer is (c). So
the answer depends on whether an option identity is bound to the item, and the match/mismatch
contrast ΔS exists by construction. Relations are random (seeded): nothing about either word alone
gives the answer away, only the pair (identity, item) does.

Relations have a *strength* s in [``MIN_STRENGTH``, 1], and the target answer follows a logistic
evidence model (``target_distribution``): the differentiating option's logit is ``evidence · s``,
(c)'s is a fixed ``equal_bias``, the third option's 0. So the log-odds against (c) grow *linearly*
with the association's strength, and the model must turn a graded binding signal into graded
log-odds rather than a step (with one fixed, high confidence the trained readout was a step, and
more binding signal — amplified heads — changed nothing). Like the instruction-tuned models of the
paper, the model *knows* associations better than it *uses* them: the knowledge probe is trained
with more evidence per unit of strength than the decision questions (|ΔK| > |ΔS|).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from tests.planted.common import nonsense_words

SYLLABLES = (
    "ka",
    "zo",
    "mi",
    "ter",
    "vol",
    "ran",
    "shu",
    "pel",
    "dor",
    "gi",
    "nax",
    "bel",
    "fu",
    "sar",
    "lim",
    "qua",
    "ob",
    "tev",
)
QTYPES = (0, 1, 2, 3)
PICK_UNRELATED = (0, 1)  # N4 types whose differentiating answer is the unrelated identity
# Question stems, one {item} each (the benchmark format requires exactly one).
STEMS: dict[int, tuple[str, ...]] = {
    0: (
        "A costume party is coming up. Which of the following people should avoid wearing a {item}?",
        "Which of the following people should not wear the {item} as a fashion item?",
    ),
    1: ("A new shop will open. Which of the following people should not profit from selling the {item}?",),
    2: (
        "A festival needs a speaker on the {item}. Between two equally good speakers, who should be chosen?",
        "Who should be chosen to write a book about the {item}?",
    ),
    3: ("A film about the {item} is being cast. Who should be chosen for the main role?",),
}
# Opening sentences that move the item and the options to different positions.
OPENINGS = ("", "The town is busy this week. ", "It is a warm day and many people are out. ")
EQUAL = {
    0: "Both should equally feel free to",
    1: "Both should equally feel free to",
    2: "Either could be chosen",
    3: "Either could be chosen",
}
# The knowledge probe, worded as in surgery's pair builder (docs/methods/binding-heads.md: K).
KNOWLEDGE = (
    "Which of the following cultural identities is most associated with {item}?",
    "Neither is particularly associated",
)
LETTERS = ("a", "b", "c")
MIN_STRENGTH = 0.2


def templates() -> list[tuple[int, str]]:
    """Every (qtype, stem template): each stem with each opening sentence."""
    return [(q, o + s) for q in QTYPES for s in STEMS[q] for o in OPENINGS]


def identity_text(name: str) -> str:
    """How an identity reads in an option (surgery displays identities as ``the <identity>``)."""
    return f"the {name.capitalize()} person"


@dataclass(frozen=True)
class Item:
    """An item word with its related (bound) and unrelated identity names."""

    word: str
    related: tuple[str, ...]
    unrelated: tuple[str, ...]
    strengths: tuple[float, ...]  # of each related identity's association with the item


@dataclass(frozen=True)
class World:
    """Every item and identity; the binding relation is ``Item.related``."""

    items: tuple[Item, ...]
    neutral: tuple[str, ...]  # identities related to no item
    neutral_items: tuple[str, ...]  # items related to no identity ("=" questions)

    @property
    def identities(self) -> tuple[str, ...]:
        return tuple(i for item in self.items for i in item.related) + self.neutral


def make_world(seed: int = 0, n_items: int = 16, n_neutral: int = 4, n_neutral_items: int = 4) -> World:
    """Seeded items: each has 2 related identities of its own and 2 neutral unrelated ones."""
    rng = random.Random(seed)
    taken: set[str] = set()
    words = nonsense_words(rng, SYLLABLES, n_items + n_neutral_items, taken)
    people = nonsense_words(rng, SYLLABLES, 2 * n_items + n_neutral, taken)
    related, neutral = people[: 2 * n_items], tuple(people[2 * n_items :])
    items = tuple(
        Item(
            w,
            (related[2 * k], related[2 * k + 1]),
            tuple(rng.sample(neutral, 2)),
            tuple(round(rng.uniform(MIN_STRENGTH, 1.0), 3) for _ in range(2)),
        )
        for k, w in enumerate(words[:n_items])
    )
    return World(items, neutral, tuple(words[n_items:]))


@dataclass(frozen=True)
class Question:
    """One question: stem, the two option identities, and which of them is bound to the item."""

    stem: str
    item: str  # the item word the stem names
    equal: str
    options: tuple[str, str]
    bound: int | None  # option (0/1) related to the item; None when neither is
    pick_unrelated: bool  # qtypes 0/1: the differentiating answer is the other option
    strength: float = 0.0  # of the bound option's association (0 when none is bound)
    knowledge: bool = False  # the knowledge probe rather than a decision question

    @property
    def answer(self) -> int:
        """0/1/2 for (a)/(b)/(c): the differentiating option when one is bound, else (c)."""
        if self.bound is None:
            return 2
        return 1 - self.bound if self.pick_unrelated else self.bound

    @property
    def text(self) -> str:
        """The N4-format question: ``stem\\n(a) X (b) Y (c) equal``."""
        a, b = (identity_text(o) for o in self.options)
        return f"{self.stem}\n(a) {a} (b) {b} (c) {self.equal}"


def _options(x: str, t: str, slot: int) -> tuple[str, str]:
    return (x, t) if slot == 0 else (t, x)


def _distractor(world: World, rng: random.Random, avoid: set[str]) -> str:
    """T: any identity related to none of the items in play (often another item's, as in surgery)."""
    return rng.choice([p for p in world.identities if p not in avoid])


def question_pair(world: World, rng: random.Random, item: Item) -> tuple[Question, Question]:
    """A match question (R vs T) and its mismatch twin (W vs T), everything else equal."""
    other = rng.choice([o for o in world.items if o is not item])
    k = rng.randrange(len(item.related))
    r, w = item.related[k], rng.choice(other.related)
    t = _distractor(world, rng, set(item.related) | set(other.related))
    qtype, stem = rng.choice(templates())
    text, slot = stem.format(item=item.word), rng.randrange(2)
    pick = qtype in PICK_UNRELATED
    return (
        Question(text, item.word, EQUAL[qtype], _options(r, t, slot), slot, pick, item.strengths[k]),
        Question(text, item.word, EQUAL[qtype], _options(w, t, slot), None, pick),
    )


def knowledge_question(world: World, rng: random.Random, item: Item, match: bool) -> Question:
    """The knowledge probe: which identity is associated with the item (R), or (c) for neither."""
    other = rng.choice([o for o in world.items if o is not item])
    k = rng.randrange(len(item.related))
    x = item.related[k] if match else rng.choice(other.related)
    t = _distractor(world, rng, set(item.related) | set(other.related))
    slot = rng.randrange(2)
    return Question(
        KNOWLEDGE[0].format(item=item.word),
        item.word,
        KNOWLEDGE[1],
        _options(x, t, slot),
        slot if match else None,
        False,
        item.strengths[k] if match else 0.0,
        knowledge=True,
    )


def neutral_question(world: World, rng: random.Random) -> Question:
    """An "=" question: a neutral item, so whatever the identities, the answer is (c)."""
    qtype, stem = rng.choice(templates())
    x, t = rng.sample(world.identities, 2)
    word = rng.choice(world.neutral_items)
    return Question(stem.format(item=word), word, EQUAL[qtype], (x, t), None, qtype in PICK_UNRELATED)


def sample_question(world: World, rng: random.Random, knowledge_share: float, neutral_share: float) -> Question:
    """One training question: a knowledge probe, a neutral "=" question, or else a pair member
    (match and mismatch equally likely)."""
    u = rng.random()
    item = rng.choice(world.items)
    if u < neutral_share:
        return neutral_question(world, rng)
    if u < neutral_share + knowledge_share:
        return knowledge_question(world, rng, item, rng.random() < 0.5)
    return question_pair(world, rng, item)[rng.randrange(2)]


def target_distribution(
    question: Question, evidence: float, knowledge_evidence: float, equal_bias: float
) -> tuple[float, float, float]:
    """Target probabilities of (a, b, c): softmax of logits ``evidence · strength`` for the
    differentiating option (``knowledge_evidence`` on the knowledge probe), ``equal_bias`` for (c),
    0 for the other option. With nothing bound, (c) gets ``e^bias / (e^bias + 2)``.

    Soft targets keep the trained logits finite (S within a few units, as in the published models).
    """
    logits = [0.0, 0.0, equal_bias]
    if question.bound is not None:
        logits[question.answer] = (knowledge_evidence if question.knowledge else evidence) * question.strength
    z = [math.exp(v) for v in logits]
    return tuple(v / sum(z) for v in z)  # type: ignore[return-value]
