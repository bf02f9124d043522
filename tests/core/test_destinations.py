"""Where a report file may go (check_out_file): its missing folders are made, so only a folder at
its path, a file above it, or a folder that cannot be written is refused."""

from __future__ import annotations

import pytest

from surgery.core.destinations import check_out_file
from surgery.core.errors import DestinationError


def test_a_report_file_may_replace_a_file_or_go_into_folders_yet_to_be_made(tmp_path):
    (tmp_path / "old.json").write_text("{}")
    assert check_out_file(tmp_path / "old.json", "x.json") == tmp_path / "old.json"
    assert check_out_file(tmp_path / "new" / "deeper" / "r.json", "x.json") == tmp_path / "new" / "deeper" / "r.json"
    assert not (tmp_path / "new").exists()  # a check writes nothing


def test_a_report_file_is_never_a_folder_nor_below_a_file(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(DestinationError, match=r"is a folder; give the file to write, e\.g\. out .*r\.json"):
        check_out_file(tmp_path, "r.json")
    with pytest.raises(DestinationError, match=r"lies below .*notes\.txt, which is a file"):
        check_out_file(tmp_path / "notes.txt" / "a" / "r.json", "r.json")
