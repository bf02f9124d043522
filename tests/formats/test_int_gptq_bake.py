"""Bakes into int4 / int8 compressed-tensors checkpoints as llm-compressor's GPTQ writes them with
activation ordering: ``actorder: weight`` (the plain layout) and ``actorder: group`` (each input
column's scale group in ``X.weight_g_idx``), written offline around compressed-tensors' own compressor
(tests/support/int_packed.py). Exact where exactness exists (checked by decompressing with
compressed-tensors), refused in one line elsewhere; verify, undo byte for byte."""

from __future__ import annotations

import json

import pytest
import torch
from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
from safetensors.torch import load_file, save_file

from surgery.bake.bake import bake
from surgery.bake.check import edited_check
from surgery.bake.undo import undo
from surgery.bake.verify import verify
from surgery.core.checkpoint import Checkpoint, file_sha256
from surgery.core.edits import HeadScale, NeuronScale, Recipe
from surgery.core.errors import CheckpointError, RecipeError
from tests.support.int_packed import build_int, dequantized

O_PROJ = "model.layers.{}.self_attn.o_proj.weight"
DOWN = "model.layers.{}.mlp.down_proj.weight"
GATE = "model.layers.{}.mlp.gate_proj.weight"
HEAD_DIM = 8  # tests/support/tiny.py
# (actorder, scheme): GPTQ's W4A16 (groups of 8 = a head; groups of 4, asymmetric: two per head) and int8
CASES = [("weight", "w4a16-g8"), ("group", "w4a16-g8"), ("group", "w4a16-g4-asym"), ("group", "int8-g8")]


def _bake(src, out, recipe):
    ckpt = Checkpoint(src)
    return bake(ckpt, recipe, out, check=edited_check(ckpt, recipe))


def _head_cols(head: int, alpha: float) -> torch.Tensor:
    s = torch.ones(32)
    s[head * HEAD_DIM : (head + 1) * HEAD_DIM] = alpha
    return s


def _part(name: str, suffix: str) -> str:
    return name.removesuffix("weight") + suffix


def test_a_g_idx_checkpoint_decodes_each_column_by_its_own_group(tmp_path):
    """The builder's actorder-group weights mean what GPTQ's do: column c is (code − zero[g[c]]) × scale[g[c]],
    its groups spread over the row (compressed-tensors 0.18, which decoded g_idx itself, agrees: see the report)."""
    src = build_int(tmp_path / "src", "w4a16-g4-asym", actorder="group")
    t = load_file(src / "model.safetensors")
    name = DOWN.format(1)
    g = t[_part(name, "weight_g_idx")].long()
    assert t[_part(name, "weight_g_idx")].dtype == torch.int32
    assert not torch.equal(g, torch.arange(48) // 4)  # permuted: the test means something
    codes = unpack_from_int32(t[_part(name, "weight_packed")], 4, torch.Size([32, 48]))
    zero = unpack_from_int32(t[_part(name, "weight_zero_point")], 4, torch.Size([32, 12]), packed_dim=0)
    scale = t[_part(name, "weight_scale")].float()
    assert torch.equal(dequantized(src, name, "w4a16-g4-asym"), (codes.float() - zero[:, g].float()) * scale[:, g])


@pytest.mark.parametrize(("actorder", "scheme"), CASES)
def test_pruned_neurons_and_an_aligned_head_are_exact_and_undone(tmp_path, actorder, scheme):
    # GPTQ's order kept within each head's columns: a head's columns are whole groups, permuted
    src = build_int(tmp_path / "src", scheme, actorder=actorder, within=HEAD_DIM)
    recipe = Recipe((NeuronScale(1, 3, 0.0), NeuronScale(1, 40, 0.0), HeadScale(2, 1, 0.5)))
    out = tmp_path / "out"
    result = _bake(src, out, recipe)
    assert result.provenance.verification.kind == "dequantized weights"
    # decompressed by compressed-tensors: the edit of the decompressed source, exactly
    down_src, down_out = dequantized(src, DOWN.format(1), scheme), dequantized(out, DOWN.format(1), scheme)
    expected = down_src.clone()
    expected[:, [3, 40]] = 0.0
    assert torch.equal(down_out, expected)
    gate = dequantized(out, GATE.format(1), scheme)
    assert torch.equal(gate[[3, 40]], torch.zeros(2, gate.shape[1]))
    assert torch.equal(gate[[0, 1, 2]], dequantized(src, GATE.format(1), scheme)[[0, 1, 2]])
    o_src, o_out = dequantized(src, O_PROJ.format(2), scheme), dequantized(out, O_PROJ.format(2), scheme)
    assert torch.equal(o_out, o_src * _head_cols(1, 0.5))
    a, b = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    if actorder == "group":
        assert torch.equal(a[_part(O_PROJ.format(2), "weight_g_idx")], b[_part(O_PROJ.format(2), "weight_g_idx")])
    edited = (
        "layers.1.mlp.down_proj.",
        "layers.1.mlp.gate_proj.",
        "layers.1.mlp.up_proj.",
        "layers.2.self_attn.o_proj.",
    )
    for name in a:
        if not any(e in name for e in edited) or name.endswith("g_idx"):
            assert torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8)), name
    report = verify(Checkpoint(src), out)
    assert report.ok, report.problems
    assert report.numeric_check.startswith("dequantized weights")
    # logits too: transformers decompresses the plain layout; actorder "group", which compressed-tensors 0.20
    # refuses, surgery decodes by its g_idx as it loads
    assert "logits" in report.numeric_check and report.max_abs_logit_diff <= report.tolerance
    undo(out, tmp_path / "restored")
    for f in ("model.safetensors", "config.json"):
        assert file_sha256(tmp_path / "restored" / f) == file_sha256(src / f)


def test_a_pruned_down_column_holds_the_zero_point_of_its_own_group(tmp_path):
    """Asymmetric int4, actorder group: the pruned column's codes are the zero points of group g_idx[N],
    not of the group its position would give (the two differ here)."""
    src = build_int(tmp_path / "src", "w4a16-g4-asym", actorder="group")
    t = load_file(src / "model.safetensors")
    name = DOWN.format(0)
    g = t[_part(name, "weight_g_idx")].long()
    col = next(c for c in range(48) if g[c] != c // 4)
    _bake(src, tmp_path / "out", Recipe((NeuronScale(0, col, 0.0),)))
    t = load_file(tmp_path / "out" / "model.safetensors")
    codes = unpack_from_int32(t[_part(name, "weight_packed")], 4, torch.Size([32, 48]))
    zero = unpack_from_int32(t[_part(name, "weight_zero_point")], 4, torch.Size([32, 12]), packed_dim=0)
    assert not torch.equal(zero[:, g[col]], zero[:, col // 4])
    assert torch.equal(codes[:, col], zero[:, g[col]])
    assert torch.equal(dequantized(tmp_path / "out", name, "w4a16-g4-asym")[:, col], torch.zeros(32))


def test_a_head_whose_groups_hold_other_columns_is_refused_in_one_line(tmp_path):
    """GPTQ's order over the whole row: a head's 8 columns belong to groups that hold other heads'
    columns, so no scale is the head's own; pruning still bakes, exactly."""
    src = build_int(tmp_path / "src", "w4a16-g8", actorder="group")
    with pytest.raises(RecipeError) as err:
        _bake(src, tmp_path / "out", Recipe((HeadScale(0, 1, 0.5),)))
    msg = str(err.value)
    g_idx = _part(O_PROJ.format(0), "weight_g_idx")
    assert "\n" not in msg and O_PROJ.format(0) in msg and "by 0.5" in msg
    assert "not whole scale groups (actorder group" in msg and g_idx in msg
    assert not (tmp_path / "out").exists()
    _bake(src, tmp_path / "pruned", Recipe((HeadScale(0, 1, 0.0), NeuronScale(2, 7, 0.0))))
    o_src, o_out = (
        dequantized(src, O_PROJ.format(0), "w4a16-g8"),
        dequantized(tmp_path / "pruned", O_PROJ.format(0), "w4a16-g8"),
    )
    assert torch.equal(o_out, o_src * _head_cols(1, 0.0))
    assert verify(Checkpoint(src), tmp_path / "pruned").ok


def test_an_aligned_head_whose_scales_cannot_take_alpha_is_refused(tmp_path):
    src = build_int(tmp_path / "src", "w4a16-g4-asym", actorder="group", within=HEAD_DIM)
    with pytest.raises(RecipeError, match="are whole scale groups, but their scales times it are not exact in BF16"):
        _bake(src, tmp_path / "out", Recipe((HeadScale(1, 2, 0.7),)))
    assert not (tmp_path / "out").exists()


def _edit_g_idx(src, change) -> str:
    """Rewrite layer 1's down_proj g_idx with ``change`` (None: delete it); its name."""
    tensors = load_file(src / "model.safetensors")
    name = _part(DOWN.format(1), "weight_g_idx")
    value = change(tensors.pop(name))
    if value is not None:
        tensors[name] = value
    save_file(tensors, src / "model.safetensors")
    return name


def _uneven(g: torch.Tensor) -> torch.Tensor:
    """One more column in the group of column 0, one fewer in another."""
    other = int((g != g[0]).nonzero()[0])
    g = g.clone()
    g[other] = g[0].item()
    return g


@pytest.mark.parametrize(
    ("change", "want"),
    [
        (lambda g: None, "has no '{}'"),
        (lambda g: g[:40].contiguous(), "is I32 [40] but"),
        (lambda g: g.to(torch.float32), "is F32 [48] but"),
        (lambda g: torch.where(g == 5, 6, g).to(torch.int32), "names scale group 6 but"),
        (lambda g: torch.where(g == 0, -1, g).to(torch.int32), "names scale group -1 but"),
        (_uneven, "other than 8 columns"),
    ],
    ids=["missing", "short", "float", "past-the-end", "negative", "uneven"],
)
def test_a_g_idx_that_does_not_fit_its_weight_is_refused_in_one_line(tmp_path, change, want):
    src = build_int(tmp_path / "src", "w4a16-g8", actorder="group")
    name = _edit_g_idx(src, change)
    with pytest.raises(CheckpointError) as err:
        _bake(src, tmp_path / "out", Recipe((NeuronScale(0, 1, 0.0),)))
    msg = str(err.value)
    assert "\n" not in msg and name in msg and want.format(name) in msg and "re-download" in msg
    assert not (tmp_path / "out").exists()


def test_a_g_idx_the_config_does_not_announce_is_refused(tmp_path):
    """actorder weight keeps the groups in order: a stored g_idx contradicts the config (which decoder is right?)."""
    src = build_int(tmp_path / "src", "w4a16-g8", actorder="weight")
    tensors = load_file(src / "model.safetensors")
    name = _part(DOWN.format(1), "weight_g_idx")
    tensors[name] = torch.arange(48, dtype=torch.int32).flip(0) // 8
    save_file(tensors, src / "model.safetensors")
    with pytest.raises(CheckpointError) as err:
        _bake(src, tmp_path / "out", Recipe((NeuronScale(0, 1, 0.0),)))
    msg = str(err.value)
    assert "\n" not in msg and name in msg and "actorder weight" in msg and "no actorder 'group'" in msg
    assert not (tmp_path / "out").exists()


def test_transformers_cannot_load_an_actorder_group_checkpoint(tmp_path):
    """The fact behind verify's line: compressed-tensors (0.20) refuses the config itself; if a release
    loads it again, Scheme.not_run must change."""
    from transformers import AutoModelForCausalLM

    src = build_int(tmp_path / "src", "w4a16-g8", actorder="group")
    with pytest.raises(ValueError, match="actorder='group' has been removed"):
        AutoModelForCausalLM.from_pretrained(src)
    assert Checkpoint(src).format.scheme.not_run.startswith("compressed-tensors 0.20 removed")


def test_the_config_aliases_of_actorder_are_read(tmp_path):
    """compressed-tensors' aliases: static = weight, dynamic = group; an unknown ordering is not a layout surgery edits."""
    src = build_int(tmp_path / "src", "w4a16-g8", actorder="group")
    config = json.loads((src / "config.json").read_text())
    weights = config["quantization_config"]["config_groups"]["group_0"]["weights"]
    for value, read in (("dynamic", "group"), (True, "group"), ("static", "weight"), (None, None)):
        weights["actorder"] = value
        (src / "config.json").write_text(json.dumps(config))
        assert Checkpoint(src).format.scheme.actorder == read
    weights["actorder"] = "columns"
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="quantized"):
        Checkpoint(src)


def test_the_verify_command_compares_logits_on_a_layout_transformers_cannot_load(tmp_path):
    """compressed-tensors 0.20 refuses actorder "group": surgery decodes the codes by their g_idx as it loads
    both models (float32, exactly), so verify's one line gives the logits' difference: none. The tolerance is
    bfloat16's because the edited gate/up biases are stored as plain bf16 tensors beside the codes."""
    from tests.support.cli import run_here

    src = build_int(tmp_path / "src", "w4a16-g8", actorder="group")
    _bake(src, tmp_path / "out", Recipe((NeuronScale(1, 3, 0.0),)))
    result = run_here(["verify", src, tmp_path / "out"])
    assert result.returncode == 0, result.stderr
    lines = [ln for ln in result.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("OK: ")
    assert "max |Δlogit| vs run-time edit 0.00e+00 " in lines[0] and " · u(BF16) " in lines[0]
