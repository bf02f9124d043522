"""Bad input through the real CLI: every case fails with one clear line and leaves nothing behind.

Each case breaks one thing in a fresh copy of a tiny checkpoint (or in the command line, recipe or
destination) and asserts: non-zero exit, exactly one ``Error: …`` line naming the problem and the
fix, no traceback, no output folder and no hidden staging folder left, and the source's sha256s
unchanged.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from surgery.core.checkpoint import read_safetensors_header
from surgery.core.errors import CheckpointError
from tests.support import cases as setups
from tests.support import corrupt as bad
from tests.support.cases import Case, Ctx
from tests.support.cli import REPO, cli_env, error_line, hidden_entries, run_cli, run_main, tree_hashes
from tests.support.tiny import build_tiny

O_PROJ0 = "model.layers.0.self_attn.o_proj.weight"


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, Path]:
    """Tiny llamas (single file, sharded, F16, BF16), built once and copied per case."""
    root = tmp_path_factory.mktemp("bases")
    return {
        "single": build_tiny("llama", root / "single"),
        "sharded": build_tiny("llama", root / "sharded", shard="20KB"),
        "f16": build_tiny("llama", root / "f16", dtype=torch.float16),
        "bf16": build_tiny("llama", root / "bf16", dtype=torch.bfloat16),
        "phi3": build_tiny("phi3", root / "phi3"),
        "qwen2_moe": build_tiny("qwen2_moe", root / "qwen2_moe"),
        "gpt_oss": build_tiny("gpt_oss", root / "gpt_oss"),
    }


RECIPE_OK_EDIT = "  - {type: head, layer: 0, head: 1, alpha: 2.0}\n"


def _file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


CASES = [
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
    # --- recipe files ---
    Case(
        "recipe-missing",
        lambda c: ["apply", c.tmp / "none.yaml", "--model", c.src, "--out", c.out],
        ("does not exist", "give the path of a recipe"),
    ),
    # a folder (e.g. a baked one) is not missing: the error says what it is
    Case(
        "recipe-a-folder",
        lambda c: ["apply", c.src, "--model", c.src, "--out", c.out],
        ("is a folder", "give the path of a recipe YAML file", "surgery.json"),
    ),
    Case("recipe-empty", lambda c: c.recipe(""), ("is empty", "needs 'version' and 'edits'")),
    Case("recipe-not-yaml", lambda c: c.recipe("version: [1\nedits: {"), ("not valid YAML", "fix the syntax")),
    # two recipes pasted into one file: YAML keeps the second's keys, so the first one's edits were lost
    Case(
        "recipe-two-in-one-file",
        lambda c: c.recipe(
            "version: 1\nedits:\n" + RECIPE_OK_EDIT + "version: 1\nedits:\n"
            "  - {type: head, layer: 0, head: 2, alpha: 3.0}\n"
        ),
        ("key 'version' appears twice in one mapping (lines 1 and 4)", "keep one"),
    ),
    Case(
        "recipe-repeats-alpha",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: 2, alpha: 3}\n"),
        ("key 'alpha' appears twice on line 3", "keep one"),
    ),
    Case("recipe-a-list", lambda c: c.recipe("- 1\n- 2\n"), ("must be a YAML mapping", "'version' and 'edits'")),
    Case(
        "recipe-wrong-version",
        lambda c: c.recipe("version: 9\nedits:\n" + RECIPE_OK_EDIT),
        ("version must be 1", "got 9"),
    ),
    Case(
        "recipe-without-version",
        lambda c: c.recipe("edits:\n" + RECIPE_OK_EDIT),
        ("recipe.yaml has no version", "add 'version: 1'"),
    ),
    Case(
        "recipe-unknown-key",
        lambda c: c.recipe("version: 1\nalpha: 2\nedits:\n" + RECIPE_OK_EDIT),
        ("unknown key(s) alpha", "allowed:"),
    ),
    Case(
        "recipe-no-edits",
        lambda c: c.recipe("version: 1\nedits: []\n"),
        ("edits must be a non-empty list", "(direction, head, neuron, steer)"),
    ),
    Case(
        "recipe-alpha-string",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: big}\n"),
        ("alpha must be a number", "'big'"),
    ),
    Case(
        "recipe-alpha-nan",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: .nan}\n"),
        ("alpha must be a finite number", "nan"),
    ),
    # YAML 1.1 would read these as other numbers (010 → 8, 1:30 → 90): refused, saying why (issue 33)
    Case(
        "recipe-neuron-octal",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: neuron, layer: 0, neuron: 010, factor: 0}\n"),
        ("edits[0].neuron = '010' is not a plain decimal number", "octal in YAML 1.1 (8)", "drop the leading zeros"),
    ),
    Case(
        "recipe-neuron-base-60",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: neuron, layer: 0, neuron: 1:30, factor: 0}\n"),
        ("edits[0].neuron = '1:30'", "base 60 (90)", "write one decimal number"),
    ),
    Case(
        "recipe-layer-hex",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: 0x1, head: 1, alpha: 2}\n"),
        ("edits[0].layer = '0x1'", "write it in decimal (1)"),
    ),
    Case(
        "recipe-head-underscore",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: 0, head: 1_0, alpha: 2}\n"),
        ("edits[0].head = '1_0'", "drops underscores (10)", "leave them out"),
    ),
    Case(
        "recipe-alpha-yes",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: yes}\n"),
        ("edits[0].alpha = 'yes'", "a boolean (True)"),
    ),
    Case(
        "recipe-layer-true",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: true, head: 1, alpha: 2}\n"),
        ("edits[0].layer must be a number, got True (a boolean)",),
    ),
    Case(
        "recipe-alpha-nan-word",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: nan}\n"),
        ("alpha must be a finite number, got 'nan'", "NaN or infinite scale"),
    ),
    Case(
        "recipe-alpha-inf",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: -.inf}\n"),
        ("alpha must be a finite number, got -inf", "NaN or infinite scale"),
    ),
    # 1e30 is a number (YAML 1.1 read it as text, "must be a number, got '1e30'"): the bake says why not
    Case(
        "recipe-alpha-1e30",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: 1e30}\n"),
        ("alpha 1e+30 scales the weights of head 0.1 up to", "choose a smaller scale"),
    ),
    Case(
        "recipe-conflict",
        lambda c: c.recipe(
            "version: 1\nedits:\n" + RECIPE_OK_EDIT + "  - {type: head, layer: 0, head: 1, alpha: 3.0}\n"
        ),
        ("conflicting edits", "keep one"),
    ),
    Case(
        "recipe-head-out-of-range",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: 0, head: 9, alpha: 2}\n"),
        ("num_attention_heads = 4", "valid: 0..3"),
    ),
    # --- direction edits: the vector, the module, the weight ---
    Case("direction-zero-norm", setups.direction(np.zeros(32, np.float32)), ("has norm 0", "give a non-zero vector")),
    Case(
        "direction-wrong-size",
        setups.direction(np.ones(31, np.float32)),
        ("has 31 values but the model has hidden_size = 32", "give a direction of the model's residual stream"),
    ),
    Case(
        "direction-nan",
        setups.direction(np.full(32, np.nan, np.float32)),
        ("holds NaN or inf", "give a finite direction"),
    ),
    Case("direction-not-1d", setups.direction(np.ones((4, 8), np.float32)), ("shape [4, 8]", "a direction is a 1-D")),
    Case(
        "direction-file-missing",
        setups.direction(vector="none.safetensors#r"),
        ("none.safetensors does not exist", "relative to the recipe's folder"),
    ),
    Case("direction-name-missing", setups.direction(vector="v.safetensors#q"), ("has no tensor 'q' (it has: r)",)),
    Case("direction-spec-malformed", setups.direction(vector="v.safetensors"), ("must be FILE.safetensors#NAME",)),
    Case(
        "direction-sha256-pinned",
        setups.direction(entry=f"layer: 0, module: attention, weight: 1.0, sha256: '{'0' * 64}'"),
        ("the recipe pins 000000000000", "restore it or drop 'sha256'"),
    ),
    Case(
        "direction-unknown-module",
        setups.direction(entry="layer: 0, module: residual, weight: 1.0"),
        ("module must be one of attention, mixer, mlp, experts, shared_experts, embeddings", "'residual'"),
    ),
    Case(
        "direction-layer-out-of-range",
        setups.direction(entry="layer: 3, module: mlp, weight: 1.0"),
        ("num_hidden_layers = 3", "valid: 0..2"),
    ),
    Case(
        "direction-mlp-of-moe-layer",
        setups.direction(entry="layer: 0, module: mlp, weight: 1.0"),
        ("layer 0 is a mixture of experts", "use experts, shared_experts"),
        source="qwen2_moe",
    ),
    Case(
        "direction-experts-of-dense-layer",
        setups.direction(entry="layer: 0, module: experts, weight: 1.0"),
        ("layer 0 of llama is a dense MLP (no experts)", "use mlp"),
    ),
    Case(
        "direction-no-shared-expert",
        setups.direction(entry="layer: 0, module: shared_experts, weight: 1.0"),
        ("gpt_oss has no shared expert", "use experts"),
        source="gpt_oss",
    ),
    Case(
        "direction-weight-inf",
        setups.direction(entry="layer: 0, module: attention, weight: .inf"),
        ("weight must be a finite number", "inf"),
    ),
    Case(
        "direction-weight-overflows-bf16",
        setups.direction(entry="layer: 0, module: mlp, weight: 1.0e+38"),
        (
            "direction edit of 'model.layers.0.mlp.down_proj.bias' makes some of its weights 1.7e+35, past 2^64",
            "choose a smaller weight",
        ),
        source="bf16",
    ),
    # --- findings files ---
    Case(
        "findings-missing",
        lambda c: ["amplify-heads", c.src, "--findings", c.tmp / "none.json", "--alpha", "2", "--out", c.out],
        ("does not exist", "surgery find-heads"),
    ),
    Case("findings-empty", setups.findings(""), ("not valid JSON", "recompute it with surgery find-heads")),
    Case(
        "findings-truncated",
        setups.findings('{"format": "surgery-findings", "versi'),
        ("not valid JSON", "recompute it with surgery find-heads"),
    ),
    Case(
        "findings-repeat-a-key",
        setups.findings('{"format": "surgery-findings",\n "format": "surgery-findings"}'),
        ("key 'format' appears twice in one mapping (lines 1 and 2)", "recompute it with surgery find-heads"),
    ),
    Case(
        "findings-not-surgery", setups.findings('{"scores": []}'), ("not a surgery findings file", "surgery find-heads")
    ),
    Case("findings-wrong-version", setups.findings(lambda d: d.update(version=7)), ("findings version 7", "recompute")),
    Case(
        "findings-of-neurons",
        setups.findings(lambda d: d.update(kind="neurons")),
        ("holds 'neurons' findings", "surgery find-heads"),
    ),
    Case(
        "findings-without-model", setups.findings(lambda d: d.pop("model")), ("does not record the model", "recompute")
    ),
    Case("findings-other-model-same-arch", setups.findings(setups.other_model(True)), ("another model", "--transfer")),
    Case(
        "findings-other-architecture",
        setups.findings(setups.other_model(False)),
        ("different model", "architecture differs (model_type qwen2 there, llama here; num_layers 24 there, 3 here)"),
    ),
    # --transfer applies findings to the same architecture only: the refusal says which field differs
    Case(
        "findings-other-geometry-transfer",
        lambda c: setups.findings(setups.other_model(False, model_type="llama"))(c) + ["--transfer"],
        ("even with --transfer", "differs (num_layers 24 there, 3 here)", "compute findings for this model"),
    ),
    Case("findings-top-too-large", setups.top("5"), ("--top 5 but the findings rank only 1", "choose a smaller --top")),
    Case(
        "n-larger-than-the-model",
        setups.neuron_findings("--n", "1000"),
        ("--n 1000 is out of range: the model has", "choose 1.."),
    ),
    Case(
        "n-larger-than-one-layer",
        setups.neuron_findings("--n", "49", "--layers", "1"),
        ("--n 49 is out of range: these layers hold", "choose 1.."),
    ),
    Case("n-zero", setups.neuron_findings("--n", "0"), ("--n must be whole numbers ≥ 1", "got 0")),
    Case(
        "neuron-findings-bad-scores",
        setups.neuron_findings("--n", "5", change=lambda d: d["scores"].update(width=64)),
        ("do not match their layers × width", "recompute them with surgery find-neurons"),
    ),
    Case(
        "neuron-findings-are-heads",
        setups.neuron_findings("--n", "5", change=lambda d: d.update(kind="heads")),
        ("holds 'heads' findings", "surgery find-neurons"),
    ),
    # --- destinations ---
    Case("dest-is-source", lambda c: c.heads(None, "0.1", "2.0", c.src), ("is the source", "choose a folder outside")),
    Case("dest-inside-source", lambda c: c.heads(None, "0.1", "2.0", c.src / "out"), ("inside the source", "choose")),
    Case("dest-symlink-to-source", setups.dest_symlink, ("is the source", "choose a folder outside"), dest_exists=True),
    Case(
        "dest-contains-source",
        lambda c: c.heads(None, "0.1", "2.0", c.src.parent, "--force"),
        ("contains the source", "choose another folder"),
    ),
    Case("dest-exists", setups.dest_exists, ("already exists", "--force"), dest_exists=True),
    Case("dest-is-a-file", setups.dest_is_file, ("is not a folder", "remove it or choose another"), dest_exists=True),
    Case(
        "dest-parent-missing",
        lambda c: c.heads(None, "0.1", "2.0", c.tmp / "no" / "such" / "out"),
        ("does not exist", "create"),
    ),
    # --- verify / undo on something that is not a bake ---
    Case("verify-not-baked", setups.not_baked, ("no surgery.json", "give the folder that a surgery bake wrote")),
    Case(
        "verify-swapped",
        setups.swapped_verify,
        ("was made by surgery", "the source comes first: surgery verify SOURCE BAKED"),
    ),
    Case("undo-not-baked", setups.undo_not_baked, ("no surgery.json", "give the folder that a surgery bake wrote")),
    Case(  # a typo'd path: not "has no surgery.json", which sends the user looking into a folder that is not there
        "undo-missing",
        lambda c: ["undo", c.tmp / "nope", "--out", c.out],
        ("nope does not exist", "a surgery bake wrote"),
    ),
    # … on surgery's own other outputs: named as what they are, not "not made by surgery"
    Case(
        "verify-a-sweep",
        setups.sweep_folder(lambda c, f: ["verify", c.src, f, "--structural-only"]),
        ("is a sweep made by surgery, one baked folder per value (alpha-2, alpha-3)", "give one of them"),
    ),
    Case(
        "card-a-sweep",
        setups.sweep_folder(lambda c, f: ["card", f]),
        ("is a sweep made by surgery", "give one of them"),
    ),
    Case(  # was "undo did not reproduce the source (notes.txt differs)"
        "undo-a-file-added",
        setups.undo_changed_bake(lambda f: (f / "notes.txt").write_text("mine")),
        ("notes.txt was added after the bake (not in surgery.json)", "move it out of"),
    ),
    Case(  # was a bare "No such file or directory"
        "undo-a-file-removed",
        setups.undo_changed_bake(lambda f: (f / "config.json").unlink()),
        ("config.json is recorded in surgery.json but missing", "put it back"),
    ),
    Case(
        "undo-a-sweep",
        setups.sweep_folder(lambda c, f: ["undo", f, "--out", c.out]),
        ("is a sweep made by surgery", "give one of them"),
    ),
    Case(
        "verify-an-adapter",
        setups.adapter_folder(lambda c, f: ["verify", c.src, f, "--structural-only"]),
        ("is a LoRA adapter written by surgery export-lora", "give a folder that a bake wrote"),
    ),
    Case(
        "card-an-adapter",
        setups.adapter_folder(lambda c, f: ["card", f]),
        ("is a LoRA adapter written by surgery export-lora", "give a folder that a bake wrote"),
    ),
    Case(
        "export-lora-from-an-adapter",
        setups.adapter_folder(lambda c, f: ["export-lora", c.src, "--recipe", f, "--out", c.out]),
        ("is a LoRA adapter written by surgery export-lora", "give a folder that a bake wrote"),
    ),
    Case(  # read as YAML it was "not valid YAML: fix the syntax"
        "export-lora-from-a-baked-gguf",
        lambda c: ["export-lora", c.src, "--recipe", _file(c.tmp / "baked.gguf", b"GGUF\x03"), "--out", c.out],
        ("is a baked GGUF", 'write the sidecar\'s "recipe" to a YAML file'),
    ),
    # --- a tokenizer that encodes the logit check's prompts to nothing ---
    Case(
        "tokenizer-encodes-nothing-verify",
        setups.empty_tokenizer(),
        ("encodes the check prompt 'The capital of France is' to no tokens", "--structural-only"),
    ),
]


# These also run through a real ``python -m surgery`` subprocess (one or two per group); the rest run
# in-process through surgery.cli.main.main, which is what the console script calls.
SUBPROCESS = {
    "missing-path",
    "direction-wrong-size",
    "direction-weight-overflows-bf16",
    "pickle-bin",
    "truncated-half",
    "quantized-gptq",
    "alpha-zero",
    "recipe-not-yaml",
    "recipe-neuron-octal",
    "findings-other-architecture",
    "dest-exists",
    "alpha-underflows-bf16",
    "tokenizer-encodes-nothing-verify",
}
RUNS = [pytest.param(c, "in-process", id=c.id) for c in CASES] + [
    pytest.param(c, "subprocess", id=f"{c.id}-subprocess") for c in CASES if c.id in SUBPROCESS
]


@pytest.mark.parametrize("case,how", RUNS)
def test_bad_input_fails_cleanly(case: Case, how: str, bases, tmp_path, capsys):
    src = tmp_path / "model" / "src"
    shutil.copytree(bases[case.source], src)
    outs = tmp_path / "outs"
    outs.mkdir()
    ctx = Ctx(src, outs / "baked", tmp_path)
    args = case.setup(ctx)
    source_before = tree_hashes(src)
    hidden_before = {p: hidden_entries(p) for p in (outs, src.parent)}
    dest_before = tree_hashes(ctx.out) if ctx.out.is_dir() else ctx.out.read_bytes() if ctx.out.exists() else None

    result = run_cli(args) if how == "subprocess" else run_main(args, capsys)

    line = error_line(result)
    for needle in case.needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    assert tree_hashes(src) == source_before, "the source changed"
    for parent, before in hidden_before.items():
        assert hidden_entries(parent, before) == [], f"hidden leftovers in {parent}"
    if case.dest_exists:
        after = tree_hashes(ctx.out) if ctx.out.is_dir() else ctx.out.read_bytes()
        assert after == dest_before, "an existing destination was modified"
    else:
        assert not ctx.out.exists(), "an output folder was left behind"
    assert not (tmp_path / "UNPICKLED").exists(), "a pickle was unpickled"


def _in_private_mount_namespace(script: str) -> subprocess.CompletedProcess | None:
    """Run ``script`` with sh in a private mount namespace (its mounts vanish with it); None when
    this machine does not allow that (not root, no unshare)."""
    if not shutil.which("unshare"):
        return None
    cmd = ["unshare", "-m", "--propagation", "private"]
    if subprocess.run([*cmd, "true"], capture_output=True).returncode != 0:
        return None
    return subprocess.run(
        [*cmd, "sh", "-c", script], capture_output=True, text=True, cwd=REPO, env=cli_env(), timeout=300
    )


def test_unwritable_destination(bases, tmp_path):
    """A destination folder the user cannot write: a clear error before any work.

    As root, chmod does not stop writes, so the folder becomes a read-only tmpfs instead.
    """
    src = tmp_path / "src"
    shutil.copytree(bases["single"], src)
    ro = tmp_path / "ro"
    ro.mkdir()
    args = ["amplify-heads", src, "--heads", "0.1", "--alpha", "2", "--out", ro / "baked"]
    before = tree_hashes(src)
    if os.geteuid() != 0:
        ro.chmod(0o555)
        try:
            result = run_cli(args)
        finally:
            ro.chmod(0o755)
    else:
        cli = shlex.join([sys.executable, "-m", "surgery", *map(str, args)])
        result = _in_private_mount_namespace(f"mount -t tmpfs -o ro,size=64k tmpfs {shlex.quote(str(ro))} && {cli}")
        if result is None:
            pytest.skip("root without mount namespaces: chmod cannot make a folder unwritable for root")
    line = error_line(result)
    assert "cannot write" in line and "choose another --out" in line, line
    assert tree_hashes(src) == before
    assert list(ro.iterdir()) == []


# --- fuzzing the header reader: any JSON in any field is a CheckpointError, never a crash ---

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 1 << 70) | st.floats() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
_field = st.sampled_from(["dtype", "shape", "data_offsets", None])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=_field, value=_json, name=st.sampled_from(["a", "b"]))
def test_header_fuzz_never_crashes(tmp_path, field, value, name):
    header = {
        "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        "b": {"dtype": "BF16", "shape": [4], "data_offsets": [16, 24]},
    }
    if field is None:
        header[name] = value  # the whole entry replaced
    else:
        header[name][field] = value
    path = tmp_path / "fuzz.safetensors"
    bad.write_raw(path, header, bytes(24))
    try:
        start, parsed = read_safetensors_header(path)
    except CheckpointError as exc:
        assert "\n" not in str(exc)
    else:
        assert start % 8 == 0 and set(parsed) == {"a", "b"}
