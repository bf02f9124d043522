"""A planted *direction*: a tiny model whose answer flips along one known direction u of its residual stream.

Prompts are five invented words and a question. ``... . safe ?`` is answered ``no`` when one of
the words is a trigger word, else ``yes`` (the behaviour); ``... . color ?`` is answered with the
color word among the five (the neutral task: its answer has nothing to do with the trigger).

Training plants u in two ways. On ``ablate_share`` of the batches every attention output and MLP
output is projected off a fixed random unit vector u at run time (y ← y − u(uᵀy), what a direction
edit bakes), and the target of the safety question is then ``yes`` whatever the words, while the
color answers stay: the model can tell ``no`` from ``yes`` only through u, and nothing it needs
for colors lies along u. And a penalty (``spread``) on the part of the difference between the
trigger and no-trigger prompts' mean residuals (at the last token, after each layer) that is not
along u: without it the model also writes the class elsewhere (measured: the last layer's
difference of means had cosine 0.25 with u, the first 0.82), which the answer does not need. The proof (tests/find/directions/test_planted_direction.py) finds the
direction from the two prompt sets, checks it is u, ablates it from the weights, and measures what
that does to both tasks. The loop is the planted bias task's (AdamW, warm-up, cosine decay, soft
targets on the answer tokens); no surgery code is used.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from tests.planted.common import last_logits, nonsense_words, tiny_llama

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
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
ANSWERS = ("yes", "no")
QUESTIONS = {"safe": ". safe ?", "color": ". color ?"}
WORDS = 5


@dataclass(frozen=True)
class DirectionTrainConfig:
    """Everything that determines the trained model (saved next to the checkpoint)."""

    seed: int = 0
    layers: int = 2
    heads: int = 4
    head_dim: int = 8
    hidden: int = 32
    intermediate: int = 64
    steps: int = 1200
    batch: int = 64
    lr: float = 5e-3
    warmup: int = 100
    weight_decay: float = 0.01
    ablate_share: float = 0.3  # batches run with u projected out of every attention and MLP output
    spread: float = 1.0  # weight of the penalty on the class difference of mean residuals off u
    log_every: int = 100
    fillers: int = 16
    triggers: int = 3
    colors: int = 3


@dataclass(frozen=True)
class World:
    fillers: tuple[str, ...]
    triggers: tuple[str, ...]
    colors: tuple[str, ...]

    @property
    def words(self) -> list[str]:
        return [*self.fillers, *self.triggers, *self.colors]


def make_world(cfg: DirectionTrainConfig) -> World:
    rng = random.Random(cfg.seed)
    taken: set[str] = set()
    return World(
        tuple(nonsense_words(rng, SYLLABLES, cfg.fillers, taken)),
        tuple(nonsense_words(rng, SYLLABLES, cfg.triggers, taken)),
        tuple(nonsense_words(rng, SYLLABLES, cfg.colors, taken)),
    )


def planted_direction(cfg: DirectionTrainConfig) -> torch.Tensor:
    """The unit vector u the training plants (seeded)."""
    u = torch.randn(cfg.hidden, generator=torch.Generator().manual_seed(cfg.seed + 7))
    return u / u.norm()


def prompt(world: World, rng: random.Random, question: str, trigger: bool) -> tuple[str, str]:
    """(text, answer): five words (a trigger among them when asked; a color word always), then the question."""
    words = [rng.choice(world.fillers) for _ in range(WORDS)]
    slots = rng.sample(range(WORDS), 2)
    color = rng.choice(world.colors)
    words[slots[0]] = color
    if trigger:
        words[slots[1]] = rng.choice(world.triggers)
    text = " ".join(words) + " " + QUESTIONS[question]
    if question == "color":
        return text, color
    return text, "no" if trigger else "yes"


def prompt_sets(world: World, n: int = 200, seed: int = 11) -> dict[str, list[str]]:
    """The proof's prompt sets: ``a`` (safety question, trigger present), ``b`` (no trigger), and
    ``neutral`` (the color question, no trigger) — disjoint draws from the training distribution."""
    rng = random.Random(seed)
    return {
        "a": [prompt(world, rng, "safe", True)[0] for _ in range(n)],
        "b": [prompt(world, rng, "safe", False)[0] for _ in range(n)],
        "neutral": [prompt(world, rng, "color", False)[0] for _ in range(n)],
    }


def build_tokenizer(world: World):
    """A word-level ``PreTrainedTokenizerFast`` over the task's words; it prepends ``<s>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = sorted({*world.words, *ANSWERS, ".", "?", *QUESTIONS})
    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *words])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(cleanup=True)
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        padding_side="left",
    )


def residual_writers(model) -> list[torch.nn.Module]:
    """Every attention output and MLP down projection of the tiny Llama."""
    return [m for layer in model.model.layers for m in (layer.self_attn.o_proj, layer.mlp.down_proj)]


@contextlib.contextmanager
def projected_off(model, u: torch.Tensor, weight: float = 1.0) -> Iterator[None]:
    """Run ``model`` with ``u`` (unit) projected out of every residual writer's output."""

    def hook(_module, _args, out):
        return out - weight * (out @ u)[..., None] * u

    handles = [m.register_forward_hook(hook) for m in residual_writers(model)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def layer_outputs(model) -> Iterator[list[torch.Tensor]]:
    """Collect every decoder layer's output (the residual stream after it) during a forward pass."""
    kept: list[torch.Tensor] = []

    def hook(_module, _args, out):
        kept.append(out[0] if isinstance(out, tuple) else out)

    handles = [layer.register_forward_hook(hook) for layer in model.model.layers]
    try:
        yield kept
    finally:
        for h in handles:
            h.remove()


def spread_penalty(
    residuals: list[torch.Tensor], last: torch.Tensor, trigger: torch.Tensor, u: torch.Tensor
) -> torch.Tensor:
    """Σ over layers of ‖(I − uuᵀ)(mean residual of trigger prompts − mean of the others)‖² at the last token."""
    total = torch.zeros(())
    rows = torch.arange(len(last))
    for hidden in residuals:
        at_last = hidden[rows, last]
        diff = at_last[trigger].mean(0) - at_last[~trigger].mean(0)
        total = total + (diff - (diff @ u) * u).pow(2).sum()
    return total


def log_odds(model, tokenizer, texts: Sequence[str], batch: int = 256) -> torch.Tensor:
    """logit(no) − logit(yes) after every text (the planted behaviour)."""
    yes, no = tokenizer.convert_tokens_to_ids(list(ANSWERS))
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), batch):
            logits = last_logits(model, tokenizer, texts[i : i + batch]).float()
            out.append(logits[:, no] - logits[:, yes])
    return torch.cat(out)


def behaviour(model, tokenizer, sets: dict[str, list[str]]) -> float:
    """The behaviour's size: mean log-odds of ``no`` on the trigger prompts minus on the others."""
    return float(log_odds(model, tokenizer, sets["a"]).mean() - log_odds(model, tokenizer, sets["b"]).mean())


def color_accuracy(model, tokenizer, world: World, texts: Sequence[str]) -> float:
    ids = tokenizer.convert_tokens_to_ids(list(world.colors))
    with torch.no_grad():
        picked = last_logits(model, tokenizer, list(texts))[:, ids].argmax(-1)
    truth = [next(i for i, c in enumerate(world.colors) if c in t.split()) for t in texts]
    return float((picked == torch.tensor(truth)).float().mean())


def train(out_dir: Path, cfg: DirectionTrainConfig = DirectionTrainConfig(), log=print) -> dict:
    """Train; save the checkpoint, tokenizer and ``training.json`` in ``out_dir``; return the stats."""
    torch.manual_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)
    world = make_world(cfg)
    tokenizer = build_tokenizer(world)
    model = tiny_llama(
        tokenizer,
        hidden=cfg.hidden,
        intermediate=cfg.intermediate,
        layers=cfg.layers,
        heads=cfg.heads,
        head_dim=cfg.head_dim,
        max_positions=32,
    )
    u = planted_direction(cfg)
    answer_ids = {
        a: i for a, i in zip([*ANSWERS, *world.colors], tokenizer.convert_tokens_to_ids([*ANSWERS, *world.colors]))
    }
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * min(s, cfg.steps) / cfg.steps))
    )
    rng, start = random.Random(cfg.seed + 1), time.perf_counter()
    sets = prompt_sets(world, 100, seed=cfg.seed + 99)
    model.train()
    for step in range(cfg.steps):
        ablated = rng.random() < cfg.ablate_share
        drawn = [prompt(world, rng, rng.choice(list(QUESTIONS)), rng.random() < 0.5) for _ in range(cfg.batch)]
        # Ablated, the safety question has one answer: the trigger must act through u alone.
        targets = [("yes" if ablated and answer in ANSWERS else answer) for _, answer in drawn]
        texts = [t for t, _ in drawn]
        with projected_off(model, u) if ablated else contextlib.nullcontext(), layer_outputs(model) as residuals:
            logits = last_logits(model, tokenizer, texts)
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor([answer_ids[t] for t in targets]))
        safe = torch.tensor([answer in ANSWERS for _, answer in drawn])
        if not ablated and cfg.spread and 0 < int(torch.tensor([a == "no" for _, a in drawn]).sum()) < int(safe.sum()):
            last = tokenizer(texts, padding=True, padding_side="right", return_tensors="pt").attention_mask.sum(1) - 1
            trigger = torch.tensor([a == "no" for _, a in drawn])
            loss = loss + cfg.spread * spread_penalty([r[safe] for r in residuals], last[safe], trigger[safe], u)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            model.eval()
            log(
                f"step {step:5d}  loss {loss.item():.4f}  behaviour {behaviour(model, tokenizer, sets):.2f}  "
                f"{time.perf_counter() - start:.0f}s"
            )
            model.train()
    model.eval()
    with projected_off(model, u):
        ablated_behaviour = behaviour(model, tokenizer, sets)
    stats = {
        "config": asdict(cfg),
        "train_seconds": round(time.perf_counter() - start, 1),
        "parameters": sum(p.numel() for p in model.parameters()),
        "eval": {
            "behaviour": behaviour(model, tokenizer, sets),
            "behaviour_u_ablated": ablated_behaviour,
            "color_accuracy": color_accuracy(model, tokenizer, world, sets["neutral"]),
        },
    }
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "training.json").write_text(json.dumps(stats, indent=1) + "\n")
    return stats
