"""Why surgery does not edit a family, or a part of a hybrid model's layer: one line each."""

from __future__ import annotations

# What a hybrid model's layer of a kind holds that surgery does not edit, and why, by (side, kind):
# "heads" for a layer outside the row's attention kinds, "mlp" for one without a dense MLP or the
# row's experts. A kind not listed holds no such part (e.g. Nemotron-H's attention-only layers).
_UNDESCRIBED_EXPERTS = "experts (this table row does not describe its mixture of experts)"
KIND_REFUSALS: dict[tuple[str, str], str] = {
    ("heads", "linear_attention"): "heads of linear attention or a state-space scan (only softmax-attention heads "
    "are edited)",
    ("heads", "conv"): "a short convolution in place of attention (no heads)",
    **{("mlp", kind): _UNDESCRIBED_EXPERTS for kind in ("sparse", "moe", "hash_moe")},
}


# --- refused families ---
# The causal-LM model types of transformers that surgery refuses, each with the reason that
# architecture() gives in its one line. Every causal-LM type of the installed transformers is a row
# of ARCHITECTURES or a key here (tests/core/test_coverage.py fails naming any other).
_ENCODER = (
    "a BERT-style bidirectional encoder with a language-model head (transformers runs it causally "
    "with is_decoder=True), not a decoder-only LM"
)
_SEQ2SEQ = "the decoder of an encoder-decoder model (its layers cross-attend to the encoder's output)"
_MAMBA = "Mamba layers only: no attention heads, and no MLP (the mixer gates a selective state-space scan)"
_DRAFTER = (
    "a speculative-decoding drafter: it runs only on its target model's embeddings and key/value "
    "states (inputs_embeds, shared_kv_states), not on token ids"
)
_DOTS3 = (
    "its layers mix MLA (indexed attention) and plain attention with different head sizes, and the number "
    "of routed experts differs per layer (pyramid_num_routed; the table has one per model)"
)
REFUSED: dict[str, str] = {
    "mllama": (
        "its decoder interleaves cross-attention layers (cross_attention_layers, attending to the image) "
        "with its self-attention layers, and the table has no layer kind for them yet"
    ),
    "moshi": (
        "a speech model: its causal LM is one stream of a model with audio codebooks and a depth decoder "
        "whose projections are per-codebook; not described by the table yet"
    ),
    "emu3": (
        "its releases are the image-and-text generation model (text layers under model.text_model, a VQ-VAE "
        "image tokenizer beside them): not described by the table yet"
    ),
    # its text decoder is the gemma3n_text row; the wrapper waits for its proof (tests/core/test_coverage.py)
    "gemma3n": (
        "not proven yet: its vision tower is a timm model (MobileNetV5) that surgery's coverage sweep cannot "
        "build without timm; its text decoder, gemma3n_text, is supported"
    ),
    "ergo": (
        "its experts have no gate projection and normalize each expert's output with that expert's own norm "
        "(post_expert_norm), and a learned gate mixes each sub-layer into the residual: not described by the table yet"
    ),
    "kolibri1_1": (
        "its indexed-attention layers let each query select its keys (index_topk) and some of them read an earlier "
        "layer's keys and values (kv_source_layers, no k/v projections of their own): not described by the table yet"
    ),
    "dory": "its releases store each decoder layer as two blocks (layers.2i attention, layers.2i+1 MLP) that "
    "transformers collapses on load: the stored layers are not the model's",
    **dict.fromkeys(
        (
            "bert",
            "bert-generation",
            "big_bird",
            "camembert",
            "data2vec-text",
            "electra",
            "ernie",
            "megatron-bert",
            "rembert",
            "roberta",
            "roberta-prelayernorm",
            "roc_bert",
            "roformer",
            "xlm-roberta",
            "xlm-roberta-xl",
            "xmod",
        ),
        _ENCODER,
    ),
    **dict.fromkeys(
        (
            "bart",
            "bigbird_pegasus",
            "blenderbot",
            "blenderbot-small",
            "marian",
            "mbart",
            "mvp",
            "pegasus",
            "plbart",
            "prophetnet",
            "trocr",
            "whisper",
        ),
        _SEQ2SEQ,
    ),
    **dict.fromkeys(("mamba", "mamba2", "falcon_mamba"), _MAMBA),
    **dict.fromkeys(("gemma4_assistant", "gemma4_unified_assistant"), _DRAFTER),
    "musicgen": "an audio-code decoder (MusicGen): it predicts several codebooks at once, cross-attending to a "
    "text encoder, not a text causal LM",
    "musicgen_melody": "an audio-code decoder (MusicGen Melody): it predicts several codebooks at once from "
    "prepended audio and text conditioning, not a text causal LM",
    "rwkv": "RWKV layers: time mixing in place of attention (no heads) and a receptance-gated channel mix",
    "xlstm": "xLSTM layers: mLSTM recurrent cells in place of attention (no heads); neuron-only editing of its "
    "feed-forward blocks is not implemented",
    "xlm": "XLM: a masked-LM encoder (causal only as a pretraining option) whose attention and feed-forward blocks "
    "are separate module lists, not decoder layers",
    "xlnet": "XLNet: a permutation language model with two-stream relative attention, not a causal decoder",
    "reformer": "Reformer: reversible layers (two residual streams) with LSH and chunked local attention",
    "git": "GIT: its text layers are a BERT-style encoder over image and text tokens (git.encoder.layer), not a "
    "decoder-only LM",
    "blt": "Byte Latent Transformer: three stacks of layers (local encoder, global transformer, local decoder) "
    "joined by cross-attention, so a layer index names no single layer",
    "hrm_text": "Hierarchical Reasoning Model: two stacks of layers (H_module, L_module) run in nested cycles, so "
    "a layer index names no single layer",
    # hybrid layers sharing one block, and mixed attention shapes (the MLA, DeepSeek-V4 and hybrid rows' section)
    "zamba": "its attention and MLP are one shared block reused by every hybrid layer: an edit of one layer "
    "would edit them all",
    "zamba2": "its attention and MLP blocks are shared across hybrid layers (with per-layer adapters): an edit "
    "of one layer would edit every layer sharing the block",
    **dict.fromkeys(("dots3_note", "dots3_note_text"), _DOTS3),
    # mixtures of experts
    "dbrx": (
        "its experts are DBRX's own GLU (w1/v1/w2 stacked [E·I, H]) run by a custom forward, and its "
        "attention is one fused Wqkv under transformer.blocks: neither is in the table yet"
    ),
    "jetmoe": (
        "its attention is itself a mixture of experts (MoA: each token's heads come from routed expert "
        "projections), so no fixed columns carry a head; its MLP experts run a custom dispatch"
    ),
    "inkling_text": (
        "short convolutions wrap its attention inputs and its experts (attn_sconv, k/v_sconv, "
        "mlp_sconv): not described by the table yet"
    ),
    "inkling2_text": (
        "its attention projections are wrapped in short convolutions and its layers read "
        "learned residual queries (attention_input, mlp_input): not described by the table yet"
    ),
    "inkling2_loop_text": (
        "a looped Inkling-2 (layers re-run with message gates between passes): one weight "
        "serves several passes, so an edit's site is not one layer"
    ),
}
