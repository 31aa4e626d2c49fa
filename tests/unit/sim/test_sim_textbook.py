"""The textbook policies (libs/sim/textbook.py): hand-checked cases per policy, and invariants over random jobs."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libs.sim import textbook
from libs.sim.textbook import run_textbook, run_textbook_segments
from libs.sim.trace_outcome import JobOutcome, TraceJob


def tj(job_id: str, submit: float, runtime: float, gpus: int = 1, team: str = "a") -> TraceJob:
    return TraceJob(job_id, team, submit, runtime, gpus)


def by_id(outcomes: list[JobOutcome]) -> dict[str, JobOutcome]:
    return {o.job.job_id: o for o in outcomes}


def times(outcomes: list[JobOutcome]) -> dict[str, tuple[float | None, float | None]]:
    return {o.job.job_id: (o.first_start_s, o.end_s) for o in outcomes}


# FIFO ------------------------------------------------------------------------------------------------------


def test_fifo_head_of_line_blocks_a_job_that_would_fit() -> None:
    jobs = [tj("a", 0, 10, 4), tj("b", 1, 5, 8), tj("c", 2, 1, 1)]
    fifo = times(run_textbook("fifo", jobs, {"a": 1}, shared=False))
    assert fifo == {"a": (0, 10), "b": (10, 15), "c": (15, 16)}  # c fits at 2 but waits behind b
    sjf = times(run_textbook("sjf", jobs, {"a": 1}, shared=False))
    assert sjf == {"a": (0, 10), "b": (10, 15), "c": (2, 3)}  # no head-of-line blocking


# SJF -------------------------------------------------------------------------------------------------------


def test_sjf_runs_the_shortest_waiting_job_first_and_never_preempts() -> None:
    jobs = [tj("a", 0, 10), tj("b", 1, 5), tj("c", 2, 2)]
    assert times(run_textbook("fifo", jobs, {"a": 1}, False, gpus_per_node=1)) == {
        "a": (0, 10), "b": (10, 15), "c": (15, 17)}
    sjf = run_textbook("sjf", jobs, {"a": 1}, False, gpus_per_node=1)
    assert times(sjf) == {"a": (0, 10), "c": (10, 12), "b": (12, 17)}
    assert all(o.preemptions == 0 for o in sjf)


def test_ties_go_by_submit_then_job_id_whatever_the_input_order() -> None:
    jobs = [tj("b", 0, 5), tj("a", 0, 5), tj("c", 0, 5)]
    for policy in ("fifo", "sjf", "srtf"):
        got = times(run_textbook(policy, jobs, {"a": 1}, False, gpus_per_node=1))
        assert got == {"a": (0, 5), "b": (5, 10), "c": (10, 15)}, policy
        again = times(run_textbook(policy, list(reversed(jobs)), {"a": 1}, False, gpus_per_node=1))
        assert again == got


# SRTF ------------------------------------------------------------------------------------------------------


def test_srtf_preempts_a_long_job_for_a_short_one_and_resumes_it_with_its_progress() -> None:
    jobs = [tj("long", 0, 10), tj("short", 2, 3)]
    out, segments = run_textbook_segments("srtf", jobs, {"a": 1}, False, gpus_per_node=1)
    got = by_id(out)
    assert (got["short"].first_start_s, got["short"].end_s) == (2, 5)
    assert (got["long"].first_start_s, got["long"].end_s) == (0, 13)  # 2 s done, 8 s left after 5
    assert got["long"].preemptions == 1 and got["long"].lost_gpu_s == 0.0
    assert got["short"].preemptions == 0
    assert segments[0] == [(0, 2), (5, 13)]
    assert times(run_textbook("sjf", jobs, {"a": 1}, False, gpus_per_node=1)) == {
        "long": (0, 10), "short": (10, 13)}


def test_srtf_does_not_preempt_a_job_with_less_time_left() -> None:
    jobs = [tj("long", 0, 10), tj("later", 6, 5)]  # at 6 "long" has 4 s left < 5
    got = by_id(run_textbook("srtf", jobs, {"a": 1}, False, gpus_per_node=1))
    assert (got["long"].end_s, got["later"].first_start_s, got["later"].end_s) == (10, 10, 15)
    assert got["long"].preemptions == 0


def test_srtf_stops_the_longer_job_on_the_node_not_the_shorter_one() -> None:
    jobs = [tj("quick", 0, 3, 4), tj("slow", 0, 100, 4), tj("new", 1, 10, 4)]
    got = by_id(run_textbook("srtf", jobs, {"a": 1}, False))
    assert (got["quick"].first_start_s, got["quick"].end_s, got["quick"].preemptions) == (0, 3, 0)
    assert (got["new"].first_start_s, got["new"].end_s) == (1, 11)
    # "slow" is stopped at 1 (99 s left) and resumes when "quick" frees its 4 GPUs at 3.
    assert (got["slow"].first_start_s, got["slow"].end_s, got["slow"].preemptions) == (0, 102, 1)


def test_srtf_a_multi_gpu_job_preempts_a_whole_node_job() -> None:
    jobs = [tj("big", 0, 100, 8), tj("half", 1, 5, 4)]
    got = by_id(run_textbook("srtf", jobs, {"a": 1}, False))
    assert (got["half"].first_start_s, got["half"].end_s) == (1, 6)
    assert (got["big"].end_s, got["big"].preemptions) == (105, 1)


def test_srtf_one_gpu_job_preempts_a_multi_node_job_which_waits_for_both_nodes() -> None:
    jobs = [tj("gang", 0, 100, 16), tj("tiny", 5, 1, 1)]
    got = by_id(run_textbook("srtf", jobs, {"a": 2}, False))
    assert (got["tiny"].first_start_s, got["tiny"].end_s) == (5, 6)
    assert (got["gang"].end_s, got["gang"].preemptions) == (101, 1)  # back at 6 with 95 s left


# pools, placement, rejection ------------------------------------------------------------------------------


def test_partitioned_teams_wait_for_their_own_nodes_shared_ones_use_any() -> None:
    jobs = [tj("x1", 0, 10, 8, "x"), tj("x2", 0, 10, 8, "x"), tj("y1", 0, 10, 8, "y")]
    for policy in ("fifo", "sjf", "srtf"):
        part = times(run_textbook(policy, jobs, {"x": 1, "y": 2}, shared=False))
        assert part == {"x1": (0, 10), "x2": (10, 20), "y1": (0, 10)}, policy  # y's second node idles
        shared = times(run_textbook(policy, jobs, {"x": 1, "y": 2}, shared=True))
        assert shared == {"x1": (0, 10), "x2": (0, 10), "y1": (0, 10)}, policy


def test_multi_node_jobs_take_wholly_free_nodes_and_small_ones_fit_best() -> None:
    # "a-wide" takes nodes 0 and 1 (8 + 4 GPUs); "b-four" best-fits the 4 left on node 1, so "c-eight" gets node 2;
    # "d-gang" needs two wholly free nodes and waits for "a-wide" and "b-four" to end.
    jobs = [tj("a-wide", 0, 10, 12), tj("b-four", 0, 10, 4), tj("c-eight", 0, 20, 8), tj("d-gang", 1, 5, 16)]
    for policy in ("fifo", "sjf"):
        seen = times(run_textbook(policy, jobs, {"a": 3}, False))
        assert seen == {"a-wide": (0, 10), "b-four": (0, 10), "c-eight": (0, 20), "d-gang": (10, 15)}, policy
    # SRTF: at 1 every job has more than d-gang's 5 s left; d-gang takes node 2 (its job has the most left)
    # and node 0, stopping "c-eight" and "a-wide". At 6 "a-wide" gets nodes 0 and 2 back; "c-eight" needs a
    # whole node and gets node 1 when "b-four" ends at 10.
    srtf = run_textbook("srtf", jobs, {"a": 3}, False)
    assert times(srtf) == {"a-wide": (0, 15), "b-four": (0, 10), "c-eight": (0, 29), "d-gang": (1, 6)}
    assert {o.job.job_id: o.preemptions for o in srtf} == {"a-wide": 1, "b-four": 0, "c-eight": 1, "d-gang": 0}


def test_a_job_bigger_than_its_pool_is_rejected_and_blocks_nobody() -> None:
    jobs = [tj("huge", 0, 10, 9, "x"), tj("next", 1, 1, 1, "x"), tj("ok", 0, 1, 16, "y")]
    for policy in ("fifo", "sjf", "srtf"):
        part = by_id(run_textbook(policy, jobs, {"x": 1, "y": 2}, shared=False))
        assert part["huge"].rejected and part["huge"].first_start_s is None and part["huge"].end_s is None
        assert (part["next"].first_start_s, part["next"].end_s) == (1, 2)
        assert not part["ok"].rejected
        shared = by_id(run_textbook(policy, jobs, {"x": 1, "y": 2}, shared=True))
        assert not any(o.rejected for o in shared.values())  # 24 GPUs in one pool hold 9


def test_unknown_policy_and_progress() -> None:
    with pytest.raises(ValueError, match="unknown textbook policy"):
        run_textbook("lifo", [], {"a": 1}, False)
    seen: list[int] = []
    run_textbook("sjf", [tj(f"j{i}", i, 1) for i in range(3)], {"a": 1}, False, progress=seen.append)
    assert seen[-1] == 3


# invariants over random job sets ---------------------------------------------------------------------------

job_sets = st.lists(
    st.tuples(st.sampled_from("ab"), st.integers(0, 40), st.integers(1, 30),
              st.sampled_from([1, 1, 2, 3, 4, 8, 12, 16])),
    min_size=1, max_size=30)
node_counts = st.fixed_dictionaries({"a": st.integers(1, 3), "b": st.integers(1, 2)})


def make_jobs(raw: list[tuple[str, int, int, int]]) -> list[TraceJob]:
    return [tj(f"j{i}", submit, runtime, gpus, team) for i, (team, submit, runtime, gpus) in enumerate(raw)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=job_sets, team_nodes=node_counts, shared=st.booleans(), policy=st.sampled_from(["fifo", "sjf", "srtf"]),
       gpn=st.sampled_from([4, 8]))
def test_invariants(raw: list[tuple[str, int, int, int]], team_nodes: dict[str, int], shared: bool, policy: str,
                    gpn: int) -> None:
    jobs = make_jobs(raw)
    out, segments = run_textbook_segments(policy, jobs, team_nodes, shared, gpn)
    assert out == run_textbook(policy, jobs, team_nodes, shared, gpn)  # deterministic
    capacity = {t: n * gpn for t, n in team_nodes.items()}
    pool_of = (lambda _t: "all") if shared else (lambda t: t)
    pool_gpus = {"all": sum(capacity.values())} if shared else capacity
    for o, segs in zip(out, segments, strict=True):
        job = o.job
        assert o.rejected == (job.gpus > pool_gpus[pool_of(job.team)])
        assert o.lost_gpu_s == 0.0 and not o.limit_stopped
        if o.rejected:
            assert o.first_start_s is None and o.end_s is None and not segs
            continue
        assert o.first_start_s is not None and o.end_s is not None
        assert o.first_start_s >= job.submit_s
        assert o.end_s - o.first_start_s >= job.runtime_s - 1e-9
        assert sum(b - a for a, b in segs) == pytest.approx(job.runtime_s)
        assert segs[0][0] == o.first_start_s and segs[-1][1] == o.end_s
        assert len(segs) == o.preemptions + 1
        if policy != "srtf":
            assert o.preemptions == 0
    # GPUs in use never exceed a pool's capacity.
    deltas: dict[str, list[tuple[float, int]]] = {}
    for o, segs in zip(out, segments, strict=True):
        for a, b in segs:
            deltas.setdefault(pool_of(o.job.team), []).extend([(a, o.job.gpus), (b, -o.job.gpus)])
    for pool, ds in deltas.items():
        used = 0
        for _, d in sorted(ds, key=lambda x: (x[0], x[1])):  # ends before starts at the same instant
            used += d
            assert 0 <= used <= pool_gpus[pool]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 30)), min_size=1, max_size=40),
       nodes=st.integers(1, 3), gpn=st.integers(1, 4), policy=st.sampled_from(["fifo", "sjf", "srtf"]))
def test_one_gpu_jobs_in_a_shared_pool_never_leave_a_gpu_idle_while_a_job_waits(
        raw: list[tuple[int, int]], nodes: int, gpn: int, policy: str) -> None:
    jobs = [tj(f"j{i}", submit, runtime, 1, "ab"[i % 2]) for i, (submit, runtime) in enumerate(raw)]
    out, segments = run_textbook_segments(policy, jobs, {"a": nodes, "b": 1}, True, gpn)
    capacity = (nodes + 1) * gpn
    instants = sorted({j.submit_s for j in jobs} | {x for segs in segments for seg in segs for x in seg})
    for t in instants:
        running = [i for i, segs in enumerate(segments) if any(a <= t < b for a, b in segs)]
        waiting = [i for i, o in enumerate(out)
                   if jobs[i].submit_s <= t and o.end_s is not None and o.end_s > t and i not in running]
        assert len(running) <= capacity
        if waiting:
            assert len(running) == capacity, (t, running, waiting)
        if policy == "srtf" and waiting and running:
            # Nothing waits that has less left than something running (ties by submit, then id).
            def left(i: int, t: float = t) -> tuple[float, float, str]:
                done = sum(min(b, t) - a for a, b in segments[i] if a < t)
                return (jobs[i].runtime_s - done, jobs[i].submit_s, jobs[i].job_id)
            assert max(left(i) for i in running) <= min(left(i) for i in waiting)


class _Forgetful(dict[int, tuple[int, int]]):
    def __setitem__(self, key: int, value: tuple[int, int]) -> None:
        pass


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=job_sets, team_nodes=node_counts, shared=st.booleans(), gpn=st.sampled_from([4, 8]))
def test_srtf_remembered_checks_decide_as_full_scans_would(
        raw: list[tuple[str, int, int, int]], team_nodes: dict[str, int], shared: bool, gpn: int) -> None:
    jobs = make_jobs(raw)
    fast = run_textbook("srtf", jobs, team_nodes, shared, gpn)
    original = textbook._Pool.__init__

    def forgetful_init(self: textbook._Pool, *args: Any) -> None:
        original(self, *args)
        self.memo = _Forgetful()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(textbook._Pool, "__init__", forgetful_init)
        assert run_textbook("srtf", jobs, team_nodes, shared, gpn) == fast
