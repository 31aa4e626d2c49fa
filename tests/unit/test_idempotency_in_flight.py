"""The API's book of keyed submissions published but not yet decided: it answers for a job until the core has
decided it, and forgets a publish that never came back."""

from __future__ import annotations

from contracts import JobSpec
from services.admission.in_flight import KEEP_S, InFlight

SPEC = JobSpec(team="t", queue="q", idempotency_key="k")


def test_a_published_spec_is_held_until_the_core_decides_its_job() -> None:
    decided: dict[str, str] = {}
    book = InFlight(decided)
    book.add("j1", SPEC)
    assert book.get("j1") == SPEC and book.get("j2") is None
    decided["j1"] = "admitted"
    assert book.get("j1") is None


def test_a_spec_never_decided_is_forgotten_after_a_while_and_a_failed_publish_at_once() -> None:
    now = [0.0]
    book = InFlight({}, clock=lambda: now[0])
    book.add("j1", SPEC)
    book.add("j2", SPEC)
    book.discard("j2")
    now[0] = KEEP_S - 1
    assert (book.get("j1"), book.get("j2")) == (SPEC, None)
    now[0] = KEEP_S + 1
    assert book.get("j1") is None
