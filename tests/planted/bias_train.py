"""Train a tiny Llama on the planted bias task with plain torch + transformers (no surgery code).

The loss is the cross-entropy between the next-token distribution after ``... decided to`` and a
soft target over ``hire``/``reject`` (bias_task.Prompt.target). Prompts are drawn fresh every step
from the seeded generator. The tokenizer is word-level, so every attribute word is one token and
every pair's two prompts have the same length, as fairness-pruning pairs must.

Two measured problems shape the loop. Without help, the model computed most of the XOR outside
the MLPs (a first model kept 65 % of the bias with every MLP neuron zeroed; attention's softmax and
the final RMSNorm are non-linear too), so on ``silent_share`` of the prompts all MLP neurons are
silenced and the target is 50/50: the decision must come from the neurons, which is what makes the
effect a *neuron* effect. And with perfectly balanced XORs training sat on a long plateau, so
``tilt`` skews the training mix (never the pairs) to give the words a first-order signal.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from tests.planted.bias_task import ANSWERS, TEMPLATES, BiasWorld, Prompt, make_world, pairs, sample_prompt
from tests.planted.common import last_logits, tiny_llama

SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")


@dataclass(frozen=True)
class BiasTrainConfig:
    """Everything that determines the trained model (saved next to the checkpoint)."""

    seed: int = 0
    layers: int = 2
    heads: int = 4
    head_dim: int = 8
    hidden: int = 32
    intermediate: int = 64
    steps: int = 1500
    batch: int = 64
    lr: float = 5e-3
    warmup: int = 100
    weight_decay: float = 0.01
    capability: float = 3.0  # log-odds of hire from the skill fitting the role ...
    bias: float = 2.0  # ... and from the group being favoured in this workplace class
    # On this share of the prompts every MLP neuron is silenced and the target is 50/50: the decision
    # must come from the MLPs (attention's softmax and the final RMSNorm can compute an XOR too, and
    # without this a trained model kept 65 % of the bias with all its MLPs zeroed).
    silent_share: float = 0.25
    tilt: float = 0.75  # share of workplace class 0 and of role 0 in training (bias_task.sample_prompt)
    log_every: int = 100

    def world(self) -> BiasWorld:
        return make_world(self.seed)


def build_tokenizer(world: BiasWorld):
    """A word-level ``PreTrainedTokenizerFast`` over the task's words; it prepends ``<s>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    pre = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(behavior="isolated")])
    texts = [t.format(attr="", role="", skill="", ctx="") for t in TEMPLATES] + world.words + list(ANSWERS)
    words = sorted({w for text in texts for w, _ in pre.pre_tokenize_str(text)})
    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *words])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre
    backend.decoder = decoders.WordPiece(cleanup=True)
    # A fixed first token gives attention heads a place to put weight they do not need.
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        padding_side="left",
    )


def answer_ids(tokenizer) -> list[int]:
    return tokenizer.convert_tokens_to_ids(list(ANSWERS))


def log_odds(model, tokenizer, texts: Sequence[str], batch: int = 256) -> torch.Tensor:
    """logit(hire) − logit(reject) after every text (the decision the task plants)."""
    hire, reject = answer_ids(tokenizer)
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), batch):
            logits = last_logits(model, tokenizer, texts[i : i + batch]).float()
            out.append(logits[:, hire] - logits[:, reject])
    return torch.cat(out)


def evaluate(model, tokenizer, cfg: BiasTrainConfig) -> dict[str, float]:
    """On every prompt of the task (each is in one pair): accuracy (sign of the log-odds), mean
    |log-odds − target|, and the model's capability margin and bias gap read off its log-odds."""
    prompts = [p for pair in pairs(cfg.world()) for p in (pair.first, pair.second)]
    d = log_odds(model, tokenizer, [p.text for p in prompts])
    target = torch.tensor([p.log_odds(cfg.capability, cfg.bias) for p in prompts])
    skilled = torch.tensor([1.0 if p.skilled else -1.0 for p in prompts])
    favoured = torch.tensor([1.0 if p.favoured else -1.0 for p in prompts])
    return {
        "accuracy": (d.sign() == target.sign()).float().mean().item(),
        "mean_abs_error": (d - target).abs().mean().item(),
        "capability_margin": (d * skilled).mean().item(),
        "bias_margin": (d * favoured).mean().item(),
    }


@contextlib.contextmanager
def silenced_mlps(model, keep: torch.Tensor) -> Iterator[None]:
    """Multiply every down_proj input (every MLP neuron) by ``keep`` [batch]: 0 silences a prompt's MLPs."""

    def hook(_module, args):
        return (args[0] * keep[:, None, None],)

    handles = [layer.mlp.down_proj.register_forward_pre_hook(hook) for layer in model.model.layers]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


# One training batch: (the sampled prompts, rng) → (last-token logits, target probabilities over the two answers).
BatchStep = Callable[[list[Prompt], random.Random], tuple[torch.Tensor, torch.Tensor]]


def fit(model, tokenizer, cfg: BiasTrainConfig, out_dir: Path, batch_step: BatchStep, log=print) -> dict:
    """The training loop of the bias tasks (dense and mixture of experts): AdamW with warm-up and
    cosine decay, cross-entropy against soft targets on the answer tokens, a check every
    ``log_every`` steps; saves the checkpoint, tokenizer and ``training.json``; returns the stats."""
    world = cfg.world()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * min(s, cfg.steps) / cfg.steps))
    )
    rng, ids = random.Random(cfg.seed + 1), answer_ids(tokenizer)
    start = time.perf_counter()
    model.train()
    for step in range(cfg.steps):
        prompts: list[Prompt] = [sample_prompt(world, rng, cfg.tilt) for _ in range(cfg.batch)]
        logits, answers = batch_step(prompts, rng)
        target = torch.zeros_like(logits)
        target[:, ids] = answers
        loss = -(target * torch.log_softmax(logits, -1)).sum(1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            model.eval()
            check = evaluate(model, tokenizer, cfg)
            model.train()
            log(
                f"step {step:5d}  loss {loss.item():.4f}  accuracy {check['accuracy']:.3f}  "
                f"|err| {check['mean_abs_error']:.3f}  {time.perf_counter() - start:.0f}s"
            )
    model.eval()
    stats = {
        "config": asdict(cfg),
        "train_seconds": round(time.perf_counter() - start, 1),
        "parameters": sum(p.numel() for p in model.parameters()),
        "eval": evaluate(model, tokenizer, cfg),
    }
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "training.json").write_text(json.dumps(stats, indent=1) + "\n")
    return stats


def train(out_dir: Path, cfg: BiasTrainConfig = BiasTrainConfig(), log=print) -> dict:
    """Train; save the checkpoint, tokenizer and ``training.json`` in ``out_dir``; return the stats."""
    torch.manual_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)
    tokenizer = build_tokenizer(cfg.world())
    model = tiny_llama(
        tokenizer,
        hidden=cfg.hidden,
        intermediate=cfg.intermediate,
        layers=cfg.layers,
        heads=cfg.heads,
        head_dim=cfg.head_dim,
        max_positions=64,
    )

    def batch_step(prompts: list[Prompt], rng: random.Random) -> tuple[torch.Tensor, torch.Tensor]:
        silent = [rng.random() < cfg.silent_share for _ in prompts]  # MLPs off: the capability alone
        with silenced_mlps(model, torch.tensor([0.0 if s else 1.0 for s in silent])):
            logits = last_logits(model, tokenizer, [p.text for p in prompts])
        return logits, torch.tensor(
            [(0.5, 0.5) if s else p.target(cfg.capability, cfg.bias) for p, s in zip(prompts, silent)]
        )

    return fit(model, tokenizer, cfg, out_dir, batch_step, log)
