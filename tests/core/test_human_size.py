"""human_size: sizes as notes, tables and errors show them — three significant digits, never an exponent
(`surgery push --dry-run` listed a 1,010-byte file as "1.01e+03 B")."""

from __future__ import annotations

import pytest

from surgery.core.sizes import human_size


@pytest.mark.parametrize(
    ("n", "shown"),
    [
        (0, "0 B"),
        (368, "368 B"),
        (1010, "1010 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (1010 * 2**20, "1010 MiB"),
        (2 * 2**30, "2 GiB"),
        (5 * 2**40, "5 TiB"),
        (1500 * 2**40, "1500 TiB"),
    ],
)
def test_sizes_read_without_an_exponent(n, shown):
    assert human_size(n) == shown
