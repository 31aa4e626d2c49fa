"""Tamper evidence, timeline, explain and what-if on recorded logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contracts.codec import decode
from libs.audit.replay import replay
from libs.audit.timeline import timeline
from libs.audit.verify import verify
from libs.cli.audit import _read_file
from libs.sim.pipeline import run_virtual, world_inputs
from libs.sim.whatif import WhatIfError, parse_change, what_if

GOLDEN = Path(__file__).parent / "golden"
KEY = (GOLDEN / "demo-audit.key").read_bytes().strip()


@pytest.fixture(scope="module")
def recorded() -> list[tuple[int, bytes]]:
    return _read_file(GOLDEN / "demo-log.jsonl")


def decisions_of(log: list[tuple[int, bytes]], source: str) -> list[int]:
    return [i for i, (_, raw) in enumerate(log) if json.loads(raw)["source"] == source]


def test_an_untouched_log_verifies_with_its_signed_checkpoints(recorded) -> None:
    report = verify(recorded, KEY)
    assert report.ok and report.first_bad is None
    assert report.decisions >= 90 and report.checkpoints >= 5


def test_a_wrong_key_is_caught_at_the_first_checkpoint(recorded) -> None:
    report = verify(recorded, b"not the key")
    assert not report.ok and report.first_bad is not None and "signature" in report.first_bad.reason


def test_an_altered_decision_is_named(recorded) -> None:
    i = next(i for i in decisions_of(recorded, "placement") if b'"gpu_indices":[0' in recorded[i][1])
    seq, raw = recorded[i]
    tampered = list(recorded)
    tampered[i] = (seq, raw.replace(b'"gpu_indices":[0', b'"gpu_indices":[1', 1))
    bad = verify(tampered).first_bad
    assert bad is not None and bad.seq == seq and "broken chain" in bad.reason


def test_a_removed_decision_breaks_the_next_link_of_its_service(recorded) -> None:
    quota = decisions_of(recorded, "quota")
    tampered = [e for k, e in enumerate(recorded) if k != quota[3]]
    bad = verify(tampered).first_bad
    assert bad is not None and bad.seq == recorded[quota[4]][0] and bad.source == "quota"


def test_an_inserted_decision_is_caught(recorded) -> None:
    quota = decisions_of(recorded, "quota")
    seq, raw = recorded[quota[2]]
    forged = raw.replace(b'"gpu_milli":', b'"gpu_milli":1', 1)
    tampered = list(recorded)
    tampered.insert(quota[2] + 1, (seq, forged))
    tampered = [(n + 1, r) for n, (_, r) in enumerate(tampered)]  # renumbered to look seamless
    bad = verify(tampered).first_bad
    assert bad is not None and bad.source == "quota"


def test_reordered_decisions_are_caught(recorded) -> None:
    placement = decisions_of(recorded, "placement")
    a, b = placement[1], placement[2]
    tampered = list(recorded)
    tampered[a], tampered[b] = (recorded[a][0], recorded[b][1]), (recorded[b][0], recorded[a][1])
    bad = verify(tampered).first_bad
    assert bad is not None and bad.seq == recorded[a][0]


def test_a_reordered_sequence_and_non_canonical_bytes_are_caught(recorded) -> None:
    swapped = [recorded[1], recorded[0], *recorded[2:]]
    assert "out of order" in verify(swapped).first_bad.reason  # type: ignore[union-attr]
    seq, raw = recorded[5]
    spaced = [*recorded[:5], (seq, raw.replace(b",", b", ", 1)), *recorded[6:]]
    assert "canonical" in verify(spaced).first_bad.reason  # type: ignore[union-attr]


def test_a_forger_who_recomputes_the_chain_is_caught_by_the_signed_checkpoints(recorded) -> None:
    from contracts.codec import encode
    from libs.core.kernel.decider import GENESIS, chain_hash

    heads: dict[str, str] = {}
    forged = []
    for seq, raw in recorded:
        event = decode(raw)
        if event.source == "placement":
            import msgspec

            event = msgspec.structs.replace(event, chain="")
            if hasattr(event, "placements") and event.placements:
                p = event.placements[0]
                event = msgspec.structs.replace(event, placements=(msgspec.structs.replace(p, node="elsewhere"),
                                                                   *event.placements[1:]))
            link = chain_hash(heads.get("placement", GENESIS), encode(event))
            heads["placement"] = link
            raw = encode(msgspec.structs.replace(event, chain=link))
        forged.append((seq, raw))
    unkeyed = verify(forged)
    assert not unkeyed.ok and "checkpoint" in unkeyed.first_bad.reason  # type: ignore[union-attr]
    assert replay(forged).mismatches  # and replay disagrees with the forged decisions too


def test_a_removed_input_event_shows_up_as_replay_mismatches(recorded) -> None:
    submit = next(i for i, (_, raw) in enumerate(recorded) if b'"type":"SubmitJob"' in raw)
    report = replay([e for k, e in enumerate(recorded) if k != submit])
    assert report.mismatches and report.mismatches[0].service == "admission"


def test_the_timeline_of_a_preempted_job_tells_its_story(recorded) -> None:
    victim = next(json.loads(raw)["victims"][0]["job_id"] for _, raw in recorded
                  if b'"type":"PreemptionDecided"' in raw)
    kinds = [row["type"] for row in timeline(recorded, victim)]
    assert kinds[:3] == ["SubmitJob", "JobSubmitted", "JobAdmitted"]
    assert "PreemptionDecided" in kinds and "JobEvicted" in kinds
    assert kinds.index("JobEvicted") > kinds.index("PreemptionDecided")
    assert kinds[-1] in ("QuotaReleased", "JobFinished")


def test_a_virtual_rerun_of_the_history_replays_cleanly(recorded) -> None:
    from contracts.codec import encode

    run = run_virtual(world_inputs([(s, decode(r)) for s, r in recorded]), tick_s=1.0)
    report = replay([(seq, encode(e)) for seq, e in run.log])
    assert report.mismatches == [] and report.decisions_checked > 50


def test_what_if_more_quota_shortens_the_teams_waits() -> None:
    from contracts import GpuSpec, JobSpec, NodeRegistered, NodeSpec, QueuePolicyChanged, QueueSpec, SubmitJob

    node = NodeSpec(name="n", cpu_milli=64_000, memory_mib=512_000,
                    gpus=tuple(GpuSpec(index=i, model="A100") for i in range(8)))
    inputs = [NodeRegistered(id="n", ts=0.0, source="node-telemetry", node=node),
              QueuePolicyChanged(id="q", ts=0.0, source="operator", version=1,
                                 queue=QueueSpec(name="small", team="small", nominal_gpus=2))]
    inputs += [SubmitJob(id=f"s{i}", ts=float(i), source="api", job_id=f"j{i}",
                         spec=JobSpec(team="small", queue="small", gpus=1, duration_s=60.0)) for i in range(8)]
    result = what_if(inputs, [parse_change("queue.small.nominal=8")], tick_s=5.0)
    before, after = result["teams"]["small"]["before"], result["teams"]["small"]["after"]
    assert before["mean_wait_s"] > 60 and after["mean_wait_s"] == 0.0
    assert after["gpu_hours"] == pytest.approx(before["gpu_hours"])  # the same work, sooner


@pytest.mark.parametrize("text", ["queue.x", "queue.small.weight.A100=4", "queue.small.colour=red", "node.a=1",
                                  "queue.small.nominal=lots", "queue.small.nominal.A100=lots"])
def test_what_if_rejects_a_bad_change_with_a_reason(text: str) -> None:
    with pytest.raises(WhatIfError):
        parse_change(text)


def test_what_if_sets_one_gpu_models_quota() -> None:
    from contracts import GpuSpec, JobSpec, NodeRegistered, NodeSpec, QueuePolicyChanged, QueueSpec, SubmitJob

    gpus = tuple(GpuSpec(index=i, model="A100" if i < 4 else "H100") for i in range(8))
    node = NodeSpec(name="n", cpu_milli=64_000, memory_mib=512_000, gpus=gpus)
    inputs = [NodeRegistered(id="n", ts=0.0, source="node-telemetry", node=node),
              QueuePolicyChanged(id="q", ts=0.0, source="operator", version=1,
                                 queue=QueueSpec(name="small", team="small", nominal_gpus=1))]
    inputs += [SubmitJob(id=f"s{i}", ts=float(i), source="api", job_id=f"j{i}",
                         spec=JobSpec(team="small", queue="small", gpus=1, duration_s=60.0, gpu_models=("H100",)))
               for i in range(4)]
    change = parse_change("queue.small.nominal.H100=4")
    assert (change.field, change.model, change.value) == ("nominal_gpus", "H100", 4)
    result = what_if(inputs, [change], tick_s=5.0)
    assert result["teams"]["small"]["before"]["mean_wait_s"] > 60
    assert result["teams"]["small"]["after"]["mean_wait_s"] == 0.0


def test_a_parallel_replay_finds_the_same_decisions_and_mismatches(recorded) -> None:
    import libs.audit.replay as replay_module

    placement = decisions_of(recorded, "placement")
    seq, raw = recorded[placement[0]]
    altered = [*recorded[: placement[0]], (seq, raw.replace(b'"replica":0', b'"replica":1', 1)),
               *recorded[placement[0] + 1:]]
    serial = replay(altered, workers=1)
    old = replay_module.PARALLEL_FROM
    replay_module.PARALLEL_FROM = 0
    try:
        parallel = replay(altered, workers=2)
    finally:
        replay_module.PARALLEL_FROM = old
    assert parallel.decisions_checked == serial.decisions_checked > 0
    assert [(m.service, m.trigger_seq) for m in parallel.mismatches] == [
        (m.service, m.trigger_seq) for m in serial.mismatches]
    assert serial.mismatches


def test_the_deciders_of_a_worker_that_dies_are_replayed_by_the_parent(recorded, monkeypatch) -> None:
    import os

    import libs.audit.replay as replay_module

    def dies(*_: object) -> None:
        os._exit(1)  # as if it had taken every decider, and died before answering

    serial = replay(recorded, workers=1)
    monkeypatch.setattr(replay_module, "PARALLEL_FROM", 0)
    monkeypatch.setattr(replay_module, "_worker", dies)
    monkeypatch.setattr(replay_module, "_take", lambda order, taken: iter(()))  # the parent takes none
    parallel = replay(recorded, workers=2)
    assert (parallel.events, parallel.decisions_checked, parallel.mismatches) == (
        serial.events, serial.decisions_checked, serial.mismatches)


def test_a_synthetic_history_made_in_virtual_time_replays_cleanly() -> None:
    from contracts.codec import encode
    from libs.runtime.settings import DEFAULT_CLUSTER
    from libs.sim.workload import synthetic_inputs

    run = run_virtual(synthetic_inputs(DEFAULT_CLUSTER, jobs=150), tick_s=5.0)
    report = replay([(seq, encode(e)) for seq, e in run.log])
    kinds = {type(e).__name__ for _, e in run.log}
    assert {"JobPlaced", "JobFinished", "QuotaDeferred"} <= kinds
    assert report.mismatches == [] and report.decisions_checked > 500


def test_a_live_log_read_before_a_service_caught_up_is_checked_up_to_what_it_handled(recorded) -> None:
    # The log as it looks while quota has not handled its last triggers yet: their decisions are missing.
    quota = decisions_of(recorded, "quota")
    last_trigger = decode(recorded[quota[-1]][1]).trigger_seq
    trailing = [e for k, e in enumerate(recorded) if not (k in set(quota) and decode(e[1]).trigger_seq == last_trigger)]
    assert replay(trailing).mismatches  # judged as a finished log: quota "forgot" to decide
    report = replay(trailing, handled={"quota": last_trigger - 1})
    assert report.ok and report.decisions_checked > 0
    # What a service had handled is checked in full: an altered decision before that point is still caught.
    assert not replay([*trailing[:quota[0]], (recorded[quota[0]][0], b"{}"), *trailing[quota[0] + 1:]],
                      handled={"quota": last_trigger - 1}).ok
