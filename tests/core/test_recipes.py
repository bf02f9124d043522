"""The shipped recipes (recipes/*.yaml) read back, say how they were made, and fit their model."""

from __future__ import annotations

from pathlib import Path

import pytest

from surgery.core.checkpoint import Checkpoint
from surgery.core.edits import Recipe
from tests.support.paths import REPO

RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
MODEL_OF = {"smollm2-135m-instruct": "smollm2", "gemma-3-270m": "gemma3_270m"}


def _fixture_of(path: Path) -> str:
    return next(fixture for prefix, fixture in MODEL_OF.items() if path.name.startswith(prefix))


def test_there_are_recipes_for_both_real_models():
    assert {_fixture_of(p) for p in RECIPES} == set(MODEL_OF.values())


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_reads_back_with_its_header(path):
    recipe = Recipe.load(path)
    assert recipe.edits and recipe.base_model in {"HuggingFaceTB/SmolLM2-135M-Instruct", "google/gemma-3-270m"}
    header = [line for line in path.read_text().splitlines() if line.startswith("#")]
    assert any(line.startswith("# Reproduce: bash examples/quickstart.sh") for line in header)
    assert any(line.startswith("# Eval (surgery eval --against the source") for line in header)
    # its time is the run that made it, not a promise (the docs' performance page has today's)
    assert any(line.startswith("# (the quickstart run that made this recipe: ") for line in header), header
    assert (REPO / "docs" / "performance.md").is_file()


@pytest.mark.slow(minutes=1)
@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_fits_its_model(path, request):
    model = request.getfixturevalue(_fixture_of(path))
    Recipe.load(path).validate(Checkpoint(model).config)
