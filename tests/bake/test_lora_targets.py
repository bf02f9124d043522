"""export-lora and PEFT's renaming of mixture-of-experts targets (transformers 5).

PEFT renames the gate/up/down targets of mixture-of-experts model types to their fused experts by the
module's last name: an adapter on a dense layer's ``mlp.down_proj`` (Qwen3-MoE's ``mlp_only_layers``)
would load onto the routed experts. export-lora refuses such a target in one line; heads export as usual.
"""

from __future__ import annotations

import pytest

from surgery.bake.lora import export_lora
from surgery.core.checkpoint import Checkpoint
from surgery.core.edits import HeadScale, NeuronScale, Recipe
from surgery.core.errors import RecipeError
from tests.support.models import load_fp32, logits


def test_a_dense_layer_of_a_moe_type_is_refused_heads_are_exact(tiny, tmp_path):
    from peft import PeftModel

    from surgery.bake.bake import bake

    src = tiny("qwen3_moe", mlp_only_layers=[0])  # layer 0: a dense MLP in a mixture-of-experts type
    ckpt = Checkpoint(src)
    with pytest.raises(RecipeError) as exc:
        export_lora(ckpt, Recipe((NeuronScale(0, 3, 0.0),)), tmp_path / "adapter")
    assert "\n" not in str(exc.value) and "model.layers.0.mlp.down_proj" in str(exc.value)
    assert "fused experts" in str(exc.value) and not (tmp_path / "adapter").exists()

    heads = Recipe((HeadScale(0, 1, 2.5), HeadScale(2, 3, 0.5)))
    export_lora(ckpt, heads, tmp_path / "heads")
    bake(ckpt, heads, tmp_path / "baked")
    adapted = logits(PeftModel.from_pretrained(load_fp32(src), tmp_path / "heads").eval())
    assert (adapted - logits(load_fp32(tmp_path / "baked"))).abs().max().item() <= 1e-5
