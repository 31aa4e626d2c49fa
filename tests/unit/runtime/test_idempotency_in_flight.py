"""The API's book of keyed submissions published but not yet decided: it answers for a job until the core has
decided it, and forgets a publish that never came back."""

from __future__ import annotations

from contracts import JobSpec, SubmitJob
from services.admission.in_flight import KEEP_S, InFlight

SPEC = JobSpec(team="t", queue="q", idempotency_key="k")


def submit(job_id: str) -> SubmitJob:
    return SubmitJob(id=f"c-{job_id}", ts=0.0, source="api", job_id=job_id, spec=SPEC)


def test_a_published_spec_is_held_until_the_core_decides_its_job() -> None:
    decided: dict[str, str] = {}
    book = InFlight(decided)
    book.add(submit("j1"))
    assert book.get("j1") == SPEC and book.get("j2") is None and book.command("j1") == submit("j1")
    decided["j1"] = "admitted"
    assert book.get("j1") is None


def test_a_spec_never_decided_is_forgotten_after_a_while_and_a_failed_publish_at_once() -> None:
    now = [0.0]
    book = InFlight({}, clock=lambda: now[0])
    book.add(submit("j1"))
    book.add(submit("j2"))
    book.discard("j2")
    now[0] = KEEP_S - 1
    assert (book.get("j1"), book.get("j2")) == (SPEC, None)
    now[0] = KEEP_S + 1
    assert book.get("j1") is None
