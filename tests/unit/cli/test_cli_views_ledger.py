"""What the read models tell people, folded by the ledger from the log: each job's runs (where each ran, how it
ended) after its placement is gone, the quota placed jobs hold apart from the quota unplaced jobs reserved, and
the GPUs of a node by how they are shared (whole, split into fractions, MIG)."""

from __future__ import annotations

import msgspec
import pytest

from contracts import (
    CancelJob,
    GpuSpec,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobStarted,
    NodeSpec,
    PlacementDeferred,
)
from contracts.views import RUN_HISTORY, gpu_request
from libs.core.accounting.ledger import Ledger
from tests.unit.builders import EventFeed, job, node, pipeline, queue

A100_80 = 81_920


def mig_node(name: str, gpus: int = 1) -> NodeSpec:
    return NodeSpec(name=name, cpu_milli=64_000, memory_mib=512_000,
                    gpus=tuple(GpuSpec(index=i, model="A100", memory_mib=A100_80, mig_enabled=True)
                               for i in range(gpus)))


def world(nominal_gpus: int | None = 8, *nodes: NodeSpec) -> EventFeed:
    feed = pipeline(ledger=True)
    feed.at(900.0).queues(queue("ml-train", "ml", nominal_gpus))
    feed.nodes(*(nodes or (node("a", 4), node("b", 4))))
    return feed


def ledger(feed: EventFeed) -> Ledger:
    assert feed.ledger is not None
    return feed.ledger


# --- the runs of a job ---------------------------------------------------------------------------------------


def test_a_finished_job_keeps_where_each_of_its_runs_ran_and_how_it_ended() -> None:
    feed = world()
    feed.at(1000.0).submit("j", job().gpus(2))
    feed.at(1010.0).send(JobStarted, job_id="j")
    feed.at(1030.0).send(JobEvicted, job_id="j", reason="node_lost")  # placed again at once
    feed.at(1040.0).send(JobStarted, job_id="j")
    feed.at(1100.0).send(JobFinished, job_id="j")
    view = ledger(feed).state.jobs["j"]
    assert view.placements == () and view.run_count == 2
    first, second = view.runs
    assert [(p.node, p.gpu_indices) for p in first.placements] == [("a", (0, 1))]
    assert (first.placed_at, first.started_at, first.ended_at, first.outcome, first.reason) == (
        1000.0, 1010.0, 1030.0, "evicted", "node_lost")
    assert second.placements and (second.placed_at, second.started_at, second.ended_at, second.outcome) == (
        1030.0, 1040.0, 1100.0, "succeeded")
    assert first.run != second.run  # each run named by the placement that began it


def test_a_run_still_going_is_open_and_the_current_one_is_last() -> None:
    feed = world()
    feed.at(1000.0).submit("j", job())
    view = ledger(feed).state.jobs["j"]
    (run,) = view.runs
    assert (run.started_at, run.ended_at, run.outcome) == (None, None, "")
    feed.at(1005.0).send(JobStarted, job_id="j")
    assert (view.runs[-1].started_at, view.runs[-1].ended_at) == (1005.0, None)
    assert view.runs[-1].placements == view.placements


@pytest.mark.parametrize(("ending", "outcome", "reason", "exit_code"), [
    pytest.param((JobFailed, {"exit_code": 137, "reason": "oom_killed"}), "failed", "oom_killed", 137,
                 id="a failure that runs again"),
    pytest.param((JobFailed, {"exit_code": 2, "reason": "bad_input"}), "failed", "bad_input", 2, id="a final failure"),
    pytest.param((JobFinished, {"exit_code": 3}), "failed", "", 3, id="finished with an error"),
    pytest.param((JobEvicted, {"reason": "preempted"}), "evicted", "preempted", None, id="preempted"),
])
def test_each_way_a_run_ends_is_recorded(ending, outcome: str, reason: str, exit_code: int | None) -> None:
    feed = world()
    feed.at(1000.0).submit("j", job())
    feed.send(JobStarted, job_id="j")
    event_type, fields = ending
    feed.at(1050.0).send(event_type, job_id="j", **fields)
    run = ledger(feed).state.jobs["j"].runs[0]
    assert (run.ended_at, run.outcome, run.reason, run.exit_code) == (1050.0, outcome, reason, exit_code)


def test_a_cancelled_run_ends_cancelled() -> None:
    feed = world()
    feed.at(1000.0).submit("j", job())
    feed.send(JobStarted, job_id="j")
    feed.at(1010.0).send(CancelJob, job_id="j")
    feed.at(1020.0).send(JobEvicted, job_id="j", reason="cancelled")
    view = ledger(feed).state.jobs["j"]
    assert view.state == "cancelled" and [(r.outcome, r.ended_at) for r in view.runs] == [("cancelled", 1020.0)]


def test_the_history_keeps_the_last_runs_and_counts_them_all() -> None:
    feed = world()
    feed.at(1000.0).submit("j", job())
    runs = RUN_HISTORY + 3
    for i in range(runs):
        feed.at(1000.0 + 10 * i).send(JobStarted, job_id="j")
        feed.at(1005.0 + 10 * i).send(JobEvicted, job_id="j", reason="preempted")
    view = ledger(feed).state.jobs["j"]
    assert view.run_count == runs + 1 and len(view.runs) == RUN_HISTORY  # placed again after the last eviction
    assert view.runs[0].started_at == 1000.0 + 10 * (runs - RUN_HISTORY + 1)
    assert view.runs[-1].ended_at is None


def test_folding_the_same_log_again_gives_the_same_views() -> None:
    feed = world(8, node("a", 4), mig_node("m"))
    feed.at(1000.0).submit("w", job().gpus(2))
    feed.submit("f", job().fraction(250))
    feed.submit("g", job(mig_profile="1g.10gb"))
    feed.at(1010.0).send(JobStarted, job_id="w")
    feed.at(1020.0).send(JobEvicted, job_id="w", reason="preempted")
    again = Ledger()
    for seq, event in enumerate(feed.log, start=1):
        again.fold(event, seq)
    first = ledger(feed)
    enc = msgspec.json.encode
    assert [enc(v) for v in first.state.jobs.values()] == [enc(v) for v in again.state.jobs.values()]
    assert [enc(first.node_view(n)) for n in ("a", "m")] == [enc(again.node_view(n)) for n in ("a", "m")]
    assert enc(first.queue_view("ml-train")) == enc(again.queue_view("ml-train"))


# --- quota held by placed jobs, reserved by unplaced ones ------------------------------------------------------


def test_quota_reserved_by_a_job_no_node_takes_yet_is_unplaced_not_held() -> None:
    feed = world(8, node("a", 4))
    feed.at(1000.0).submit("big", job().gpus(4))
    feed.send(JobStarted, job_id="big")
    feed.submit("waits", job().gpus(2))  # its queue has the quota, the node has no GPU left
    led = ledger(feed)
    assert led.state.jobs["waits"].phase == "reserved" and led.state.jobs["waits"].reason == "insufficient_gpus"
    q = led.queue_view("ml-train")
    assert (q.reserved_gpus, q.held_gpus, q.unplaced_gpus) == (6.0, 4.0, 2.0)
    (flavor,) = q.flavors
    assert (flavor.in_use_gpus, flavor.held_gpus, flavor.unplaced_gpus) == (6.0, 4.0, 2.0)
    feed.at(1100.0).send(JobFinished, job_id="big")  # its quota goes back, and the waiting job is placed
    q = led.queue_view("ml-train")
    assert led.state.jobs["waits"].phase == "placed"
    assert (q.reserved_gpus, q.held_gpus, q.unplaced_gpus) == (2.0, 2.0, 0.0)


def test_a_queue_without_quota_splits_what_it_reserved_too() -> None:
    feed = world(None, node("a", 2))
    feed.at(1000.0).submit("one", job().gpus(2))
    feed.submit("two", job().gpus(1))
    q = ledger(feed).queue_view("ml-train")
    assert (q.nominal_gpus, q.flavors, q.held_gpus, q.unplaced_gpus) == (None, [], 2.0, 1.0)


def test_an_evicted_job_holds_nothing_once_its_quota_is_released() -> None:
    feed = world(2, node("a", 2))
    feed.at(1000.0).submit("j", job().gpus(2))
    feed.send(JobStarted, job_id="j")
    feed.send(CancelJob, job_id="j")
    feed.send(JobEvicted, job_id="j", reason="cancelled")
    q = ledger(feed).queue_view("ml-train")
    assert (q.reserved_gpus, q.held_gpus, q.unplaced_gpus) == (0.0, 0.0, 0.0)
    assert ledger(feed).state.holds.jobs == {}


# --- a node's GPUs by how they are shared ----------------------------------------------------------------------


def test_a_node_view_counts_idle_split_and_mig_gpus_apart() -> None:
    feed = world(8, node("a", 4), mig_node("m", 2))
    feed.at(1000.0).submit("whole", job().gpus(2))
    feed.submit("quarter", job().fraction(250))
    feed.submit("instance", job(mig_profile="3g.40gb"))
    led = ledger(feed)
    a, m = led.node_view("a"), led.node_view("m")
    assert a.gpu_modes == ("whole", "whole", "split", "whole")
    assert (a.idle_gpus, a.split_gpus, a.split_free_milli, a.mig_gpus) == (1, 1, 750, 0)
    assert m.gpu_modes == ("mig", "mig")
    assert (m.idle_gpus, m.split_gpus, m.mig_gpus, m.mig_slices, m.mig_free_slices) == (0, 0, 2, 14, 11)
    # What the free share alone said: MIG capacity read as free GPUs no whole-GPU job can use.
    assert sum(m.gpu_free_milli) > 1000 and m.idle_gpus == 0
    feed.send(JobStarted, job_id="quarter")
    feed.send(JobFinished, job_id="quarter")
    a = led.node_view("a")
    assert a.gpu_modes == ("whole",) * 4 and (a.idle_gpus, a.split_gpus, a.split_free_milli) == (2, 0, 0)


def test_a_gpu_taken_whole_by_fractions_is_still_split_and_unhealthy_gpus_count_nowhere() -> None:
    feed = world(8, node("a", 2))
    for i in range(4):
        feed.at(1000.0).submit(f"q{i}", job().fraction(250))
    led = ledger(feed)
    view = led.node_view("a")
    assert view.gpu_modes == ("split", "whole") and (view.split_gpus, view.split_free_milli) == (1, 0)
    led.state.cluster.set_gpu_health("a", 1, False)
    assert led.node_view("a").idle_gpus == 0


# --- messages that say what the job asks for ---------------------------------------------------------------------


def test_a_deferral_message_starts_with_what_the_job_asks_for_in_its_users_terms() -> None:
    feed = world(8, node("a", 4))
    feed.at(1000.0).submit("big", job().gpus(4))
    feed.submit("waits", job().gpus(1).replicas(2).models("A100"))
    view = ledger(feed).state.jobs["waits"]
    assert view.reason == "insufficient_gpus"
    assert view.message.startswith("2 x 1 whole GPU (A100): ")
    told = [e.message for e in feed.log if isinstance(e, PlacementDeferred) and e.job_id == "waits"]
    assert view.message == f"2 x 1 whole GPU (A100): {told[-1]}"  # the recorded decision's text, unchanged


@pytest.mark.parametrize(("fields", "long", "short"), [
    ({"replicas": 2, "gpus": 1}, "2 x 1 whole GPU", "2x1"),
    ({"replicas": 1, "gpus": 4, "models": ("A100", "H100")}, "1 x 4 whole GPUs (A100 or H100)", "1x4"),
    ({"replicas": 1, "gpu_milli": 250}, "1 x 250m of one GPU", "1x250m"),
    ({"replicas": 3, "mig_profile": "1g.10gb", "models": ("A100",)}, "3 x MIG 1g.10gb (A100)", "3x1g.10gb"),
])
def test_gpu_requests_read_in_their_users_terms(fields: dict[str, object], long: str, short: str) -> None:
    assert gpu_request(**fields) == long  # type: ignore[arg-type]
    assert gpu_request(**fields, short=True) == short  # type: ignore[arg-type]
