"""Dense families: ungated MLPs, fused q/k/v, GPT-2's Conv1D, config keys of their own."""

from __future__ import annotations

from .layout import Attention, Config, Layout, Limits, Mlp, Names, Tail
from .parts import _DECODER, _FUSED_GATE_UP
from .records import ConfigKeys

# Llama-shaped decoders (self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj), ungated MLPs (up → act →
# down), fused q/k/v, GPT-2's Conv1D, and config keys spelled the family's own way. What each row
# says is proven on a tiny model of the family (tests/bake/test_families_dense.py).

# Every head has its own k/v and head_dim = hidden / heads (a stray head_dim key is not read).
_MHA = dict(num_key_value_heads=None, head_dim=None)
# GPT-2 and its descendants: n_layer, n_head, n_embd, n_inner (null: 4 × n_embd).
_GPT2_KEYS = ConfigKeys("n_layer", "n_head", "n_embd", "n_inner", **_MHA, mlp_ratio=4)
_GPT2_ATTENTION = Attention(o_proj="attn.c_proj", q_proj=None, k_proj=None, v_proj=None, qkv_proj="attn.c_attn")
_GPT2_MLP = Mlp(down_proj="mlp.c_proj", gate_proj=None, up_proj="mlp.c_fc")
_GPT2_CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
# Checkpoints saved from the base model (the Hub's gpt2, bloom) have no "transformer." prefix.
_GPT_H = ("transformer.h.{layer}.", "h.{layer}.")
_LN_F = Tail(final_norm="ln_f")
_NEOX_MLP = Mlp(down_proj="mlp.dense_4h_to_h", gate_proj=None, up_proj="mlp.dense_h_to_4h")
_FC_MLP = Mlp(down_proj="fc2", gate_proj=None, up_proj="fc1")
_UNGATED = Mlp(gate_proj=None)
_NEOX_QKV = Attention(
    o_proj="attention.dense", q_proj=None, k_proj=None, v_proj=None, qkv_proj="attention.query_key_value"
)
_DENSE_QKV = Attention(
    o_proj="self_attention.dense", q_proj=None, k_proj=None, v_proj=None, qkv_proj="self_attention.query_key_value"
)
_LOGIT_SCALE = Tail(logit_multiplier="logit_scale")
_SOFTCAP = Tail(logit_softcap="final_logit_softcapping")
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
    "cohere": Layout(tail=_LOGIT_SCALE),
    "cohere2": Layout(tail=_LOGIT_SCALE),
    "cwm": Layout(),
    "doge": Layout(),
    "ernie4_5": Layout(),
    "exaone": Layout(Names(renames=_EXAONE_RENAMES)),
    "exaone4": Layout(),
    "granite": Layout(tail=Tail(logit_divisor="logits_scaling")),
    "granite_swa": Layout(tail=Tail(logit_divisor="logits_scaling")),
    "helium": Layout(),
    "hunyuan_v1_dense": Layout(),
    "hyperclovax": Layout(tail=Tail(logit_multiplier="logits_scaling")),
    "internlm3": Layout(),
    "iquestcoder": Layout(),
    "ministral": Layout(),
    "ministral3": Layout(),
    "olmo": Layout(),
    "olmo3": Layout(),
    "seed_oss": Layout(),
    "smollm3": Layout(),
    "stablelm": Layout(),
    "vaultgemma": Layout(tail=_SOFTCAP),
    # BitNet normalises the MLP's hidden units (ffn_sub_norm) before down_proj: see Mlp.prune_inputs.
    "bitnet": Layout(mlp=Mlp(prune_inputs=False)),
    "diffllama": Layout(
        limits=Limits(
            head_refusal=(
                "differential attention pairs its heads (o_proj's input is num_attention_heads / 2 differential "
                "heads of 2 × head_dim); edit its MLP neurons instead"
            )
        )
    ),
    "glm": Layout(mlp=_FUSED_GATE_UP),
    "glm4": Layout(mlp=_FUSED_GATE_UP),
    # Ungated MLPs: up → act → down
    "apertus": Layout(mlp=Mlp(gate_proj=None, prune_inputs=False)),  # xIELU(0) ≠ 0
    # the text model of Apertus 1.5, also stored inside its multimodal release (transformers' conversion
    # mapping drops the "language_model." part on load)
    "apertus1p5_text": Layout(
        Names(_DECODER + ("model.language_model.layers.{layer}.",)), mlp=Mlp(gate_proj=None, prune_inputs=False)
    ),
    "arcee": Layout(mlp=_UNGATED),
    "jais2": Layout(mlp=_UNGATED),
    "nanochat": Layout(mlp=Mlp(down_proj="mlp.fc2", gate_proj=None, up_proj="mlp.fc1"), tail=_SOFTCAP),
    "nemotron": Layout(mlp=_UNGATED),
    "starcoder2": Layout(mlp=Mlp(down_proj="mlp.c_proj", gate_proj=None, up_proj="mlp.c_fc")),
    "phi": Layout(
        attention=Attention(o_proj="self_attn.dense"),
        mlp=Mlp(down_proj="mlp.fc2", gate_proj=None, up_proj="mlp.fc1"),
        tail=Tail(final_norm="final_layernorm"),
    ),
    "persimmon": Layout(
        attention=Attention(
            o_proj="self_attn.dense", q_proj=None, k_proj=None, v_proj=None, qkv_proj="self_attn.query_key_value"
        ),
        mlp=_NEOX_MLP,
        tail=Tail(final_norm="final_layernorm"),
        config=Config(ConfigKeys(**_MHA)),
    ),
    "gpt_neox": Layout(
        Names(("gpt_neox.layers.{layer}.",), embeddings="embed_in"),
        _NEOX_QKV,
        _NEOX_MLP,
        tail=Tail(final_norm="final_layer_norm"),
        config=Config(ConfigKeys(**_MHA)),
    ),
    "gpt_neox_japanese": Layout(
        Names(("gpt_neox_japanese.layers.{layer}.",), embeddings="embed_in"),
        _NEOX_QKV,
        _NEOX_MLP,
        tail=Tail(final_norm="final_layer_norm"),
        config=Config(ConfigKeys(intermediate_size=None, **_MHA, mlp_ratio="intermediate_multiple_size")),
    ),
    "opt": Layout(
        Names(("model.decoder.layers.{layer}.", "decoder.layers.{layer}.")),
        Attention(o_proj="self_attn.out_proj"),
        _FC_MLP,
        tail=Tail(final_norm="final_layer_norm"),
        config=Config(ConfigKeys(intermediate_size="ffn_dim", **_MHA)),
    ),
    "biogpt": Layout(
        Names(("biogpt.layers.{layer}.",)),
        Attention(o_proj="self_attn.out_proj"),
        _FC_MLP,
        tail=Tail(final_norm="layer_norm"),
        config=Config(ConfigKeys(**_MHA)),
    ),
    "xglm": Layout(
        attention=Attention(o_proj="self_attn.out_proj"),
        mlp=_FC_MLP,
        tail=Tail(final_norm="layer_norm"),
        config=Config(ConfigKeys("num_layers", "attention_heads", "d_model", "ffn_dim", **_MHA)),
    ),
    "gptj": Layout(
        Names(("transformer.h.{layer}.",), embeddings="wte"),
        Attention(o_proj="attn.out_proj", q_proj="attn.q_proj", k_proj="attn.k_proj", v_proj="attn.v_proj"),
        Mlp(down_proj="mlp.fc_out", gate_proj=None, up_proj="mlp.fc_in"),
        tail=_LN_F,
        config=Config(_GPT2_KEYS),
    ),
    "codegen": Layout(
        Names(("transformer.h.{layer}.",), embeddings="wte"),
        Attention(o_proj="attn.out_proj", q_proj=None, k_proj=None, v_proj=None, qkv_proj="attn.qkv_proj"),
        Mlp(down_proj="mlp.fc_out", gate_proj=None, up_proj="mlp.fc_in"),
        tail=_LN_F,
        config=Config(_GPT2_KEYS),
    ),
    "gpt_neo": Layout(
        Names(("transformer.h.{layer}.",), embeddings="wte"),
        Attention(
            o_proj="attn.attention.out_proj",
            q_proj="attn.attention.q_proj",
            k_proj="attn.attention.k_proj",
            v_proj="attn.attention.v_proj",
        ),
        Mlp(down_proj="mlp.c_proj", gate_proj=None, up_proj="mlp.c_fc"),
        tail=_LN_F,
        config=Config(ConfigKeys("num_layers", "num_heads", **_MHA, mlp_ratio=4)),
    ),
    "bloom": Layout(
        Names(_GPT_H, embeddings="word_embeddings"),
        _DENSE_QKV,
        _NEOX_MLP,
        tail=_LN_F,
        config=Config(ConfigKeys("n_layer", "n_head", intermediate_size=None, **_MHA, mlp_ratio=4)),
    ),
    "falcon": Layout(
        Names(("transformer.h.{layer}.",), embeddings="word_embeddings"),
        _DENSE_QKV,
        _NEOX_MLP,
        tail=_LN_F,
        config=Config(
            ConfigKeys(
                intermediate_size="ffn_hidden_size",
                **_MHA,
                mlp_ratio=4,
                kv_heads_when=(("new_decoder_architecture", "num_kv_heads"), ("multi_query", 1)),
            )
        ),
    ),
    "mpt": Layout(
        Names(("transformer.blocks.{layer}.",), embeddings="wte"),
        Attention(o_proj="attn.out_proj", q_proj=None, k_proj=None, v_proj=None, qkv_proj="attn.Wqkv"),
        Mlp(down_proj="ffn.down_proj", gate_proj=None, up_proj="ffn.up_proj"),
        tail=Tail(final_norm="norm_f"),
        config=Config(ConfigKeys("n_layers", "n_heads", "d_model", None, **_MHA, mlp_ratio="expansion_ratio")),
    ),
    "ctrl": Layout(
        Names(("transformer.h.{layer}.",), embeddings="w"),
        Attention(
            o_proj="multi_head_attention.dense",
            q_proj="multi_head_attention.Wq",
            k_proj="multi_head_attention.Wk",
            v_proj="multi_head_attention.Wv",
        ),
        Mlp(down_proj="ffn.2", gate_proj=None, up_proj="ffn.0"),
        tail=Tail(final_norm="layernorm"),
        config=Config(ConfigKeys("n_layer", "n_head", "n_embd", "dff", **_MHA)),
    ),
    "modernbert-decoder": Layout(
        Names(embeddings="embeddings.tok_embeddings"),
        Attention(o_proj="attn.Wo", q_proj="attn.q_proj", k_proj="attn.k_proj", v_proj="attn.v_proj"),
        Mlp(down_proj="mlp.Wo", gate_proj=None, up_proj=None, gate_up_proj="mlp.Wi"),
        tail=Tail(final_norm="final_norm", pre_head="lm_head"),
        config=Config(ConfigKeys(**_MHA)),
    ),
    "cpmant": Layout(
        # cpmant.input_embedding is not next to the layer list
        Names(("cpmant.encoder.layers.{layer}.",), embeddings=None),
        Attention(
            o_proj="self_att.self_attention.attention_out",
            q_proj="self_att.self_attention.project_q",
            k_proj="self_att.self_attention.project_k",
            v_proj="self_att.self_attention.project_v",
        ),
        Mlp(down_proj="ffn.ffn.w_out", gate_proj="ffn.ffn.w_in.w_0", up_proj="ffn.ffn.w_in.w_1"),
        tail=Tail(final_norm="output_layernorm"),
        config=Config(ConfigKeys(intermediate_size="dim_ff", num_key_value_heads=None, head_dim="dim_head")),
    ),
    # GPT-2's Conv1D: weights stored [in, out]
    "gpt2": Layout(
        Names(_GPT_H, embeddings="wte", conv1d=_GPT2_CONV1D),
        _GPT2_ATTENTION,
        _GPT2_MLP,
        tail=_LN_F,
        config=Config(_GPT2_KEYS),
    ),
    "openai-gpt": Layout(
        Names(_GPT_H, embeddings="tokens_embed", conv1d=_GPT2_CONV1D),
        _GPT2_ATTENTION,
        _GPT2_MLP,
        tail=Tail(final_norm=None),
        config=Config(ConfigKeys("n_layer", "n_head", "n_embd", None, **_MHA, mlp_ratio=4)),
    ),
    # GPT-BigCode: GPT-2's names on nn.Linear, one k/v head under multi_query
    "gpt_bigcode": Layout(
        Names(("transformer.h.{layer}.",), embeddings="wte"),
        _GPT2_ATTENTION,
        _GPT2_MLP,
        tail=_LN_F,
        config=Config(
            ConfigKeys(
                "n_layer", "n_head", "n_embd", "n_inner", **_MHA, mlp_ratio=4, kv_heads_when=(("multi_query", 1),)
            )
        ),
    ),
    # Cohere's parallel attention and MLP block, as the text model of Cohere's Compass (North) vision models
    "cohere_compass_text": Layout(tail=_LOGIT_SCALE),
}
# GPT-SW3 releases are GPT-2 models (transformers maps the type to GPT2Config and GPT2LMHeadModel).
DENSE["gpt-sw3"] = DENSE["gpt2"]
