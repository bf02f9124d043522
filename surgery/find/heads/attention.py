"""A registered attention function: eager attention plus binding features, edge knockout and edge-α.

``transformers`` calls the function registered under :data:`NAME` for every attention layer once
a model's attention implementation is switched to it (:func:`surgery_attention`). With no active
:class:`AttentionPlan` it computes exactly what eager attention computes. A plan (set with
:func:`active_plan`, a context variable, because ``generate`` rejects unknown keyword arguments)
can ask it to

- keep per-head binding features: ``bind_x = P[query ∈ option x, key ∈ item].sum(keys).mean(queries)``
  for x = a, b — only these (B, 2, H) numbers per layer are kept, never the attention maps;
- open the attribution-patching screen (``AttentionPlan.screen``, surgery.find.heads.screen): every head's
  probabilities become ``P + e·(P_ko − P)`` with a zero leaf ``e`` per row and head, so that
  ∂S/∂e is the first-order change of S when that head's identity→item edges are knocked out;
- scale the identity→item edges of chosen heads: ``P' = P_ko + α·(P − P_ko)``, where ``P_ko`` is
  the softmax with those scores set to the dtype's minimum. α = 0 is the edge knockout, α = 1
  changes nothing, α > 1 amplifies. Because the head output is ``P·V``, this is exactly the
  published ``out_ko + α·(out − out_ko)`` at the identity query positions (other rows: P_ko = P).

Edits apply to the prompt pass only (query length = plan length), or to a pass resumed from
cached keys/values at query position ``AttentionPlan.start`` (surgery.find.heads.resume: queries are the
positions ``start:``, keys all ``length`` positions). Decoding steps of ``generate``
(query length 1 against a longer cache) add generated tokens, which are never identity tokens, so
they run unchanged; their cached keys/values already carry the edited prompt pass.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from torch import nn

from ...core.errors import SurgeryError

NAME = "surgery"


@dataclass(frozen=True)
class EdgeEdit:
    """Scale the edges query ∈ span ``queries`` → key ∈ span ``keys`` of ``heads`` by ``alpha``."""

    heads: Mapping[int, tuple[int, ...]]  # layer → heads
    alpha: float
    queries: str = "tested"
    keys: str = "item"

    def is_identity(self) -> bool:
        return self.alpha == 1.0 or not any(self.heads.values())


@dataclass
class AttentionPlan:
    """What the attention function does during one prompt pass (and the decoding that follows)."""

    masks: Mapping[str, torch.Tensor]  # span name → (B, L) bool, in padded positions
    features: bool = False
    edit: EdgeEdit | None = None
    bind: dict[int, torch.Tensor] = field(default_factory=dict)  # layer → (B, 2, H) float32
    start: int = 0  # first query position (> 0 in a pass resumed from cached keys/values)
    changed: torch.Tensor | None = None  # (B,) bool: rows whose probabilities the edit changed
    # the attribution-patching screen (screen.py): layer → (B, H) zero leaf along each head's knockout
    screen: dict[int, torch.Tensor] | None = None

    @property
    def length(self) -> int:
        if not self.masks:
            raise SurgeryError("the attention plan has no token positions yet; set its masks before the forward pass")
        return next(iter(self.masks.values())).shape[1]

    def applies(self, q_len: int, k_len: int) -> bool:
        """True on the prompt pass (or its resumed part), False on a cached decoding step; anything
        else is a misuse."""
        if q_len == self.length - self.start and k_len == self.length:
            return True
        if k_len > q_len and q_len < self.length - self.start:
            return False
        raise SurgeryError(
            f"attention plan built for {self.length}-token prompts met a {q_len}-token "
            "pass; build the plan from the same batch that is run"
        )

    def query_masks(self) -> dict[str, torch.Tensor]:
        """The span masks over the query positions of this pass (``start:``)."""
        return {name: m[:, self.start :] for name, m in self.masks.items()}

    def features_tensor(self, layers: int | Sequence[int]) -> torch.Tensor:
        """(B, layers, heads): the mean of bind_a and bind_b, the discovery feature, of ``layers`` (a
        count: layers 0…n−1; a hybrid model passes its attention layers)."""
        layers = range(layers) if isinstance(layers, int) else layers
        missing = [layer for layer in layers if layer not in self.bind]
        if missing:
            raise SurgeryError(
                f"no binding features for layers {missing[:5]}: was the model switched "
                "to the surgery attention function?"
            )
        return torch.stack([self.bind[layer].mean(dim=1) for layer in layers], dim=1)


_ACTIVE: ContextVar[AttentionPlan | None] = ContextVar("surgery_attention_plan", default=None)


@contextmanager
def active_plan(plan: AttentionPlan | None) -> Iterator[AttentionPlan | None]:
    """Make ``plan`` the one the attention function reads (nested uses restore the outer one)."""
    token = _ACTIVE.set(plan)
    try:
        yield plan
    finally:
        _ACTIVE.reset(token)


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, kv, L, d) → (B, kv·groups, L, d): query head h reads kv head h // groups."""
    if groups == 1:
        return x
    b, kv, length, d = x.shape
    return x[:, :, None].expand(b, kv, groups, length, d).reshape(b, kv * groups, length, d)


def _bind(probs: torch.Tensor, masks: Mapping[str, torch.Tensor], queries: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """(B, 2, H): attention mass from option-a / option-b tokens (``queries``) to the item tokens."""
    # in float32 whatever the model computes in: these are the features the heads are found from
    to_item = torch.einsum("bhqk,bk->bhq", probs.float(), masks["item"].float())
    out = []
    for name in ("a", "b"):
        q = queries[name].float()
        out.append(torch.einsum("bhq,bq->bh", to_item, q) / q.sum(-1).clamp(min=1)[:, None])
    return torch.stack(out, dim=1)


def _sparse_mask(mask: torch.Tensor | None, indices: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """The additive ``mask`` with every key outside a query's ``indices`` (B, Q, top-k) at the dtype's
    minimum, as DeepSeek-V3.2-style models build it for eager attention (they hand a custom attention
    function the indices instead)."""
    b, _, q, k = scores.shape
    outside = torch.ones(b, q, k, dtype=torch.bool, device=scores.device).scatter(-1, indices.long(), False)
    base = scores.new_zeros(b, 1, q, k) if mask is None else mask
    return base.masked_fill(outside[:, None], torch.finfo(base.dtype).min)


def _softmax(scores: torch.Tensor, sinks: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """The attention probabilities of ``scores`` (B, H, Q, K); with per-head ``sinks`` (GPT-OSS,
    DeepSeek-V4, Hunyuan-V4) as eager attention computes them: one more logit per row, softmaxed with
    the rest and dropped, so a row sums to less than 1."""
    if sinks is None:
        return nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
    b, h, q, _ = scores.shape
    sink = sinks.reshape(1, -1, 1, 1).expand(b, h, q, 1).to(device=scores.device, dtype=scores.dtype)
    combined = torch.cat([scores, sink], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    return nn.functional.softmax(combined, dim=-1, dtype=combined.dtype)[..., :-1].to(dtype)


def _edit(
    scores: torch.Tensor,
    probs: torch.Tensor,
    heads: tuple[int, ...],
    edit: EdgeEdit,
    masks: Mapping[str, torch.Tensor],
    queries: Mapping[str, torch.Tensor],
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """``probs`` with the chosen heads' identity→item edges scaled by α (see the module docstring)."""
    idx = torch.tensor(heads, device=scores.device)
    edge = queries[edit.queries][:, None, :, None] & masks[edit.keys][:, None, None, :]
    knocked = scores.index_select(1, idx).masked_fill(edge, torch.finfo(scores.dtype).min)
    p_ko = _softmax(knocked, None if sinks is None else sinks.index_select(0, idx.to(sinks.device)), probs.dtype)
    p = probs.index_select(1, idx)
    out = probs.clone()
    out[:, idx] = p_ko + edit.alpha * (p - p_ko)
    return out


def _screened(
    scores: torch.Tensor,
    probs: torch.Tensor,
    plan: AttentionPlan,
    layer: int,
    queries: Mapping[str, torch.Tensor],
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """``probs`` + e·(P_ko − P) with a new zero leaf e (B, H) in ``plan.screen[layer]``. P_ko is the
    exact knocked-out pattern of each head (its own softmax with the edges masked, as :func:`_edit`
    computes it), so the screen linearises only the model above the pattern, not the softmax."""
    heads = tuple(range(probs.shape[1]))
    with torch.no_grad():
        step = _edit(scores, probs, heads, EdgeEdit({layer: heads}, 0.0), plan.masks, queries, sinks) - probs
    leaf = torch.zeros(probs.shape[:2], dtype=torch.float32, device=probs.device, requires_grad=True)
    plan.screen[layer] = leaf
    return probs + (leaf[:, :, None, None] * step.float()).to(probs.dtype)


def surgery_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention (GQA, MLA's wider q·k than v heads, Gemma-2 soft-capping, additive mask,
    attention sinks) plus the active plan's work."""
    if scaling is None:
        scaling = module.head_dim**-0.5
    groups = query.shape[1] // key.shape[1]  # query heads per k/v head (1 without GQA; GPT-2 has no such attribute)
    keys, values = _repeat_kv(key, groups), _repeat_kv(value, groups)
    scores = torch.matmul(query, keys.transpose(2, 3)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if kwargs.get("indices") is not None:  # DeepSeek sparse attention: each query reads its indexer's top-k keys
        attention_mask = _sparse_mask(attention_mask, kwargs["indices"], scores)
    if attention_mask is not None:
        scores = scores + attention_mask
    sinks = kwargs.get("s_aux")  # per-head sink logits (GPT-OSS, DeepSeek-V4, Hunyuan-V4)
    probs = _softmax(scores, sinks, query.dtype)
    plan = _ACTIVE.get()
    if plan is not None and plan.applies(query.shape[2], keys.shape[2]):
        layer, queries = module.layer_idx, plan.query_masks()
        if plan.features:
            with torch.no_grad():  # features are read, never differentiated
                plan.bind[layer] = _bind(probs, plan.masks, queries).cpu()
        if plan.screen is not None:
            probs = _screened(scores, probs, plan, layer, queries, sinks)
        edit = plan.edit
        if edit is not None and not edit.is_identity() and edit.heads.get(layer):
            edited = _edit(scores, probs, tuple(edit.heads[layer]), edit, plan.masks, queries, sinks)
            rows = (edited != probs).flatten(1).any(1)
            plan.changed = rows if plan.changed is None else plan.changed | rows
            probs = edited
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    out = torch.matmul(probs, values).transpose(1, 2).contiguous()
    return out, probs


def register() -> None:
    """Register the function and its (eager) mask under :data:`NAME`; idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(NAME, surgery_attention)
    # Without a registered mask function, transformers passes no mask at all to custom functions.
    AttentionMaskInterface.register(NAME, eager_mask)


@contextmanager
def surgery_attention_on(model: nn.Module) -> Iterator[nn.Module]:
    """Switch ``model``'s text decoder to the surgery attention function; the previous one is restored
    on exit. A multimodal wrapper's other towers keep theirs (some support no other, e.g. GOT-OCR2's
    eager-only vision encoder)."""
    from ...model.hooks import model_architecture

    register()
    key = model_architecture(model).layout.config.text_config_key
    text = model.config.get_text_config()
    previous = text._attn_implementation
    model.set_attn_implementation({key: NAME} if key else NAME)
    if text._attn_implementation != NAME:
        raise SurgeryError(
            f"{type(model).__name__} cannot switch its attention function; binding "
            "features and edge edits need a model built on transformers' AttentionInterface"
        )
    try:
        yield model
    finally:
        model.set_attn_implementation({key: previous} if key else previous)


def edge_heads(heads: list[tuple[int, int]]) -> dict[int, tuple[int, ...]]:
    """``[(layer, head), …]`` → ``{layer: (heads…)}``."""
    out: dict[int, list[int]] = {}
    for layer, head in heads:
        out.setdefault(layer, []).append(head)
    return {layer: tuple(sorted(set(h))) for layer, h in out.items()}
