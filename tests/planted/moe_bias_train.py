"""Train a tiny Mixtral on the planted bias task with the bias computed in one expert.

The same task, tokenizer and loss as bias_train.py (a tiny Llama there). Two kinds of silenced
prompts plant *where* the effect lives: on ``silent_share`` of the prompts every expert is
silenced (routing weights 0) and the target is 50/50, so the decision must come from the experts;
on ``planted_share`` only expert ``planted`` is silenced and the target carries the capability
term alone, so the bias term must come from that expert and the capability from the others too.
Silencing is per prompt, on the router's weights as the experts module receives them.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import torch

from tests.planted.bias_task import Prompt, make_world, sample_prompt
from tests.planted.bias_train import BiasTrainConfig, answer_ids, build_tokenizer, evaluate
from tests.planted.common import last_logits


@dataclass(frozen=True)
class MoeBiasTrainConfig(BiasTrainConfig):
    """BiasTrainConfig plus the experts: ``intermediate`` is one expert's width."""

    intermediate: int = 32
    experts: int = 4
    top_k: int = 2
    planted: int = 0           # the expert that must compute the bias
    planted_share: float = 0.25
    steps: int = 1500


def tiny_mixtral(tokenizer, cfg: MoeBiasTrainConfig):
    from transformers import MixtralConfig, MixtralForCausalLM

    return MixtralForCausalLM(MixtralConfig(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.heads,
        head_dim=cfg.head_dim, max_position_embeddings=64, tie_word_embeddings=False,
        num_local_experts=cfg.experts, num_experts_per_tok=cfg.top_k, router_aux_loss_coef=0.0,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id))


@contextlib.contextmanager
def silenced_experts(model, keep_all: torch.Tensor, keep_planted: torch.Tensor, planted: int) -> Iterator[None]:
    """Per prompt [batch]: keep_all 0 silences every expert, keep_planted 0 the planted one."""
    def hook(_module, args, kwargs):
        x, index, weights = (list(args) + list(kwargs.values()))[:3]
        per_token = x.shape[0] // keep_all.shape[0]
        everything = keep_all.repeat_interleave(per_token)[:, None]
        planted_off = keep_planted.repeat_interleave(per_token)[:, None]
        weights = weights * everything * torch.where(index == planted, planted_off, torch.ones_like(weights))
        return (x, index, weights), {}

    handles = [layer.mlp.experts.register_forward_pre_hook(hook, with_kwargs=True) for layer in model.model.layers]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def train(out_dir: Path, cfg: MoeBiasTrainConfig = MoeBiasTrainConfig(), log=print) -> dict:
    """Train; save the checkpoint, tokenizer and ``training.json`` in ``out_dir``; return the stats."""
    torch.manual_seed(cfg.seed)
    world = make_world(cfg.seed)
    tokenizer = build_tokenizer(world)
    model = tiny_mixtral(tokenizer, cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup)
                                              * 0.5 * (1 + math.cos(math.pi * min(s, cfg.steps) / cfg.steps)))
    rng, ids = random.Random(cfg.seed + 1), answer_ids(tokenizer)
    start = time.perf_counter()
    model.train()
    for step in range(cfg.steps):
        prompts: list[Prompt] = [sample_prompt(world, rng, cfg.tilt) for _ in range(cfg.batch)]
        mode = [0 if (r := rng.random()) < cfg.silent_share else 1 if r < cfg.silent_share + cfg.planted_share
                else 2 for _ in prompts]
        keep_all = torch.tensor([0.0 if m == 0 else 1.0 for m in mode])
        keep_planted = torch.tensor([0.0 if m == 1 else 1.0 for m in mode])
        with silenced_experts(model, keep_all, keep_planted, cfg.planted):
            logits = last_logits(model, tokenizer, [p.text for p in prompts])
        target = torch.zeros_like(logits)
        target[:, ids] = torch.tensor([(0.5, 0.5) if m == 0 else p.target(cfg.capability, 0.0 if m == 1 else cfg.bias)
                                       for p, m in zip(prompts, mode)])
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
            log(f"step {step:5d}  loss {loss.item():.4f}  accuracy {check['accuracy']:.3f}  "
                f"|err| {check['mean_abs_error']:.3f}  {time.perf_counter() - start:.0f}s")
    model.eval()
    stats = {"config": asdict(cfg), "train_seconds": round(time.perf_counter() - start, 1),
             "parameters": sum(p.numel() for p in model.parameters()), "eval": evaluate(model, tokenizer, cfg)}
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "training.json").write_text(json.dumps(stats, indent=1) + "\n")
    return stats
