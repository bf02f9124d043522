"""Train a tiny Llama on the binding task with plain torch + transformers (no surgery code).

The main loss is the cross-entropy between the model's next-token distribution at the last prompt
position (right after ``... choose letter (``) and a soft target over the letters a/b/c. Prompts
are drawn fresh every step from the seeded task generator, so the model cannot memorise prompts,
only the item ↔ identity relation and the rule.

The circuit is *planted* by an auxiliary loss: a linear probe (discarded after training) reads the
residual stream after layer ``probe_layer`` at each option identity's tokens and must say whether
that identity is related to the item. An identity token can only learn about the item through
attention, so this asks for identity→item attention in the first layers — the edge the paper's
heads carry — and it breaks the long loss plateau that the answer loss alone sits on (the answer
depends on a pair lookup that gives no gradient until attention finds the item).

*Dose training* (``dose_head`` ≥ 0; tests/fixtures/binding_dose/) plants a *specific* binding head:
one layer-0 head writes only at the name of a bound identity (``quiet_loss``), attends there to the
item in proportion to the association's strength (``attend_loss``), and on ``dose_share`` of the
prompts its output and the target evidence are scaled by the same random c (``dosed_head``), so
whole-head α has a known dose-response. Without dosing none of this runs and training is unchanged
(bit for bit: binding_model and binding_decoy rebuild identically).
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

from tests.planted.common import last_logits, tiny_llama
from tests.planted.reference import positions
from tests.planted.task import LETTERS, Question, World, make_world, question_pair, sample_question, target_distribution
from tests.planted.vocab import build_tokenizer


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines the trained model (it is saved next to the checkpoint)."""

    seed: int = 1
    n_items: int = 16
    n_neutral: int = 4
    n_neutral_items: int = 4
    layers: int = 3
    heads: int = 8  # many small heads: each is a small part of the residual stream
    head_dim: int = 6
    hidden: int = 48
    intermediate: int = 96
    steps: int = 2000
    batch: int = 32
    lr: float = 5e-3
    warmup: int = 100
    weight_decay: float = 0.01
    evidence: float = 3.0  # log-odds per unit of association strength (decisions) ...
    knowledge_evidence: float = 6.0  # ... less than the model knows (knowledge probe)
    equal_bias: float = 1.0  # logit of (c), the equal-treatment answer
    knowledge_share: float = 0.4
    neutral_share: float = 0.1
    probe_layer: int = 1  # the probe reads the residual stream after this many layers
    probe_weight: float = 1.0
    # Dose training (off when dose_head < 0): on a share of the prompts, layer 0's head dose_head has
    # its output (its o_proj columns' input) scaled by c ~ U(0, dose_max) and the target evidence of
    # a bound option by the same c. The binding must then run through that head, with evidence in
    # proportion to what it writes: whole-head α (what amplify-heads bakes) has a planted dose-response.
    dose_head: int = -1
    dose_max: float = 3.0
    dose_share: float = 0.5
    dose_quiet: float = 1.0  # weight of quiet_loss (the dosed head writes only at bound identities)
    dose_attend: float = 1.0  # weight of attend_loss (... and there it reads the item)
    log_every: int = 100

    def target(self, question: Question, dose: float = 1.0) -> tuple[float, float, float]:
        """The soft target over (a, b, c) for ``question``, with the evidence scaled by ``dose``."""
        return target_distribution(question, dose * self.evidence, dose * self.knowledge_evidence, self.equal_bias)


def prompt_of(question: Question) -> str:
    """The base-model prompt that surgery's S score reads (``format_mcq`` without a chat template)."""
    from surgery.core.mcq import format_mcq

    return format_mcq(None, question.text, instruct=False)


def letter_ids(tokenizer) -> list[int]:
    return tokenizer.convert_tokens_to_ids(list(LETTERS))


def letter_logprobs(model, tokenizer, questions: Sequence[Question]) -> torch.Tensor:
    """(n, 3) log-probabilities (over the whole vocabulary) of the tokens a, b, c."""
    logp = torch.log_softmax(last_logits(model, tokenizer, [prompt_of(q) for q in questions]).float(), -1)
    return logp[:, letter_ids(tokenizer)]


def evaluate(model, tokenizer, world: World, cfg: TrainConfig, seed: int, n_pairs: int = 192) -> dict[str, float]:
    """Accuracy (the model's top letter is the target's most likely answer) and ΔS = mean S(match)
    − mean S(mismatch), S = lp_c − logsumexp(lp_a, lp_b), on ``n_pairs`` seeded pairs."""
    rng = random.Random(seed)
    pairs = [question_pair(world, rng, world.items[k % len(world.items)]) for k in range(n_pairs)]
    qs = [q for pair in pairs for q in pair]
    with torch.no_grad():
        lp = letter_logprobs(model, tokenizer, qs)
    best = [max(range(3), key=cfg.target(q).__getitem__) for q in qs]
    acc = (lp.argmax(1) == torch.tensor(best)).float().mean().item()
    s = lp[:, 2] - torch.logsumexp(lp[:, :2], 1)
    return {
        "accuracy": acc,
        "S_match": s[0::2].mean().item(),
        "S_mismatch": s[1::2].mean().item(),
        "delta_S": (s[0::2] - s[1::2]).mean().item(),
    }


def probe_targets(tokenizer, prompts: Sequence[str], questions: Sequence[Question]):
    """Rows, columns and labels of the probed tokens (each option identity's name and noun): the
    strength of the identity's association with the item, 0 when there is none."""
    rows, cols, labels = [], [], []
    for r, (text, q) in enumerate(zip(prompts, questions)):
        where = positions(tokenizer, text, q)
        for slot, toks in enumerate(where.options):
            for c in toks[1:]:  # the leading "the" comes before the name and cannot know it
                rows.append(r)
                cols.append(c)
                labels.append(q.strength if q.bound == slot else 0.0)
    return torch.tensor(rows), torch.tensor(cols), torch.tensor(labels)


def draw_doses(cfg: TrainConfig, rng: random.Random) -> list[float]:
    """One output scale of the dosed head per prompt: U(0, dose_max) on a dose_share of them, else 1."""
    if cfg.dose_head < 0:
        return [1.0] * cfg.batch
    return [rng.uniform(0.0, cfg.dose_max) if rng.random() < cfg.dose_share else 1.0 for _ in range(cfg.batch)]


@contextlib.contextmanager
def dosed_head(model, cfg: TrainConfig, doses: Sequence[float]) -> Iterator[dict[str, torch.Tensor]]:
    """Scale what layer 0's head ``cfg.dose_head`` writes by each prompt's dose (its slice of the
    o_proj input: the run-time form of a whole-head α); yields a dict that holds the head's unscaled
    output (batch, positions, head_dim) under ``"out"`` after the forward pass."""
    seen: dict[str, torch.Tensor] = {}
    if cfg.dose_head < 0:
        yield seen
        return
    d, lo = cfg.head_dim, cfg.dose_head * cfg.head_dim
    scale = torch.ones(len(doses), 1, cfg.heads * d)
    scale[:, :, lo : lo + d] = torch.tensor(doses)[:, None, None]

    def hook(_module, args):
        seen["out"] = args[0][..., lo : lo + d]
        return (args[0] * scale,)

    handle = model.model.layers[0].self_attn.o_proj.register_forward_pre_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()


def bound_names(
    tokenizer, prompts: Sequence[str], questions: Sequence[Question]
) -> tuple[list[tuple[int, int, float]], list[list[int]]]:
    """(row, position, strength) of each bound option identity's *name* token, and every row's
    item tokens.

    Only the name: in layer 0 the following noun ("person") is the same token for every identity
    and cannot know which one it belongs to (asking it to carry the binding kept the head loud)."""
    names, items = [], []
    for r, (text, q) in enumerate(zip(prompts, questions)):
        where = positions(tokenizer, text, q)
        items.append(where.item)
        if q.bound is not None:
            names.append((r, where.options[q.bound][1], q.strength))  # [0] is the leading "the"
    return names, items


def quiet_loss(
    head_out: torch.Tensor, attention_mask: torch.Tensor, names: Sequence[tuple[int, int, float]]
) -> torch.Tensor:
    """Share of the dosed head's output energy outside the bound identities' name tokens.

    Without it the dose found a shortcut: the head wrote a constant that later layers used as a
    gain on binding evidence computed by other heads (whole head α = 0 removed 91 % of ΔS, its
    identity→item edges 0 %). Kept quiet elsewhere, the head must carry the binding itself.
    """
    energy = head_out.pow(2).sum(-1) * attention_mask
    inside = sum((energy[r, c] for r, c, _ in names), torch.zeros(()))
    return 1.0 - inside / energy.sum().clamp_min(1e-12)


def attend_loss(
    attentions: torch.Tensor, head: int, names: Sequence[tuple[int, int, float]], items: Sequence[Sequence[int]]
) -> torch.Tensor:
    """Cross-entropy between the attention the dosed head pays from each bound name token to the
    item tokens (layer 0's ``attentions``: batch, heads, query, key) and the association's strength.

    The quiet loss alone left the head silent and the binding in other heads: nothing pulled its
    attention onto the item. Attention in proportion to the strength (rather than all of it) lets
    the head carry the whole graded signal: with full attention for every bound pair, the strength
    had to come from other heads, and they kept most of the binding."""
    if not names:
        return torch.zeros(())
    mass = torch.stack([attentions[r, head, c, list(items[r])].sum() for r, c, _ in names])
    strength = torch.tensor([s for _, _, s in names])
    return torch.nn.functional.binary_cross_entropy(mass.clamp(1e-6, 1 - 1e-6), strength)


def train(out_dir: Path, cfg: TrainConfig = TrainConfig(), log=print) -> dict:
    """Train, save the checkpoint + tokenizer + ``training.json`` in ``out_dir``; return the stats."""
    torch.manual_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)
    world = make_world(cfg.seed, cfg.n_items, cfg.n_neutral, cfg.n_neutral_items)
    tokenizer = build_tokenizer(world)
    model = tiny_llama(
        tokenizer,
        hidden=cfg.hidden,
        intermediate=cfg.intermediate,
        layers=cfg.layers,
        heads=cfg.heads,
        head_dim=cfg.head_dim,
        max_positions=160,
    )
    dosing = cfg.dose_head >= 0
    if dosing:  # attend_loss reads layer 0's attention probabilities, which only eager returns
        model.set_attn_implementation("eager")
    probe = torch.nn.Linear(cfg.hidden, 1)
    opt = torch.optim.AdamW([*model.parameters(), *probe.parameters()], lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * min(s, cfg.steps) / cfg.steps))
    )
    rng, ids = random.Random(cfg.seed + 1), letter_ids(tokenizer)
    dose_rng = random.Random(cfg.seed + 3)  # its own stream: without dosing, training is unchanged
    start = time.perf_counter()
    model.train()
    for step in range(cfg.steps):
        qs = [sample_question(world, rng, cfg.knowledge_share, cfg.neutral_share) for _ in range(cfg.batch)]
        prompts = [prompt_of(q) for q in qs]
        enc = tokenizer(prompts, padding=True, padding_side="right", return_tensors="pt")
        doses = draw_doses(cfg, dose_rng)
        with dosed_head(model, cfg, doses) as dosed:
            out = model(input_ids=enc.input_ids, output_hidden_states=True, output_attentions=dosing)
        last = enc.attention_mask.sum(1) - 1
        target = torch.zeros(cfg.batch, len(tokenizer))
        target[:, ids] = torch.tensor([cfg.target(q, c) for q, c in zip(qs, doses)])
        logp = torch.log_softmax(out.logits[torch.arange(cfg.batch), last], -1)
        answer_loss = -(target * logp).sum(1).mean()
        rows, cols, labels = probe_targets(tokenizer, prompts, qs)
        quiet = attend = torch.zeros(())
        if dosing:
            names, items = bound_names(tokenizer, prompts, qs)
            quiet = quiet_loss(dosed["out"], enc.attention_mask, names)
            attend = attend_loss(out.attentions[0], cfg.dose_head, names, items)
        undosed = torch.tensor(doses)[rows] == 1.0  # the probe's labels hold for the model as it is
        rows, cols, labels = rows[undosed], cols[undosed], labels[undosed]
        probe_logits = probe(out.hidden_states[cfg.probe_layer][rows, cols]).squeeze(-1)
        # When every probed prompt is dosed the mean is over nothing (NaN): a zero loss instead,
        # whose zero gradients leave the optimiser's step exactly as the empty mean left it.
        probe_loss = (
            torch.nn.functional.binary_cross_entropy_with_logits(probe_logits, labels)
            if len(rows)
            else probe_logits.sum()
        )
        loss = answer_loss + cfg.probe_weight * probe_loss + cfg.dose_quiet * quiet + cfg.dose_attend * attend
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            model.eval()
            check = evaluate(model, tokenizer, world, cfg, seed=cfg.seed + 2, n_pairs=32)
            model.train()
            log(
                f"step {step:5d}  answer loss {answer_loss.item():.4f}  probe loss {probe_loss.item():.3f}  quiet {quiet.item():.2f}  attend {attend.item():.2f}  "
                f"accuracy {check['accuracy']:.2f}  ΔS {check['delta_S']:+.2f}  {time.perf_counter() - start:.0f}s"
            )
    model.eval()
    stats = {
        "config": asdict(cfg),
        "train_seconds": round(time.perf_counter() - start, 1),
        "parameters": sum(p.numel() for p in model.parameters()),
        "eval": evaluate(model, tokenizer, world, cfg, seed=cfg.seed + 2),
    }
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "training.json").write_text(json.dumps(stats, indent=1) + "\n")
    return stats
