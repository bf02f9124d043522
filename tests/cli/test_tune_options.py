"""``surgery tune``'s options checked before any model is read: another method's options are refused
(they would be ignored, and start another study), and a direction search whose weights are all 0."""

from __future__ import annotations

import pytest

from surgery.core.optional import available, install_hint
from tests.support.cli import cli_env, run_here
from tests.support.planted_tune import DOSE

pytestmark = pytest.mark.skipif(not available("optuna"), reason=install_hint("optuna"))


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--method", "direction", "--behaviour", "a.txt", "--markers", "m.txt", "--n-max", "5", "--alpha-max", "3"],
            "Error: --alpha-max (heads), --n-max (neurons): not read by --method direction, which would ignore them; "
            "drop them or give the method they are for",
        ),
        (
            ["--method", "heads", "--weight-max", "0.5"],
            "Error: --weight-max (direction): not read by --method heads, which would ignore it; drop it or give "
            "the method it is for",
        ),
        (
            ["--method", "neurons", "--max-pairs", "8", "--format", "base"],
            "Error: --max-pairs (heads), --format (heads): not read by --method neurons, which would ignore them; "
            "drop them or give the method they are for",
        ),
        (
            ["--method", "heads", "--language", "es"],
            "Error: --language (neurons): not read by --method heads, which would ignore it; drop it or give the "
            "method it is for",
        ),
        (
            ["--method", "direction", "--behaviour", "a.txt", "--markers", "m.txt", "--weight-max", "0"],
            "Error: --weight-max 0 leaves every layer unedited (each weight is drawn from 0 to it); give a value "
            "above 0 (1 removes the direction)",
        ),
    ],
)
def test_an_option_the_method_does_not_read_is_one_line(tmp_path, extra, message):
    """Given as on SmolLM2, these ran a whole study that ignored them (or failed after loading the model
    naming ablate-direction's --weight, --width and --position)."""
    res = run_here(["tune", DOSE, *extra], env=cli_env(SURGERY_CACHE=str(tmp_path / "cache")))
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [message], res.stderr
    assert not (tmp_path / "cache").exists()  # refused before any study folder or findings were looked for
