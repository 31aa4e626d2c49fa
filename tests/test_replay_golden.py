"""A recorded log (committed, from a real run of the six services) replays to exactly its recorded
decisions; a changed decision rule or an altered decision shows up as mismatches."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.audit.replay import replay
from libs.cli.audit import _read_file

GOLDEN_LOG = Path(__file__).parent / "golden" / "demo-log.jsonl"


@pytest.fixture(scope="module")
def recorded() -> list[tuple[int, bytes]]:
    return _read_file(GOLDEN_LOG)


def test_the_recorded_log_replays_to_its_recorded_decisions_byte_for_byte(recorded: list[tuple[int, bytes]]) -> None:
    report = replay(recorded)
    assert report.events == len(recorded)
    assert report.decisions_checked >= 90
    assert report.mismatches == []
    assert any(b'"type":"PreemptionDecided"' in raw for _, raw in recorded)


def test_a_changed_placement_rule_is_reported_as_mismatches(recorded: list[tuple[int, bytes]],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import libs.core.cluster.job_fit as fit

    # Spread instead of the recorded policy: the same jobs would land elsewhere.
    original = fit.choose
    monkeypatch.setattr(fit, "choose", lambda a, frag, req, policy, salt, allowed=None, ok=None:
                        original(a, frag, req, "spread", salt, allowed, ok))
    report = replay(recorded)
    assert report.mismatches
    assert {m.service for m in report.mismatches} <= {"placement", "preemption"}


def test_an_altered_recorded_decision_is_reported(recorded: list[tuple[int, bytes]]) -> None:
    altered = [(seq, raw.replace(b'"gpu_indices":[0,1]', b'"gpu_indices":[6,7]', 1)) for seq, raw in recorded]
    assert altered != recorded
    report = replay(altered)
    assert [m.service for m in report.mismatches][:1] == ["placement"]
