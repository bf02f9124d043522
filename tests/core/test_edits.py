"""Recipes: YAML round trip and strict validation with messages that name the field."""

from __future__ import annotations

import math

import numpy as np
import pytest

from surgery.core.edits import HeadScale, NeuronScale, Recipe, parse_heads, parse_neurons
from surgery.core.errors import RecipeError

CONFIG = {
    "model_type": "llama",
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "hidden_size": 64,
    "intermediate_size": 100,
}


def test_yaml_round_trip(tmp_path):
    recipe = Recipe((HeadScale(1, 2, 2.5), NeuronScale(3, 99, 0.0)), base_model="org/model")
    path = tmp_path / "r.yaml"
    path.write_text(recipe.to_yaml(header="made by a test\n\nsecond line"))
    loaded = Recipe.load(path)
    assert loaded == recipe
    assert path.read_text().startswith("# made by a test\n#\n# second line\n")


@pytest.mark.parametrize(
    "raw, field",
    [
        ({"version": 1, "edits": [{"type": "head", "layer": 0, "head": 0, "alpha": 2, "beta": 1}]}, "beta"),
        ({"version": 1, "edits": [{"type": "head", "layer": 0, "head": 0}]}, "alpha"),
        ({"version": 1, "edits": [{"type": "neuron", "layer": 0, "neuron": 0, "factor": "x"}]}, "factor"),
        ({"version": 1, "edits": [{"type": "head", "layer": 0, "head": 0, "alpha": math.nan}]}, "alpha"),
        ({"version": 1, "edits": [{"type": "head", "layer": 0, "head": 0, "alpha": math.inf}]}, "alpha"),
        ({"version": 1, "edits": [{"type": "head", "layer": 0.5, "head": 0, "alpha": 2}]}, "layer"),
        ({"version": 1, "edits": [{"type": "attention", "layer": 0}]}, "type"),
        ({"version": 2, "edits": [{"type": "head", "layer": 0, "head": 0, "alpha": 2}]}, "version"),
        ({"version": 1, "edits": []}, "edits"),
        ({"version": 1, "edits": [], "extra": 1}, "extra"),
        (
            {
                "version": 1,
                "edits": [
                    {"type": "head", "layer": 0, "head": 0, "alpha": 2},
                    {"type": "head", "layer": 0, "head": 0, "alpha": 3},
                ],
            },
            "conflicting",
        ),
    ],
)
def test_malformed_recipes_name_the_field(raw, field):
    with pytest.raises(RecipeError, match=field):
        Recipe.from_dict(raw)


@pytest.mark.parametrize(
    "edit, field",
    [
        (HeadScale(4, 0, 2.0), "num_hidden_layers = 4"),
        (HeadScale(0, 8, 2.0), "num_attention_heads = 8"),
        (NeuronScale(0, 100, 0.0), "intermediate_size = 100"),
        (NeuronScale(-1, 0, 0.0), "≥ 0"),
    ],
)
def test_out_of_range_names_the_config_field(edit, field):
    with pytest.raises(RecipeError, match=field):
        Recipe((edit,)).validate(CONFIG)


def test_identical_duplicates_collapse():
    assert len(Recipe((HeadScale(0, 0, 2.0), HeadScale(0, 0, 2.0))).edits) == 1


def test_empty_and_invalid_files(tmp_path):
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "bad.yaml").write_text("version: [1\n")
    with pytest.raises(RecipeError, match="empty"):
        Recipe.load(tmp_path / "empty.yaml")
    with pytest.raises(RecipeError, match="not valid YAML"):
        Recipe.load(tmp_path / "bad.yaml")
    with pytest.raises(RecipeError, match="does not exist"):
        Recipe.load(tmp_path / "missing.yaml")


def test_command_line_specs():
    assert parse_heads("7.7, 8.17", 2.5) == [HeadScale(7, 7, 2.5), HeadScale(8, 17, 2.5)]
    assert parse_neurons("28:17,28:901", 0.0) == [NeuronScale(28, 17, 0.0), NeuronScale(28, 901, 0.0)]
    with pytest.raises(RecipeError, match="LAYER.HEAD"):
        parse_heads("7:7", 2.0)
    with pytest.raises(RecipeError, match="LAYER:NEURON"):
        parse_neurons("28.17", 0.0)


# --- numbers from numpy are numbers (issue 33: an np.int64 layer was "not a number") ----------------


@pytest.mark.parametrize(
    "edit, plain",
    [
        (HeadScale(np.int64(3), np.int32(7), np.float32(2.5)), HeadScale(3, 7, 2.5)),
        (NeuronScale(np.uint16(2), np.int64(99), np.float64(0.0)), NeuronScale(2, 99, 0.0)),
    ],
)
def test_numpy_numbers_are_numbers(edit, plain, tmp_path):
    edit.check_values("edits[0]")
    Recipe((edit,)).validate(CONFIG)
    assert edit == plain and hash(edit) == hash(plain)
    assert all(type(v) in (int, float) for v in edit.to_dict().values() if not isinstance(v, str))
    path = tmp_path / "r.yaml"
    path.write_text(Recipe((edit,)).to_yaml())
    assert Recipe.load(path).edits == (plain,)


def test_numpy_booleans_and_floats_are_not_indices():
    with pytest.raises(RecipeError, match="must be an integer, got 3.0"):
        HeadScale(np.float32(3.0), 0, 2.0).check_values("edits[0]")
    with pytest.raises(RecipeError, match="must be a number"):
        HeadScale(np.bool_(True), 0, 2.0).check_values("edits[0]")


def test_a_recipe_number_in_decimal_bakes_that_number(tmp_path):
    """The decimal reading is the one kept; the YAML 1.1 forms are refused (issue 33)."""
    path = tmp_path / "r.yaml"
    path.write_text("version: 1\nedits:\n  - {type: neuron, layer: 1, neuron: 10, factor: 0.0}\n")
    assert Recipe.load(path).edits == (NeuronScale(1, 10, 0.0),)
    path.write_text("version: 1\nedits:\n  - {type: neuron, layer: 1, neuron: 010, factor: 0.0}\n")
    with pytest.raises(RecipeError, match=r"r.yaml.edits\[0\].neuron = '010' is not a plain decimal number"):
        Recipe.load(path)


def test_a_recipe_files_edit_out_of_range_names_the_file_and_its_place_in_it(tmp_path):
    """It said "edits[1].head = 8 …": no file (the syntax errors name it), and the place counted after an
    exact repeat was dropped, one before the edit the user wrote."""
    path = tmp_path / "r.yaml"
    head = "  - {type: head, layer: 1, head: 2, alpha: 2.0}\n"
    path.write_text(f"version: 1\nedits:\n{head}{head}  - {{type: head, layer: 1, head: 8, alpha: 2.0}}\n")
    with pytest.raises(RecipeError, match=r"^r\.yaml\.edits\[2\]\.head = 8 but the model has num_attention_heads = 8"):
        Recipe.load(path).validate(CONFIG)
    with pytest.raises(RecipeError, match=r"^edits\[0\]\.head = 8"):  # a recipe made in Python: its own list
        Recipe((HeadScale(1, 8, 2.0),)).validate(CONFIG)
