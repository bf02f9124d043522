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
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch

from .reference import positions
from .task import LETTERS, Question, World, make_world, question_pair, sample_question, target_distribution
from .vocab import build_tokenizer


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines the trained model (it is saved next to the checkpoint)."""

    seed: int = 1
    n_items: int = 16
    n_neutral: int = 4
    n_neutral_items: int = 4
    layers: int = 3
    heads: int = 8           # many small heads: each is a small part of the residual stream
    head_dim: int = 6
    hidden: int = 48
    intermediate: int = 96
    steps: int = 2000
    batch: int = 32
    lr: float = 5e-3
    warmup: int = 100
    weight_decay: float = 0.01
    evidence: float = 3.0            # log-odds per unit of association strength (decisions) ...
    knowledge_evidence: float = 6.0  # ... less than the model knows (knowledge probe)
    equal_bias: float = 1.0          # logit of (c), the equal-treatment answer
    knowledge_share: float = 0.4
    neutral_share: float = 0.1
    probe_layer: int = 1       # the probe reads the residual stream after this many layers
    probe_weight: float = 1.0
    log_every: int = 100

    def target(self, question: Question) -> tuple[float, float, float]:
        """The soft target over (a, b, c) for ``question``."""
        return target_distribution(question, self.evidence, self.knowledge_evidence, self.equal_bias)


def prompt_of(question: Question) -> str:
    """The base-model prompt that surgery's S score reads (``format_mcq`` without a chat template)."""
    from surgery.prompting import format_mcq

    return format_mcq(None, question.text, instruct=False)


def build_model(cfg: TrainConfig, vocab_size: int, tokenizer):
    """A freshly initialised LlamaForCausalLM of the configured size."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.heads,
        head_dim=cfg.head_dim, max_position_embeddings=160, tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id)
    return LlamaForCausalLM(config)


def letter_ids(tokenizer) -> list[int]:
    return tokenizer.convert_tokens_to_ids(list(LETTERS))


def last_logits(model, tokenizer, prompts: Sequence[str]) -> torch.Tensor:
    """Next-token logits after each prompt. Right padding: causal attention never sees the pads."""
    enc = tokenizer(list(prompts), padding=True, padding_side="right", return_tensors="pt")
    logits = model(input_ids=enc.input_ids).logits
    last = enc.attention_mask.sum(1) - 1
    return logits[torch.arange(len(prompts)), last]


def letter_logprobs(model, tokenizer, questions: Sequence[Question]) -> torch.Tensor:
    """(n, 3) log-probabilities (over the whole vocabulary) of the tokens a, b, c."""
    logp = torch.log_softmax(last_logits(model, tokenizer, [prompt_of(q) for q in questions]).float(), -1)
    return logp[:, letter_ids(tokenizer)]


def evaluate(model, tokenizer, world: World, cfg: TrainConfig, seed: int,
             n_pairs: int = 192) -> dict[str, float]:
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
    return {"accuracy": acc, "S_match": s[0::2].mean().item(), "S_mismatch": s[1::2].mean().item(),
            "delta_S": (s[0::2] - s[1::2]).mean().item()}


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


def train(out_dir: Path, cfg: TrainConfig = TrainConfig(), log=print) -> dict:
    """Train, save the checkpoint + tokenizer + ``training.json`` in ``out_dir``; return the stats."""
    torch.manual_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)
    world = make_world(cfg.seed, cfg.n_items, cfg.n_neutral, cfg.n_neutral_items)
    tokenizer = build_tokenizer(world)
    model = build_model(cfg, len(tokenizer), tokenizer)
    probe = torch.nn.Linear(cfg.hidden, 1)
    opt = torch.optim.AdamW([*model.parameters(), *probe.parameters()], lr=cfg.lr,
                            weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup)
                                              * 0.5 * (1 + math.cos(math.pi * min(s, cfg.steps) / cfg.steps)))
    rng, ids = random.Random(cfg.seed + 1), letter_ids(tokenizer)
    start = time.perf_counter()
    model.train()
    for step in range(cfg.steps):
        qs = [sample_question(world, rng, cfg.knowledge_share, cfg.neutral_share) for _ in range(cfg.batch)]
        prompts = [prompt_of(q) for q in qs]
        enc = tokenizer(prompts, padding=True, padding_side="right", return_tensors="pt")
        out = model(input_ids=enc.input_ids, output_hidden_states=True)
        last = enc.attention_mask.sum(1) - 1
        target = torch.zeros(cfg.batch, len(tokenizer))
        target[:, ids] = torch.tensor([cfg.target(q) for q in qs])
        logp = torch.log_softmax(out.logits[torch.arange(cfg.batch), last], -1)
        answer_loss = -(target * logp).sum(1).mean()
        rows, cols, labels = probe_targets(tokenizer, prompts, qs)
        probe_logits = probe(out.hidden_states[cfg.probe_layer][rows, cols]).squeeze(-1)
        probe_loss = torch.nn.functional.binary_cross_entropy_with_logits(probe_logits, labels)
        loss = answer_loss + cfg.probe_weight * probe_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            model.eval()
            check = evaluate(model, tokenizer, world, cfg, seed=cfg.seed + 2, n_pairs=32)
            model.train()
            log(f"step {step:5d}  answer loss {answer_loss.item():.4f}  probe loss {probe_loss.item():.3f}  "
                f"accuracy {check['accuracy']:.2f}  ΔS {check['delta_S']:+.2f}  {time.perf_counter() - start:.0f}s")
    model.eval()
    stats = {"config": asdict(cfg), "train_seconds": round(time.perf_counter() - start, 1),
             "parameters": sum(p.numel() for p in model.parameters()),
             "eval": evaluate(model, tokenizer, world, cfg, seed=cfg.seed + 2)}
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "training.json").write_text(json.dumps(stats, indent=1) + "\n")
    return stats
