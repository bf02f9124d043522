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
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from tests.planted.bias_task import Prompt
from tests.planted.bias_train import BiasTrainConfig, build_tokenizer, fit
from tests.planted.common import last_logits


@dataclass(frozen=True)
class MoeBiasTrainConfig(BiasTrainConfig):
    """BiasTrainConfig plus the experts: ``intermediate`` is one expert's width."""

    intermediate: int = 32
    experts: int = 4
    top_k: int = 2
    planted: int = 0  # the expert that must compute the bias
    planted_share: float = 0.25
    steps: int = 1500


def tiny_mixtral(tokenizer, cfg: MoeBiasTrainConfig):
    from transformers import MixtralConfig, MixtralForCausalLM

    return MixtralForCausalLM(
        MixtralConfig(
            vocab_size=len(tokenizer),
            hidden_size=cfg.hidden,
            intermediate_size=cfg.intermediate,
            num_hidden_layers=cfg.layers,
            num_attention_heads=cfg.heads,
            num_key_value_heads=cfg.heads,
            head_dim=cfg.head_dim,
            max_position_embeddings=64,
            tie_word_embeddings=False,
            num_local_experts=cfg.experts,
            num_experts_per_tok=cfg.top_k,
            router_aux_loss_coef=0.0,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    )


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
    tokenizer = build_tokenizer(cfg.world())
    model = tiny_mixtral(tokenizer, cfg)

    def batch_step(prompts: list[Prompt], rng: random.Random) -> tuple[torch.Tensor, torch.Tensor]:
        # 0: every expert silenced (capability alone); 1: the planted expert silenced (no bias); 2: intact
        mode = [
            0 if (r := rng.random()) < cfg.silent_share else 1 if r < cfg.silent_share + cfg.planted_share else 2
            for _ in prompts
        ]
        keep_all = torch.tensor([0.0 if m == 0 else 1.0 for m in mode])
        keep_planted = torch.tensor([0.0 if m == 1 else 1.0 for m in mode])
        with silenced_experts(model, keep_all, keep_planted, cfg.planted):
            logits = last_logits(model, tokenizer, [p.text for p in prompts])
        return logits, torch.tensor(
            [
                (0.5, 0.5) if m == 0 else p.target(cfg.capability, 0.0 if m == 1 else cfg.bias)
                for p, m in zip(prompts, mode)
            ]
        )

    return fit(model, tokenizer, cfg, out_dir, batch_step, log)
