"""write_whole replaces a file in one step and leaves no side file behind."""

from __future__ import annotations

import stat
from pathlib import Path

from libs.files import write_whole


def test_a_file_is_replaced_whole_and_nothing_is_left_beside_it(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "endpoints.json"
    write_whole(target, "one")
    write_whole(target, "two")
    assert target.read_text() == "two"
    assert [p.name for p in target.parent.iterdir()] == ["endpoints.json"]


def test_a_private_file_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    target = tmp_path / "tokens.json"
    write_whole(target, "{}", private=True)
    assert target.read_text() == "{}"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["tokens.json"]
