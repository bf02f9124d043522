"""Multimodal wrappers, Gemma 4 and Gemma 3n.

A wrapper's text decoder is edited in place and its other towers are copied byte for byte: its row
is the text model's row under the wrapper's layer prefixes, where transformers 5 keeps the text
decoder in memory and where it (and releases of transformers < 4.52) saves it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from .layout import Layers, Layout, Limits, Mlp, Tail
from .parts import _DECODER, _WRAPPED
from .records import LayerSizes

# Gemma 4: full-attention layers with their own head size (per_layer_config), kv-shared layers
# without k/v projections (and, with use_double_wide_mlp, a twice-wide MLP).
_GEMMA4_TEXT = Layout(
    layers=Layers(layer_sizes=LayerSizes("num_kv_shared_layers", "attention_k_eq_v", "use_double_wide_mlp")),
    tail=Tail(logit_softcap="final_logit_softcapping"),
)

# Gemma 3n: each layer reads the active one of its AltUp residual streams and writes through
# laurel, altup.correct and its per-layer input, all of which act on the attention's and the MLP's
# outputs as a whole, so a head's o_proj columns and a neuron's down_proj column stay the edit's
# exact site. The last num_kv_shared_layers have no k/v projections; the MLP width may differ per
# layer (intermediate_size is a list). Its first layers' MLPs are activation-sparse: the gate is cut
# at mean + k·std over the neurons of each token, so zero input rows of one neuron would move that
# cut for every other neuron; the down_proj column alone is the exact prune (prune_inputs=False).
# Resumed passes: the decoder's hidden state is a stack of AltUp streams and its kv-shared layers
# read keys and values handed on within one forward, not a per-layer cache (kv_cache=False).
_GEMMA3N_TEXT = Layout(
    mlp=Mlp(prune_inputs=False),
    layers=Layers(layer_sizes=LayerSizes("num_kv_shared_layers", widths_per_layer=True)),
    tail=Tail(logit_softcap="final_logit_softcapping"),
    limits=Limits(
        kv_cache=False,
        find_heads_refusal="its last layer's output is a stack of AltUp streams that the model merges (unembedding "
        "projections, magnitude rescaling, a mean) before its final norm, a tail the table does not describe",
    ),
)


def _wrapper(
    table: Mapping[str, Layout], text_type: str, *also: str, model_class: str = "AutoModelForCausalLM"
) -> Layout:
    """The row of a wrapper around a ``text_type`` decoder (or one of ``also``, laid out alike):
    that decoder's row of ``table`` under the wrapper's prefixes, its sizes read from ``text_config``."""
    row = table[text_type]
    return replace(
        row,
        names=replace(row.names, layer_prefixes=_WRAPPED, native_names=()),
        config=replace(
            row.config, text_config_key="text_config", text_model_types=(text_type, *also), model_class=model_class
        ),
    )


def wrappers(table: Mapping[str, Layout]) -> dict[str, Layout]:
    """Gemma 4's and Gemma 3n's text rows and the rows of the wrappers around ``table``'s text decoders."""
    table = {**table, "gemma4_text": _GEMMA4_TEXT, "gemma4_unified_text": _GEMMA4_TEXT}

    def wrap(text_type: str, *also: str, **kwargs) -> Layout:
        return _wrapper(table, text_type, *also, **kwargs)

    def either(text_type: str) -> Layout:
        """Mixtures of experts: saved from the multimodal class (text layers under its language model)
        or, by AutoModelForCausalLM, from the text model alone under model.layers."""
        row = wrap(text_type)
        return replace(row, names=replace(row.names, layer_prefixes=_WRAPPED + _DECODER))

    return {
        "gemma4_text": _GEMMA4_TEXT,
        "gemma4_unified_text": _GEMMA4_TEXT,
        "gemma4": wrap("gemma4_text"),
        "gemma3n_text": _GEMMA3N_TEXT,
        "qwen3_5": wrap("qwen3_5_text"),  # the hybrid decoder of table_hybrid
        "gemma4_unified": wrap("gemma4_unified_text"),
        # Phi-4-multimodal: Phi-3's decoder with its vision and audio encoders beside it (model.embed_tokens_extend).
        "phi4_multimodal": table["phi3"],
        "mistral3": wrap("mistral", "ministral3", model_class="AutoModelForImageTextToText"),
        "got_ocr2": wrap("qwen2"),
        "moss_transcribe_diarize": wrap("qwen3"),
        "qwen3_5_moe": either("qwen3_5_moe_text"),
        "qwen4_exp": either("qwen4_exp_text"),
        "llama4": either("llama4_text"),
        # Fuyu: a Persimmon decoder reading image patches projected into its embeddings (no vision tower)
        "fuyu": wrap("persimmon"),
    }
