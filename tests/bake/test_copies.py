"""A second copy of the weights outside the loaded files (Mistral's consolidated.safetensors) is
edited exactly like the loaded weights, or refused in one line; verify and push apply the same rule."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from surgery.bake.bake import bake
from surgery.bake.undo import undo
from surgery.bake.verify import verify
from surgery.core.checkpoint import Checkpoint, file_sha256
from surgery.core.edits import HeadScale, NeuronScale, Recipe
from surgery.core.errors import VerificationError
from surgery.ship.hub import check_pushable
from tests.support.cli import error_line, run_main, staging_leftovers, tree_hashes

RECIPE = Recipe((HeadScale(0, 1, 2.5), HeadScale(2, 3, 0.5), NeuronScale(1, 3, 0.0), NeuronScale(2, 5, 0.5)))
COPY = "consolidated.safetensors"
# Mistral's native names, written here from the conversion script's table independently of
# surgery's (transformers models/mistral/convert_mistral_weights_to_hf.py, STATE_DICT_MAPPING).
TO_NATIVE = [
    (r"^lm_head\.", "output."),
    (r"^model\.norm\.", "norm."),
    (r"^model\.embed_tokens\.", "tok_embeddings."),
    (r"^model\.layers\.(\d+)\.input_layernorm\.", r"layers.\1.attention_norm."),
    (r"^model\.layers\.(\d+)\.post_attention_layernorm\.", r"layers.\1.ffn_norm."),
    (r"^model\.layers\.(\d+)\.self_attn\.([qkvo])_proj\.", r"layers.\1.attention.w\2."),
    (r"^model\.layers\.(\d+)\.mlp\.gate_proj\.", r"layers.\1.feed_forward.w1."),
    (r"^model\.layers\.(\d+)\.mlp\.down_proj\.", r"layers.\1.feed_forward.w2."),
    (r"^model\.layers\.(\d+)\.mlp\.up_proj\.", r"layers.\1.feed_forward.w3."),
]


def native(name: str) -> str:
    for pattern, repl in TO_NATIVE:
        if re.match(pattern, name):
            return re.sub(pattern, repl, name)
    raise KeyError(name)


def _unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """The native row order of a transformers q/k matrix (the inverse of the script's permute_for_rope)."""
    return w.view(heads, 2, w.shape[0] // heads // 2, w.shape[1]).transpose(1, 2).reshape(w.shape)


def _all(folder: Path) -> dict[str, torch.Tensor]:
    """Every loaded tensor of a checkpoint folder (sharded or not)."""
    out = {}
    for f in Checkpoint(folder).weight_files:
        out.update(load_file(str(folder / f)))
    return out


def with_native_copy(src: Path) -> Path:
    """``src`` plus consolidated.safetensors: its weights under Mistral's native names, q/k permuted."""
    cfg = json.loads((src / "config.json").read_text())
    out = {}
    for name, t in _all(src).items():
        if ".q_proj." in name or ".k_proj." in name:
            t = _unpermute(t, cfg["num_attention_heads" if ".q_proj." in name else "num_key_value_heads"])
        out[native(name)] = t.contiguous()
    save_file(out, str(src / COPY))
    return src


def _edited_files(out: Path) -> set[str]:
    return {e["file"] for e in json.loads((out / "surgery.json").read_text())["edited_tensors"]}


def test_a_copy_under_the_same_names_is_edited_byte_for_byte(tiny, tmp_path, capsys):
    src = tiny("llama")  # with MLP biases: their elements are pruned in the copy too
    shutil.copy(src / "model.safetensors", src / COPY)
    out = tmp_path / "baked"
    result = run_main(["apply", _recipe_file(tmp_path), "--model", src, "--out", out], capsys)
    assert result.returncode == 0, result.stderr
    assert f"{COPY} holds a second copy of the weights" in " ".join(result.stderr.split())
    assert file_sha256(out / COPY) == file_sha256(out / "model.safetensors") != file_sha256(src / COPY)
    assert _edited_files(out) == {"model.safetensors", COPY}
    assert verify(Checkpoint(src), out).ok
    undo(out, tmp_path / "restored")
    assert tree_hashes(tmp_path / "restored") == tree_hashes(src)


def _recipe_file(tmp_path: Path) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE.to_yaml())
    return path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_a_copy_under_mistral_native_names_is_edited_like_the_loaded_weights(tiny, tmp_path, dtype):
    src = with_native_copy(tiny("mistral", dtype=dtype, shard="20KB"))
    out = tmp_path / "baked"
    bake(Checkpoint(src), RECIPE, out)
    loaded, copy, before = _all(out), load_file(str(out / COPY)), load_file(str(src / COPY))
    edited = {e["tensor"] for e in json.loads((out / "surgery.json").read_text())["edited_tensors"]}
    assert {n for n in edited if n.startswith("layers.")} == {native(n) for n in edited if n.startswith("model.")}
    for name, t in loaded.items():
        n = native(name)
        if ".q_proj." in name or ".k_proj." in name:
            continue  # permuted, and never edited
        assert torch.equal(copy[n].view(torch.uint8), t.view(torch.uint8)), n  # same bytes as the loaded tensor
        assert (n in edited) == (not torch.equal(before[n].view(torch.uint8), t.view(torch.uint8))), n
    assert verify(Checkpoint(src), out, run_model=False).ok
    undo(out, tmp_path / "restored")
    assert tree_hashes(tmp_path / "restored") == tree_hashes(src)


def _unmapped_native(tiny) -> Path:
    """A qwen2 source with a native-named copy: the table knows no native names for qwen2."""
    src = tiny("qwen2")
    tensors = load_file(str(src / "model.safetensors"))
    save_file({native(n): t for n, t in tensors.items() if not n.endswith(".bias")}, str(src / COPY))
    return src


def _wrong_shape(tiny) -> Path:
    src = tiny("llama")
    tensors = load_file(str(src / "model.safetensors"))
    o_proj = "model.layers.0.self_attn.o_proj.weight"
    tensors[o_proj] = tensors[o_proj][:, :16].contiguous()
    (src / "extra").mkdir()
    save_file(tensors, str(src / "extra" / COPY))
    return src


def _foreign_names(tiny) -> Path:
    src = tiny("llama")
    save_file({"encoder.proj.weight": torch.zeros(32, 32)}, str(src / "draft.safetensors"))
    return src


@pytest.mark.parametrize(
    "setup,needle",
    [
        (
            _unmapped_native,
            f"{COPY} is a weights file outside the ones transformers loads (model.safetensors) and its "
            "tensor 'layers.0.attention.wk.weight' is none of the model's",
        ),
        (
            _wrong_shape,
            f"extra/{COPY} is a weights file outside the ones transformers loads (model.safetensors) and its "
            "tensor 'model.layers.0.self_attn.o_proj.weight' has shape [32, 16] where the model's",
        ),
        (_foreign_names, "draft.safetensors is a weights file outside the ones transformers loads"),
    ],
    ids=["unmapped-native-names", "wrong-shape", "foreign-names"],
)
def test_a_weights_file_that_cannot_be_matched_is_refused(setup, needle, tiny, tmp_path, capsys):
    src = setup(tiny)
    before = tree_hashes(src)
    out = tmp_path / "baked"
    line = error_line(run_main(["amplify-heads", src, "--heads", "0.1", "--alpha", "2", "--out", out], capsys))
    assert needle in line and "move it out of" in line and "and run again" in line, line
    assert not out.exists() and staging_leftovers(tmp_path) == [] and tree_hashes(src) == before


def test_an_adapter_file_is_not_a_copy_of_the_weights(tiny, tmp_path):
    from surgery.bake.lora import export_lora

    src = tiny("llama")
    export_lora(Checkpoint(src), RECIPE, tmp_path / "adapter")
    shutil.copytree(tmp_path / "adapter", src / "lora")
    out = tmp_path / "baked"
    bake(Checkpoint(src), RECIPE, out)
    assert file_sha256(out / "lora" / "adapter_model.safetensors") == file_sha256(
        src / "lora" / "adapter_model.safetensors"
    )
    assert _edited_files(out) == {"model.safetensors"}
    assert verify(Checkpoint(src), out, run_model=False).ok


@pytest.fixture
def copied_as_is(tiny, tmp_path):
    """What bakes before this rule made of a source with a native-named copy: the copy carried over
    unedited, its sha256 recorded and the record sealed."""
    from surgery.bake.provenance import provenance_text

    src = tiny("mistral")
    out = tmp_path / "baked"
    bake(Checkpoint(src), RECIPE, out)
    with_native_copy(src)
    shutil.copy(src / COPY, out / COPY)
    prov = json.loads((out / "surgery.json").read_text())
    prov["files"][COPY] = prov["source_files"][COPY] = file_sha256(src / COPY)
    (out / "surgery.json").write_text(provenance_text(prov))
    return src, out


def test_verify_fails_on_a_copy_left_unedited(copied_as_is):
    src, out = copied_as_is
    report = verify(Checkpoint(src), out, run_model=False)
    assert report.problems == [
        f"{COPY} holds a copy of the edited tensor 'layers.0.attention.wo.weight' that the "
        "bake left unedited (it copied weight files outside the loaded ones as is): whatever "
        "loads it serves the unedited model; bake again"
    ]


def test_push_refuses_a_copy_left_unedited(copied_as_is, tmp_path):
    src, out = copied_as_is
    with pytest.raises(VerificationError, match=f"{COPY} holds a copy of the edited tensor .* left unedited"):
        check_pushable(out)  # structural check against the source
    src.rename(tmp_path / "moved-away")  # the source is no longer on this machine: the folder's own record
    with pytest.raises(VerificationError, match=f"{COPY} holds a copy of the edited tensor .* left unedited"):
        check_pushable(out)


def test_an_edit_of_a_permuted_native_tensor_is_refused(tiny):
    """Mistral's wq/wk rows are permuted for RoPE: the same bytes are not the same rows, so a plan on
    q_proj (no edit makes one today) is never carried over to them."""
    from surgery.bake.copies import copy_patches
    from surgery.core.architectures import architecture
    from surgery.core.errors import CheckpointError
    from surgery.core.patches import TensorPatch

    src = with_native_copy(tiny("mistral"))
    ckpt = Checkpoint(src)
    q_proj = TensorPatch(ckpt.tensor("model.layers.0.self_attn.q_proj.weight"), rows={0: 2.0})
    with pytest.raises(
        CheckpointError,
        match=r"its copy 'layers\.0\.attention\.wq\.weight' of the edited "
        r"'model\.layers\.0\.self_attn\.q_proj\.weight' stores its rows in "
        r"another order \(permuted for RoPE\)",
    ):
        copy_patches(ckpt, architecture(ckpt.config), [q_proj])
    v_proj = TensorPatch(ckpt.tensor("model.layers.0.self_attn.v_proj.weight"), rows={0: 2.0})
    (carried,) = copy_patches(ckpt, architecture(ckpt.config), [v_proj])
    assert (carried.info.file, carried.info.name, carried.rows) == (COPY, "layers.0.attention.wv.weight", {0: 2.0})
