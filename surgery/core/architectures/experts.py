"""A row's mixture of experts: where the experts lie, how they are sized and which layers route (data only)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Experts:
    """Where a mixture-of-experts layer keeps its experts, in memory and in both on-disk layouts.

    In memory transformers 5 fuses every expert of a layer into one module (``module``) holding the
    3-D parameters ``gate_up_proj`` and ``down_proj``. On disk a checkpoint holds either one tensor
    per expert (``per_expert``) or the fused 3-D tensors themselves (``module`` + ``.gate_up_proj`` /
    ``.down_proj``). Fused tensors are [E, 2I, H] and [E, H, I] (gate rows [0:I], up rows [I:2I]),
    or with ``transposed`` [E, H, 2I] and [E, I, H].
    """

    num_keys: tuple[str, ...]
    """Config keys for the number of routed experts (the first present)."""
    size_key: str
    """The config key of one routed expert's intermediate size."""
    per_expert: tuple[str, str, str] | None
    """One expert's gate, up and down names on disk, relative to the layer, ``{expert}`` the index (what
    Hub releases hold and save_pretrained writes back); None: the release has only fused tensors."""
    module: str = "mlp.experts"
    """The fused in-memory module holding every expert of a layer."""
    transposed: bool = False
    """The fused tensors are [E, H, 2I] and [E, I, H] (else [E, 2I, H] and [E, H, I])."""
    interleaved: bool = False
    """Gate j and up j are entries 2j and 2j+1 of the fused gate_up (GPT-OSS), and ``gate_up_proj_bias``
    [E, 2I] follows the same order."""
    shared: str | None = None
    """A shared expert every token goes through (Qwen2-MoE): a dense MLP with its own width."""
    shared_size_key: str | None = None
    """The config key of the shared expert's width."""
    shared_inputs: tuple[str, ...] = ("gate_proj", "up_proj")
    """The shared expert's MLP inputs (whose rows feed a neuron), relative to ``shared``."""
    shared_down: str = "down_proj"
    """The shared expert's down matrix (whose columns a neuron writes through), relative to ``shared``."""
    sparse_step_key: str | None = None
    """Configs that interleave dense MLP layers (Qwen-MoE): the key of the step of the sparse layers."""
    dense_layers_key: str | None = None
    """Configs that interleave dense MLP layers (Qwen-MoE): the key that lists the dense layers."""
    stored_fused: tuple[str, str] | None = None
    """The fused tensors' names in a release's own files where transformers renames them on load
    (Granite-MoE's block_sparse_moe.input_linear / output_linear): gate_up and down, relative to a
    layer, with their suffix. The fused in-memory names (a transformers 5 re-save) are read too."""
    shared_count_key: str | None = None
    """Where the family sizes its shared expert by a count of shared experts, the key of the count: the
    width is shared_size_key × it (DeepSeek: moe_intermediate_size × n_shared_experts)."""
    shared_fused: bool = False
    """The shared expert's input is one fused [gate; up] matrix (Granite's shared_mlp.input_linear)."""
    dense_size_keys: tuple[str, ...] = ("intermediate_size",)
    """Config keys of the width of the dense MLP layers among the expert layers, the first one set
    (empty: the family has no dense MLP layers)."""
    layer_types_key: str | None = None
    """Which layers route, first: a per-layer list of "sparse"/"dense" under this key (what transformers 5
    writes)."""
    sparse_list_key: str | None = None
    """Which layers route, second: a list of the sparse layers' indices under this key."""
    first_dense_key: str | None = None
    """Which layers route, else: the step rule restricted to first_dense ≤ layer ≤ last_sparse, first_dense
    read from this key."""
    first_dense_default: int = 0
    """first_dense where config.json lacks its key, as the config class fills it in."""
    last_sparse_key: str | None = None
    """The key of last_sparse in the step rule (-1 = the last layer)."""
    sparse_offset_key: str | None = None
    """The key of the step rule's offset: layer % step == offset (Jamba: expert_layer_offset)."""
    sparse_offset: int = -1
    """The step rule's offset without its key (-1: (layer + 1) % step == 0, Qwen's rule; 0: DeepSeek's
    layer % moe_layer_freq == 0)."""
    aliases: tuple[tuple[str, str], ...] = ()
    """config.json spellings transformers reads as the keys above (the config class's attribute_map,
    alias → key), for configs that spell a key the config class's older way."""
    dispatch: str = "routed"
    """How the experts module is run: "routed" (transformers' experts interface: the tokens each expert
    is routed, with the router's weights), "dense" (Llama 4: every expert runs on every token, its input
    already scaled by the router's score, exactly 0 off the token's top-k) or "looped" (LongCat-Flash:
    its own forward loops over the routed experts, [E, 2I, H] gate/up chunked, [E, H, I] down, without
    transformers' experts interface)."""
    sparse_step: int = 1
    """The step rule's step where the family has no key for it (LongCat-Flash: 2, its one mixture of
    experts per decoder layer read in the first of the layer's two sub-layers, see Layers.sub_layers)."""
    zero_key: str | None = None
    """The config key of the number of zero-computation (identity) experts the router may pick after the
    routed ones: they have no weights, so an edit naming one is refused."""
    with_dense: bool = False
    """Whether the layers that route keep a dense MLP of their own too, edited as any dense MLP
    (LongCat-Flash: the first block's MLP reads the experts' input); False: a sparse layer's MLP is its
    experts."""
