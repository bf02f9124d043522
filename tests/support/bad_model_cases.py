"""Bad input of tests/bake/test_bad_input.py, part one: the model given (its path, its safetensors
headers, what it is), the indices and scales asked for, mixture-of-experts neurons, and the scale guards."""

from __future__ import annotations

from tests.support import cases as setups
from tests.support import corrupt as bad
from tests.support.cases import Case

O_PROJ0 = "model.layers.0.self_attn.o_proj.weight"

MODEL_CASES = [
    # --- the MODEL argument ---
    Case("missing-path", lambda c: c.heads(c.tmp / "nope"), ("does not exist", "give a checkpoint folder")),
    Case("path-is-a-file", lambda c: c.heads(c.src / "config.json"), ("is a file", "give the checkpoint folder")),
    Case("no-config", setups.no_config, ("no config.json", "give the folder")),
    Case(
        "config-not-json",
        lambda c: ((c.src / "config.json").write_text("{model_type: llama"), c.heads())[1],
        ("config.json is not valid JSON", "re-download"),
    ),
    Case("no-weights", setups.no_weights, ("has no weights", "give the folder")),
    Case("pickle-bin", setups.pickle("pytorch_model.bin"), ("pickle weights", "convert to safetensors")),
    Case("pickle-pt", setups.pickle("model.pt"), ("pickle weights", "convert to safetensors")),
    # --- safetensors headers ---
    Case("truncated-half", setups.weights(bad.truncate), ("runs past the end", "re-download")),
    Case("truncated-to-5-bytes", setups.weights(bad.truncate_to, 5), ("truncated", "re-download")),
    Case("offsets-overlap", setups.weights(bad.overlap_offsets), ("overlap", "re-download")),
    Case("offsets-past-end", setups.weights(bad.offsets_past_end), ("runs past the end", "re-download")),
    Case("size-disagrees-with-shape", setups.weights(bad.size_disagrees), ("needs", "re-download")),
    Case("absurd-header-length", setups.weights(bad.absurd_header_length), ("-byte header", "re-download")),
    Case("header-not-json", setups.weights(bad.header_not_json), ("not valid JSON", "re-download")),
    Case(
        "header-repeats-an-entry",
        setups.weights(bad.repeat_entry),
        ("has a header that gives", "twice", "corrupt or crafted", "re-download"),
    ),
    Case(
        "config-repeats-a-key",
        setups.repeated_config_key,
        ("key 'num_hidden_layers' appears twice in one mapping (lines 2 and", "keep one"),
    ),
    Case(
        "index-repeats-a-tensor",
        setups.repeated_index_entry,
        ("appears twice", "unclear which shard", "re-download"),
        source="sharded",
    ),
    Case("index-names-missing-shard", setups.missing_shard, ("missing", "re-download"), source="sharded"),
    Case("index-malformed", setups.bad_index, ("malformed", "re-download"), source="sharded"),
    Case("weights-is-a-folder", setups.weights_folder, ("not a readable file", "re-download")),
    Case("weights-dangling-symlink", setups.dangling_weights, ("not a readable file", "re-download")),
    Case("index-leaves-the-folder", setups.index_to("../elsewhere/model.safetensors"), ("outside", "re-download")),
    Case(
        "shard-in-skipped-folder", setups.index_to(".cache/model.safetensors"), ("not carried over", "move the shards")
    ),
    Case("needed-tensor-absent", setups.weights(bad.drop_tensor, O_PROJ0), (f"'{O_PROJ0}' is not in", "re-download")),
    Case(
        "weights-stored-as-int8",
        setups.weights(bad.retype, O_PROJ0, "I8"),
        ("stored as I8", "F32, F16 and BF16 weights only"),
    ),
    Case(
        "config-shape-mismatch",
        setups.config(num_attention_heads=8),
        ("expected", "the config does not describe these weights"),
    ),
    # heads × head_dim still fit o_proj, but not k/v: found in the header, not inside transformers' loader
    Case(
        "config-kv-heads-mismatch",
        setups.config(num_key_value_heads=1),
        (
            "'model.layers.0.self_attn.k_proj.weight' has shape [16, 32], expected [8, 32]",
            "num_key_value_heads × head_dim = 1 × 8",
            "correct those fields in",
        ),
    ),
    Case(
        "config-kv-heads-mismatch-prune",
        lambda c: (
            bad.edit_config(c.src, num_key_value_heads=1),
            ["prune-neurons", c.src, "--neurons", "0:1", "--out", c.out],
        )[1],
        ("k_proj.weight' has shape [16, 32]", "num_key_value_heads", "correct those fields in"),
    ),
    Case(
        "config-fused-qkv-mismatch",
        setups.config(num_key_value_heads=4),
        (
            "'model.layers.0.self_attn.qkv_proj.weight' has shape [64, 32], expected [96, 32]",
            "(num_attention_heads + 2 × num_key_value_heads) × head_dim = (4 + 2 × 4) × 8",
            "correct those fields in",
        ),
        source="phi3",
    ),
    # --- what the model is ---
    Case(
        "unsupported-model-type",
        setups.config(model_type="made_up_family"),
        ("'made_up_family' is not supported", "extend"),
    ),
    Case("quantized-gptq", setups.quant("gptq"), ("quantized", "unquantized")),
    Case("quantized-awq", setups.quant("awq"), ("quantized", "unquantized")),
    Case("quantized-bitsandbytes", setups.quant("bitsandbytes"), ("quantized", "unquantized")),
    Case("quantized-fp8", setups.quant("fp8"), ("quantized", "unquantized")),
    Case("quantized-compressed-tensors", setups.quant("compressed-tensors"), ("quantized", "unquantized")),
    Case(
        "quantized-compression-config",
        setups.quant("compressed-tensors", "compression_config"),
        ("quantized", "unquantized"),
    ),
    Case(
        "remote-code-auto-map",
        setups.config(auto_map={"AutoModelForCausalLM": "modeling_x.X"}),
        ("custom code", "--trust-remote-code"),
    ),
    # --- indices and scales ---
    Case("layer-out-of-range", lambda c: c.heads(None, "3.0"), ("num_hidden_layers = 3", "valid: 0..2")),
    Case("head-out-of-range", lambda c: c.heads(None, "0.4"), ("num_attention_heads = 4", "valid: 0..3")),
    Case("negative-head", lambda c: c.heads(None, "0.-1"), ("head must be ≥ 0", "got -1")),
    Case(
        "neuron-out-of-range",
        lambda c: ["prune-neurons", c.src, "--neurons", "0:48", "--out", c.out],
        ("intermediate_size = 48", "valid: 0..47"),
    ),
    # --- mixture-of-experts neurons (4 experts of width 16, a shared expert of width 24) ---
    Case(
        "expert-out-of-range",
        lambda c: ["prune-neurons", c.src, "--neurons", "0:e4:1", "--out", c.out],
        ("4 experts per layer", "valid: 0..3"),
        source="qwen2_moe",
    ),
    Case(
        "neuron-not-in-expert",
        lambda c: ["prune-neurons", c.src, "--neurons", "0:e1:16", "--out", c.out],
        ("moe_intermediate_size = 16", "valid: 0..15"),
        source="qwen2_moe",
    ),
    Case(
        "neuron-not-in-shared-expert",
        lambda c: ["prune-neurons", c.src, "--neurons", "0:s:24", "--out", c.out],
        ("shared_expert_intermediate_size = 24", "valid: 0..23"),
        source="qwen2_moe",
    ),
    Case(
        "expert-not-named",
        lambda c: ["prune-neurons", c.src, "--neurons", "1:5", "--out", c.out],
        ("layer 1 is a mixture of experts", "1:eE:5"),
        source="qwen2_moe",
    ),
    Case(
        "no-shared-expert",
        lambda c: ["prune-neurons", c.src, "--neurons", "1:s:5", "--out", c.out],
        ("gpt_oss has no shared expert", "expert = shared"),
        source="gpt_oss",
    ),
    Case(
        "expert-spec-malformed",
        lambda c: ["prune-neurons", c.src, "--neurons", "0:x5:1", "--out", c.out],
        ("not LAYER:NEURON", "3:e5:17"),
        source="qwen2_moe",
    ),
    Case("quantized-mxfp4", setups.quant("mxfp4"), ("quantized", "unquantized"), source="gpt_oss"),
    Case("heads-spec-malformed", lambda c: c.heads(None, "7"), ("not LAYER.HEAD", "e.g. 7.7")),
    Case("heads-empty", lambda c: c.heads(None, ""), ("--heads is empty", "give LAYER.HEAD pairs")),  # not a search
    Case("heads-only-commas", lambda c: c.heads(None, ","), ("--heads is empty", "give LAYER.HEAD pairs")),
    Case("alpha-nan", lambda c: c.heads(None, "0.1", "nan"), ("--alpha must be a finite number", "got nan")),
    Case("alpha-inf", lambda c: c.heads(None, "0.1", "inf"), ("--alpha must be a finite number", "got inf")),
    Case("alpha-beyond-float32", lambda c: c.heads(None, "0.1", "1e39"), ("not a finite float32", "smaller value")),
    Case(
        "recipe-factor-beyond-float32",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: neuron, layer: 0, neuron: 1, factor: -1.0e+300}\n"),
        ("not a finite float32", "smaller value"),
    ),
    Case(
        "alpha-overflows-f16",
        lambda c: c.heads(None, "0.1", "1e7"),
        ("overflows F16", "choose a smaller scale"),
        source="f16",
    ),
    Case("alpha-zero", lambda c: c.heads(None, "0.1", "0"), ("silences the heads", "--allow-zero")),
    # an α that is not 0 but still zeroes the head in the stored dtype (1e-50 is 0 as a float32)
    Case(
        "alpha-underflows-f32",
        lambda c: c.heads(None, "0.1", "1e-50"),
        ("alpha 1e-50 rounds every weight of head 0.1 to zero in this F32 checkpoint", "--allow-zero"),
    ),
    Case(
        "alpha-underflows-bf16",
        lambda c: c.heads(None, "0.1", "1e-50"),
        ("alpha 1e-50 rounds every weight of head 0.1 to zero in this BF16 checkpoint", "--allow-zero"),
        source="bf16",
    ),
    Case(
        "alpha-underflows-bf16-in-a-sweep",
        lambda c: c.heads(None, "0.1", "0.5,1e-40"),
        ("alpha 1e-40 rounds every weight of head 0.1 to zero in this BF16 checkpoint", "--allow-zero"),
        source="bf16",
    ),
    Case(
        "alpha-underflows-f16",
        lambda c: c.heads(None, "0.1", "1e-10"),
        ("rounds every weight of head 0.1 to zero in this F16 checkpoint", "--allow-zero"),
        source="f16",
    ),
    Case(
        "factor-nan",
        lambda c: ["prune-neurons", c.src, "--neurons", "0:1", "--factor", "nan", "--out", c.out],
        ("--factor must be a finite number", "got nan"),
    ),
    Case(
        "factor-inf",
        lambda c: ["prune-neurons", c.src, "--neurons", "0:1", "--factor", "-inf", "--out", c.out],
        ("--factor must be a finite number", "got -inf"),
    ),
    # Every path that scales a head or a neuron has both guards (surgery.bake.guards): a finite
    # scale whose weights pass 2^64 (their squares overflow float32 in the next norm) …
    Case(
        "alpha-huge-f32",
        lambda c: c.heads(None, "0.1", "1e30"),
        ("alpha 1e+30 scales the weights of head 0.1 up to", "past 2^64", "choose a smaller scale"),
    ),
    Case("alpha-huge-in-a-sweep", lambda c: c.heads(None, "0.1", "2,1e30"), ("alpha 1e+30", "past 2^64")),
    Case(
        "recipe-alpha-huge",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: 1.0e+30}\n"),
        ("alpha 1e+30 scales the weights of head 0.1 up to", "choose a smaller scale"),
    ),
    Case(
        "factor-huge",
        lambda c: ["prune-neurons", c.src, "--neurons", "0:1", "--factor", "-1e30", "--out", c.out],
        ("factor -1e+30 scales the weights of neuron 0:1 up to", "choose a smaller scale"),
    ),
    Case(
        "factor-overflows-f16",
        lambda c: ["prune-neurons", c.src, "--neurons", "0:1", "--factor", "1e7", "--out", c.out],
        ("factor 1e+07 overflows F16 for neuron 0:1", "choose a smaller scale"),
        source="f16",
    ),
    # … and a non-zero scale that rounds every weight to zero, unless --allow-zero
    Case(
        "recipe-alpha-underflows",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: 1.0e-50}\n"),
        ("alpha 1e-50 rounds every weight of head 0.1 to zero in this F32 checkpoint", "--allow-zero"),
    ),
    Case(
        "factor-underflows-bf16",
        lambda c: ["prune-neurons", c.src, "--neurons", "0:1", "--factor", "1e-40", "--out", c.out],
        ("factor 1e-40 rounds every weight of neuron 0:1 to zero in this BF16 checkpoint", "--allow-zero"),
        source="bf16",
    ),
    Case(
        "factor-underflows-expert",
        lambda c: ["prune-neurons", c.src, "--neurons", "0:e1:3", "--factor", "1e-50", "--out", c.out],
        ("factor 1e-50 rounds every weight of neuron 0:e1:3 to zero", "--allow-zero"),
        source="qwen2_moe",
    ),
]
