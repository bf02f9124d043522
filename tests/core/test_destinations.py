"""Where a report file may go (check_out_file): its missing folders are made, so only a folder at
its path, a file above it, a folder that cannot be written, or a file surgery did not write is refused."""

from __future__ import annotations

import pytest

from surgery.core.destinations import check_out_file
from surgery.core.errors import DestinationError


def test_a_report_file_may_replace_surgerys_file_or_go_into_folders_yet_to_be_made(tmp_path):
    (tmp_path / "old.json").write_text('{"format": "surgery-findings", "version": 1}')
    assert check_out_file(tmp_path / "old.json", "x.json") == tmp_path / "old.json"
    assert check_out_file(tmp_path / "new" / "deeper" / "r.json", "x.json") == tmp_path / "new" / "deeper" / "r.json"
    assert not (tmp_path / "new").exists()  # a check writes nothing


def test_a_report_file_is_never_a_folder_nor_below_a_file(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(DestinationError, match=r"is a folder; give the file to write, e\.g\. out .*r\.json"):
        check_out_file(tmp_path, "r.json")
    with pytest.raises(DestinationError, match=r"lies below .*notes\.txt, which is a file"):
        check_out_file(tmp_path / "notes.txt" / "a" / "r.json", "r.json")


@pytest.mark.parametrize("content", ["precious notes", "{}", '{"format": "theirs"}', "[1, 2]", " "])
def test_a_file_surgery_did_not_write_is_never_replaced(tmp_path, content):
    (tmp_path / "notes.txt").write_text(content)
    with pytest.raises(DestinationError, match=r"notes\.txt exists and was not written by surgery"):
        check_out_file(tmp_path / "notes.txt", "r.json")
    assert (tmp_path / "notes.txt").read_text() == content


def test_an_empty_file_may_be_replaced(tmp_path):
    """The file ``mktemp`` makes for a report holds nothing to lose."""
    (tmp_path / "empty.json").touch()
    assert check_out_file(tmp_path / "empty.json", "r.json") == tmp_path / "empty.json"
