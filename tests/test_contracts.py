"""The contracts are a promise: the committed schema matches the Structs, and every golden payload written
by an earlier version still decodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts import ALL_EVENT_TYPES
from contracts.codec import decode, encode
from contracts.export import SCHEMA_PATH, schema_text

GOLDEN = sorted((Path(__file__).parents[1] / "contracts" / "golden").glob("*.json"))


def test_the_committed_json_schema_is_current() -> None:
    assert SCHEMA_PATH.read_text() == schema_text(), "run: python -m contracts.export"


def test_every_event_type_has_a_golden_payload() -> None:
    assert {p.stem for p in GOLDEN} >= {t.__name__ for t in ALL_EVENT_TYPES}


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden_payloads_keep_decoding_to_their_type_and_re_encode_identically(path: Path) -> None:
    raw = path.read_bytes().strip()
    event = decode(raw)
    assert type(event).__name__ == path.stem
    assert encode(event) == raw  # additive changes only: an old payload's bytes survive a round trip
