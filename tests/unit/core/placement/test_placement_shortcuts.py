"""Placement's shortcuts (libs/core/placement/shortcuts.py) change what a decision costs, never what it is: a
loaded trace gives the same log, byte for byte, with a failed request's answer reused and the starving job's
shadow time reused, and with every answer worked out afresh."""

from __future__ import annotations

from typing import Any

import pytest

from libs.core.placement.shortcuts import Shortcuts
from libs.sim.trace_run import Setup
from tests.unit.core.kernel.test_shortcuts_change_no_decision import loaded_trace, log_bytes


@pytest.mark.parametrize("pool", ["partitioned", "shared"])
@pytest.mark.parametrize("declare", ["none", "noisy"])
def test_placement_shortcuts_decide_as_the_long_way(monkeypatch: pytest.MonkeyPatch, pool: str, declare: str
                                                    ) -> None:
    # A trace on which every setup meets a failure reused (on seed 11 the shared pool without declared runtimes
    # met one only by chance, and no longer once a lender's reclaim grace became its queue's).
    jobs = loaded_trace(seed=13)
    setup = Setup(pool, "platform", pool, declare)
    taken = {"failure": 0, "shadow": 0}
    known_failure, known_shadow = Shortcuts.known_failure, Shortcuts.known_shadow

    def counted_failure(self: Shortcuts, *args: Any) -> Any:
        answer = known_failure(self, *args)
        taken["failure"] += answer is not None
        return answer

    def counted_shadow(self: Shortcuts, *args: Any) -> Any:
        answer = known_shadow(self, *args)
        taken["shadow"] += answer[0]
        return answer

    with monkeypatch.context() as m:
        m.setattr(Shortcuts, "known_failure", counted_failure)
        m.setattr(Shortcuts, "known_shadow", counted_shadow)
        fast = log_bytes(jobs, setup)
    with monkeypatch.context() as m:
        m.setattr(Shortcuts, "known_failure", lambda self, shape, generation, pure: None)
        m.setattr(Shortcuts, "known_shadow", lambda self, key: (False, None))
        slow = log_bytes(jobs, setup)
    assert len(fast) > 1000
    assert fast == slow
    assert taken["failure"] > 0  # a pass meets many waiting jobs of one shape that cannot fit
