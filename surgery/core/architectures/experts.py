"""A row's mixture of experts: how config.json sizes the experts, where their weights lie, the shared
expert and which layers route (data only)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExpertKeys:
    """How config.json sizes the experts: the config keys of their count and widths."""

    num_keys: tuple[str, ...]
    """Config keys for the number of routed experts (the first present)."""
    size_key: str
    """The config key of one routed expert's intermediate size."""
    dense_size_keys: tuple[str, ...] = ("intermediate_size",)
    """Config keys of the width of the dense MLP layers among the expert layers, the first one set
    (empty: the family has no dense MLP layers)."""
    zero_key: str | None = None
    """The config key of the number of zero-computation (identity) experts the router may pick after the
    routed ones: they have no weights, so an edit naming one is refused."""
    aliases: tuple[tuple[str, str], ...] = ()
    """config.json spellings transformers reads as the keys of the row's experts (the config class's
    attribute_map, alias → key), for configs that spell a key the config class's older way."""


@dataclass(frozen=True)
class ExpertWeights:
    """Where the routed experts' matrices lie, in memory and in both on-disk layouts, and how they run.

    In memory transformers 5 fuses every expert of a layer into one module (``module``) holding the
    3-D parameters ``gate_up_proj`` and ``down_proj``. On disk a checkpoint holds either one tensor
    per expert (``per_expert``) or the fused 3-D tensors themselves (``module`` + ``.gate_up_proj`` /
    ``.down_proj``). Fused tensors are [E, 2I, H] and [E, H, I] (gate rows [0:I], up rows [I:2I]),
    or with ``transposed`` [E, H, 2I] and [E, I, H].
    """

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
    stored_fused: tuple[str, str] | None = None
    """The fused tensors' names in a release's own files where transformers renames them on load
    (Granite-MoE's block_sparse_moe.input_linear / output_linear): gate_up and down, relative to a
    layer, with their suffix. The fused in-memory names (a transformers 5 re-save) are read too."""
    dispatch: str = "routed"
    """How the experts module is run: "routed" (transformers' experts interface: the tokens each expert
    is routed, with the router's weights), "dense" (Llama 4: every expert runs on every token, its input
    already scaled by the router's score, exactly 0 off the token's top-k) or "looped" (LongCat-Flash:
    its own forward loops over the routed experts, [E, 2I, H] gate/up chunked, [E, H, I] down, without
    transformers' experts interface)."""


@dataclass(frozen=True)
class SharedExpert:
    """A shared expert every token goes through beside the routed ones (Qwen2-MoE): a dense MLP with its
    own width."""

    module: str
    """The shared expert's module, relative to a layer."""
    size_key: str
    """The config key of the shared expert's width."""
    count_key: str | None = None
    """Where the family sizes its shared expert by a count of shared experts, the key of the count: the
    width is size_key × it (DeepSeek: moe_intermediate_size × n_shared_experts)."""
    inputs: tuple[str, ...] = ("gate_proj", "up_proj")
    """The shared expert's MLP inputs (whose rows feed a neuron), relative to ``module``."""
    down: str = "down_proj"
    """The shared expert's down matrix (whose columns a neuron writes through), relative to ``module``."""
    fused: bool = False
    """The shared expert's input is one fused [gate; up] matrix (Granite's shared_mlp.input_linear)."""


@dataclass(frozen=True)
class StepRule:
    """Which layers route where config.json lists none: layer % step == offset % step, from first_dense to
    last_sparse, less the listed dense layers (transformers' Qwen-MoE rule and its kin)."""

    step_key: str | None = None
    """The config key of the step of the sparse layers (Qwen-MoE: decoder_sparse_step)."""
    step: int = 1
    """The step where the family has no key for it (LongCat-Flash: 2, its one mixture of experts per
    decoder layer read in the first of the layer's two sub-layers, see Layers.sub_layers)."""
    offset_key: str | None = None
    """The key of the offset: layer % step == offset (Jamba: expert_layer_offset)."""
    offset: int = -1
    """The offset without its key (-1: (layer + 1) % step == 0, Qwen's rule; 0: DeepSeek's
    layer % moe_layer_freq == 0)."""
    first_dense_key: str | None = None
    """The key of first_dense, the first layer that may route (DeepSeek: first_k_dense_replace)."""
    first_dense_default: int = 0
    """first_dense where config.json lacks its key, as the config class fills it in."""
    last_sparse_key: str | None = None
    """The key of last_sparse, the last layer that may route (-1 = the last layer); None: the last layer."""
    dense_layers_key: str | None = None
    """The key that lists layers kept dense whatever the rule says (Qwen-MoE: mlp_only_layers)."""


@dataclass(frozen=True)
class SparseLayers:
    """Which layers route their MLP through the experts, the first rule config.json answers, and whether
    they keep a dense MLP too."""

    layer_types_key: str | None = None
    """First: a per-layer list of "sparse"/"dense" under this key (what transformers 5 writes)."""
    sparse_list_key: str | None = None
    """Second: a list of the sparse layers' indices under this key."""
    rule: StepRule = StepRule()
    """Else: the step rule, see StepRule."""
    with_dense: bool = False
    """Whether the layers that route keep a dense MLP of their own too, edited as any dense MLP
    (LongCat-Flash: the first block's MLP reads the experts' input); False: a sparse layer's MLP is its
    experts."""

    @property
    def config_keys(self) -> tuple[str | None, ...]:
        """The config.json keys the rules read, in the order they are asked (None: a rule not used)."""
        rule = self.rule
        return (
            self.layer_types_key,
            self.sparse_list_key,
            rule.step_key,
            rule.dense_layers_key,
            rule.first_dense_key,
            rule.last_sparse_key,
            rule.offset_key,
        )


@dataclass(frozen=True)
class Experts:
    """A row's mixture-of-experts layers: their parts."""

    keys: ExpertKeys
    """How config.json sizes the experts: see ExpertKeys."""
    weights: ExpertWeights
    """Where the routed experts' matrices lie and how they run: see ExpertWeights."""
    shared: SharedExpert | None = None
    """The shared expert (None: the family has none): see SharedExpert."""
    layers: SparseLayers = SparseLayers()
    """Which layers route: see SparseLayers."""
