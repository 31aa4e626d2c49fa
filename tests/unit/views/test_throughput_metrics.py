"""The throughput bench's figures from a hand-made log, its job plan, and the profile summary."""

from __future__ import annotations

from contracts import EventBase, JobAdmitted, JobPlaced, JobSpec, QuotaReserved, ReplicaPlacement, SubmitJob
from libs.bench.stats import percentile
from libs.bench.throughput_metrics import step_figures, sustained
from libs.bench.throughput_profile import summarise
from libs.bench.throughput_run import ThroughputOptions, plan_step

SPEC = JobSpec(team="alpha", queue="alpha", gpus=1)


def _job_log(job: str, submitted: float, placed: float | None) -> list[tuple[float, EventBase]]:
    out: list[tuple[float, EventBase]] = [
        (submitted, SubmitJob(id=f"s-{job}", ts=0.0, source="t", job_id=job, spec=SPEC)),
        (submitted + 0.001, JobAdmitted(id=f"a-{job}", ts=0.0, source="t", job_id=job, queue="alpha")),
        (submitted + 0.003, QuotaReserved(id=f"q-{job}", ts=0.0, source="t", job_id=job, queue="alpha",
                                          gpu_milli=1000)),
    ]
    if placed is not None:
        out.append((placed, JobPlaced(id=f"p-{job}", ts=0.0, source="t", job_id=job, placements=(
            ReplicaPlacement(replica=0, node="n", gpu_indices=(0,), gpu_milli=1000),))))
    return out


def _log(jobs: list[tuple[str, float, float | None]]) -> list[tuple[int, float, EventBase]]:
    timed = sorted((e for j in jobs for e in _job_log(*j)), key=lambda t: t[0])
    return [(seq, at, e) for seq, (at, e) in enumerate(timed, start=1)]


def test_latency_rates_and_backlog_come_from_stored_times() -> None:
    # Ten jobs a second for 10 s, each placed 10 ms after it was stored, except the last, placed 1 s late.
    jobs: list[tuple[str, float, float | None]] = [(f"j{i}", 100.0 + i / 10, 100.0 + i / 10 + 0.01)
                                                   for i in range(99)]
    jobs.append(("j99", 109.9, 110.9))
    fig = step_figures(_log(jobs), {j for j, _, _ in jobs}, rate=10.0)
    assert (fig["jobs"], fig["submitted"], fig["placed"]) == (100, 100, 100)
    assert fig["p50_ms"] == 10.0 and fig["max_ms"] == 1000.0
    assert fig["stages_ms"]["admission"]["p50_ms"] == 1.0 and fig["stages_ms"]["quota"]["p50_ms"] == 2.0
    assert fig["stages_ms"]["placement"]["p50_ms"] == 7.0
    # The steady window leaves out the first second: 89 arrivals over 8.9 s, 89 placed in it (the last job
    # is placed after it, the first of the window's jobs within it).
    assert fig["submitted_per_s"] == 10.0 and fig["placed_per_s"] == 10.0
    assert fig["backlog_at_end"] == 1 and fig["drain_s"] == 1.0
    assert fig["events_per_job"] == 4.0 and fig["events_per_job_by_type"]["JobPlaced"] == 1.0
    assert sustained(fig, p99_bound_ms=1000.0, min_share=0.95)
    assert not sustained(fig, p99_bound_ms=5.0, min_share=0.95)
    assert not sustained({**fig, "rate": 20.0}, p99_bound_ms=1000.0, min_share=0.95)


def test_a_job_never_placed_is_not_sustained() -> None:
    fig = step_figures(_log([("a", 1.0, 1.01), ("b", 2.0, None)]), {"a", "b"}, rate=1.0)
    assert fig["placed"] == 1 and fig["backlog_at_end"] == 1
    assert not sustained(fig, p99_bound_ms=1000.0, min_share=0.0)


def test_events_of_other_jobs_count_in_the_log_but_not_as_the_steps_jobs() -> None:
    fig = step_figures(_log([("a", 1.0, 1.01), ("other", 1.5, 1.6)]), {"a"}, rate=1.0)
    assert (fig["jobs"], fig["placed"], fig["events"]) == (1, 1, 8)


def test_percentile_is_the_nearest_rank() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0


def test_the_plan_mixes_teams_and_shapes_and_sends_a_share_through_the_api() -> None:
    plan = plan_step(3, 40, ThroughputOptions(http_share=0.25))
    assert len({p.job_id for p in plan}) == 40
    assert {p.spec.team for p in plan} == {"alpha", "beta", "gamma", "delta"}
    assert sum(p.spec.gpu_milli == 500 for p in plan) == 10
    assert all(1.0 <= (p.spec.duration_s or 0) <= 2.0 for p in plan)
    api = [p for p in plan if p.key]
    assert len(api) == 10 and all(p.spec.idempotency_key == p.key for p in api)
    assert plan_step(3, 40, ThroughputOptions()) == plan_step(3, 40, ThroughputOptions())
    assert not any(p.key for p in plan_step(3, 40, ThroughputOptions()))


def test_the_profile_summary_names_own_time_callees_and_activities() -> None:
    collapsed = "\n".join([
        "main (a.py);Reactor.process (r.py);DeciderHandler.on_event (h.py);score (s.py) 6",
        "main (a.py);Reactor.process (r.py);Bus.publish (libs/bus/jetstream.py) 3",
        "main (a.py);Runner.run (asyncio/runners.py) 1",
        "not a stack line",
    ])
    s = summarise(collapsed)
    assert s["samples"] == 10
    assert s["self_pct"][0] == ("score (s.py)", 60.0)
    assert dict(s["total_pct"])["Reactor.process (r.py)"] == 90.0
    assert s["activity_pct"] == {"decide": 60.0, "publish": 30.0, "event loop": 10.0}
    assert summarise("") == {"samples": 0}
