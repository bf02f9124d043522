"""Dense families (issue 24): ungated MLPs, fused q/k/v, GPT-2's Conv1D, config keys of their own."""

from __future__ import annotations

from .layout import ConfigKeys, Layout
from .parts import _DECODER

# --- dense (issue 24) ---
# Llama-shaped decoders (self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj), ungated MLPs (up → act →
# down), fused q/k/v, GPT-2's Conv1D, and config keys spelled the family's own way. What each row
# says is proven on a tiny model of the family (tests/bake/test_families_dense.py).

_NO_QKV = dict(q_proj=None, k_proj=None, v_proj=None)
# Every head has its own k/v and head_dim = hidden / heads (a stray head_dim key is not read).
_MHA = dict(num_key_value_heads=None, head_dim=None)
# GPT-2 and its descendants: n_layer, n_head, n_embd, n_inner (null: 4 × n_embd).
_GPT2_KEYS = ConfigKeys("n_layer", "n_head", "n_embd", "n_inner", **_MHA, mlp_ratio=4)
_GPT2 = dict(
    o_proj="attn.c_proj",
    **_NO_QKV,
    qkv_proj="attn.c_attn",
    gate_proj=None,
    up_proj="mlp.c_fc",
    down_proj="mlp.c_proj",
    final_norm="ln_f",
    embeddings="wte",
)
_GPT2_CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
# Checkpoints saved from the base model (the Hub's gpt2, bloom) have no "transformer." prefix.
_GPT_H = ("transformer.h.{layer}.", "h.{layer}.")
_NEOX_MLP = dict(gate_proj=None, up_proj="mlp.dense_h_to_4h", down_proj="mlp.dense_4h_to_h")
_FC_MLP = dict(gate_proj=None, up_proj="fc1", down_proj="fc2")
_FUSED_GATE_UP = dict(gate_proj=None, up_proj=None, gate_up_proj="mlp.gate_up_proj")
# transformers' conversion_mapping.py, "exaone" (the names EXAONE 3.x releases and save_pretrained use)
_EXAONE_RENAMES = (
    (r"^transformer\.wte\.", "model.embed_tokens."),
    (r"^transformer\.h\.", "model.layers."),
    (r"^transformer\.ln_f\.", "model.norm."),
    (r"\.attn\.attention\.", ".self_attn."),
    (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."),
    (r"\.ln_1\.", ".input_layernorm."),
    (r"\.ln_2\.", ".post_attention_layernorm."),
    (r"\.mlp\.c_fc_0\.", ".mlp.gate_proj."),
    (r"\.mlp\.c_fc_1\.", ".mlp.up_proj."),
    (r"\.mlp\.c_proj\.", ".mlp.down_proj."),
)

DENSE: dict[str, Layout] = {
    # Llama-shaped
    "cohere": Layout(_DECODER, logit_multiplier="logit_scale"),
    "cohere2": Layout(_DECODER, logit_multiplier="logit_scale"),
    "cwm": Layout(_DECODER),
    "doge": Layout(_DECODER),
    "ernie4_5": Layout(_DECODER),
    "exaone": Layout(_DECODER, renames=_EXAONE_RENAMES),
    "exaone4": Layout(_DECODER),
    "granite": Layout(_DECODER, logit_divisor="logits_scaling"),
    "granite_swa": Layout(_DECODER, logit_divisor="logits_scaling"),
    "helium": Layout(_DECODER),
    "hunyuan_v1_dense": Layout(_DECODER),
    "hyperclovax": Layout(_DECODER, logit_multiplier="logits_scaling"),
    "internlm3": Layout(_DECODER),
    "iquestcoder": Layout(_DECODER),
    "ministral": Layout(_DECODER),
    "ministral3": Layout(_DECODER),
    "olmo": Layout(_DECODER),
    "olmo3": Layout(_DECODER),
    "seed_oss": Layout(_DECODER),
    "smollm3": Layout(_DECODER),
    "stablelm": Layout(_DECODER),
    "vaultgemma": Layout(_DECODER, logit_softcap="final_logit_softcapping"),
    # BitNet normalises the MLP's hidden units (ffn_sub_norm) before down_proj: see Layout.prune_inputs.
    "bitnet": Layout(_DECODER, prune_inputs=False),
    "diffllama": Layout(
        _DECODER,
        head_refusal=(
            "differential attention pairs its heads (o_proj's input is num_attention_heads / 2 differential "
            "heads of 2 × head_dim); edit its MLP neurons instead"
        ),
    ),
    "glm": Layout(_DECODER, **_FUSED_GATE_UP),
    "glm4": Layout(_DECODER, **_FUSED_GATE_UP),
    # Ungated MLPs: up → act → down
    "apertus": Layout(_DECODER, gate_proj=None, prune_inputs=False),  # xIELU(0) ≠ 0
    # the text model of Apertus 1.5, also stored inside its multimodal release (transformers' conversion
    # mapping drops the "language_model." part on load)
    "apertus1p5_text": Layout(_DECODER + ("model.language_model.layers.{layer}.",), gate_proj=None, prune_inputs=False),
    "arcee": Layout(_DECODER, gate_proj=None),
    "jais2": Layout(_DECODER, gate_proj=None),
    "nanochat": Layout(
        _DECODER, gate_proj=None, up_proj="mlp.fc1", down_proj="mlp.fc2", logit_softcap="final_logit_softcapping"
    ),
    "nemotron": Layout(_DECODER, gate_proj=None),
    "starcoder2": Layout(_DECODER, gate_proj=None, up_proj="mlp.c_fc", down_proj="mlp.c_proj"),
    "phi": Layout(
        _DECODER,
        o_proj="self_attn.dense",
        gate_proj=None,
        up_proj="mlp.fc1",
        down_proj="mlp.fc2",
        final_norm="final_layernorm",
    ),
    "persimmon": Layout(
        _DECODER,
        o_proj="self_attn.dense",
        **_NO_QKV,
        qkv_proj="self_attn.query_key_value",
        **_NEOX_MLP,
        final_norm="final_layernorm",
        config_keys=ConfigKeys(**_MHA),
    ),
    "gpt_neox": Layout(
        ("gpt_neox.layers.{layer}.",),
        o_proj="attention.dense",
        **_NO_QKV,
        qkv_proj="attention.query_key_value",
        **_NEOX_MLP,
        final_norm="final_layer_norm",
        embeddings="embed_in",
        config_keys=ConfigKeys(**_MHA),
    ),
    "gpt_neox_japanese": Layout(
        ("gpt_neox_japanese.layers.{layer}.",),
        o_proj="attention.dense",
        **_NO_QKV,
        qkv_proj="attention.query_key_value",
        **_NEOX_MLP,
        final_norm="final_layer_norm",
        embeddings="embed_in",
        config_keys=ConfigKeys(intermediate_size=None, **_MHA, mlp_ratio="intermediate_multiple_size"),
    ),
    "opt": Layout(
        ("model.decoder.layers.{layer}.", "decoder.layers.{layer}."),
        o_proj="self_attn.out_proj",
        **_FC_MLP,
        final_norm="final_layer_norm",
        config_keys=ConfigKeys(intermediate_size="ffn_dim", **_MHA),
    ),
    "biogpt": Layout(
        ("biogpt.layers.{layer}.",),
        o_proj="self_attn.out_proj",
        **_FC_MLP,
        final_norm="layer_norm",
        config_keys=ConfigKeys(**_MHA),
    ),
    "xglm": Layout(
        ("model.layers.{layer}.",),
        o_proj="self_attn.out_proj",
        **_FC_MLP,
        final_norm="layer_norm",
        config_keys=ConfigKeys("num_layers", "attention_heads", "d_model", "ffn_dim", **_MHA),
    ),
    "gptj": Layout(
        ("transformer.h.{layer}.",),
        o_proj="attn.out_proj",
        q_proj="attn.q_proj",
        k_proj="attn.k_proj",
        v_proj="attn.v_proj",
        gate_proj=None,
        up_proj="mlp.fc_in",
        down_proj="mlp.fc_out",
        final_norm="ln_f",
        embeddings="wte",
        config_keys=_GPT2_KEYS,
    ),
    "codegen": Layout(
        ("transformer.h.{layer}.",),
        o_proj="attn.out_proj",
        **_NO_QKV,
        qkv_proj="attn.qkv_proj",
        gate_proj=None,
        up_proj="mlp.fc_in",
        down_proj="mlp.fc_out",
        final_norm="ln_f",
        embeddings="wte",
        config_keys=_GPT2_KEYS,
    ),
    "gpt_neo": Layout(
        ("transformer.h.{layer}.",),
        o_proj="attn.attention.out_proj",
        q_proj="attn.attention.q_proj",
        k_proj="attn.attention.k_proj",
        v_proj="attn.attention.v_proj",
        gate_proj=None,
        up_proj="mlp.c_fc",
        down_proj="mlp.c_proj",
        final_norm="ln_f",
        embeddings="wte",
        config_keys=ConfigKeys("num_layers", "num_heads", **_MHA, mlp_ratio=4),
    ),
    "bloom": Layout(
        _GPT_H,
        o_proj="self_attention.dense",
        **_NO_QKV,
        qkv_proj="self_attention.query_key_value",
        **_NEOX_MLP,
        final_norm="ln_f",
        embeddings="word_embeddings",
        config_keys=ConfigKeys("n_layer", "n_head", intermediate_size=None, **_MHA, mlp_ratio=4),
    ),
    "falcon": Layout(
        ("transformer.h.{layer}.",),
        o_proj="self_attention.dense",
        **_NO_QKV,
        qkv_proj="self_attention.query_key_value",
        **_NEOX_MLP,
        final_norm="ln_f",
        embeddings="word_embeddings",
        config_keys=ConfigKeys(
            intermediate_size="ffn_hidden_size",
            **_MHA,
            mlp_ratio=4,
            kv_heads_when=(("new_decoder_architecture", "num_kv_heads"), ("multi_query", 1)),
        ),
    ),
    "mpt": Layout(
        ("transformer.blocks.{layer}.",),
        o_proj="attn.out_proj",
        **_NO_QKV,
        qkv_proj="attn.Wqkv",
        gate_proj=None,
        up_proj="ffn.up_proj",
        down_proj="ffn.down_proj",
        final_norm="norm_f",
        embeddings="wte",
        config_keys=ConfigKeys("n_layers", "n_heads", "d_model", None, **_MHA, mlp_ratio="expansion_ratio"),
    ),
    "ctrl": Layout(
        ("transformer.h.{layer}.",),
        o_proj="multi_head_attention.dense",
        q_proj="multi_head_attention.Wq",
        k_proj="multi_head_attention.Wk",
        v_proj="multi_head_attention.Wv",
        gate_proj=None,
        up_proj="ffn.0",
        down_proj="ffn.2",
        final_norm="layernorm",
        embeddings="w",
        config_keys=ConfigKeys("n_layer", "n_head", "n_embd", "dff", **_MHA),
    ),
    "modernbert-decoder": Layout(
        _DECODER,
        o_proj="attn.Wo",
        q_proj="attn.q_proj",
        k_proj="attn.k_proj",
        v_proj="attn.v_proj",
        down_proj="mlp.Wo",
        gate_proj=None,
        up_proj=None,
        gate_up_proj="mlp.Wi",
        final_norm="final_norm",
        pre_head="lm_head",
        embeddings="embeddings.tok_embeddings",
        config_keys=ConfigKeys(**_MHA),
    ),
    "cpmant": Layout(
        ("cpmant.encoder.layers.{layer}.",),
        o_proj="self_att.self_attention.attention_out",
        q_proj="self_att.self_attention.project_q",
        k_proj="self_att.self_attention.project_k",
        v_proj="self_att.self_attention.project_v",
        gate_proj="ffn.ffn.w_in.w_0",
        up_proj="ffn.ffn.w_in.w_1",
        down_proj="ffn.ffn.w_out",
        final_norm="output_layernorm",
        embeddings=None,  # cpmant.input_embedding is not next to the layer list
        config_keys=ConfigKeys(intermediate_size="dim_ff", num_key_value_heads=None, head_dim="dim_head"),
    ),
    # GPT-2's Conv1D: weights stored [in, out]
    "gpt2": Layout(_GPT_H, **_GPT2, conv1d=_GPT2_CONV1D, config_keys=_GPT2_KEYS),
    "openai-gpt": Layout(
        _GPT_H,
        **{**_GPT2, "final_norm": None, "embeddings": "tokens_embed"},
        conv1d=_GPT2_CONV1D,
        config_keys=ConfigKeys("n_layer", "n_head", "n_embd", None, **_MHA, mlp_ratio=4),
    ),
    # GPT-BigCode: GPT-2's names on nn.Linear, one k/v head under multi_query
    "gpt_bigcode": Layout(
        ("transformer.h.{layer}.",),
        **_GPT2,
        config_keys=ConfigKeys(
            "n_layer", "n_head", "n_embd", "n_inner", **_MHA, mlp_ratio=4, kv_heads_when=(("multi_query", 1),)
        ),
    ),
    # Cohere's parallel attention and MLP block, as the text model of Cohere's Compass (North) vision models
    "cohere_compass_text": Layout(_DECODER, logit_multiplier="logit_scale"),
}
# GPT-SW3 releases are GPT-2 models (transformers maps the type to GPT2Config and GPT2LMHeadModel).
DENSE["gpt-sw3"] = DENSE["gpt2"]
