"""The reactor shell on a real JetStream server: batches, dead letters, restart and redelivery."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from contracts import GpuSpec, JobSpec, NodeRegistered, NodeSpec, QueuePolicyChanged, QueueSpec, SubmitJob
from contracts.codec import decode, encode
from libs.audit.log_reader import read_log
from libs.bus.consumer import REST_WAIT_S
from libs.bus.jetstream import Bus
from libs.core.admission.decider import AdmissionDecider
from libs.runtime.handler import DeciderHandler
from libs.runtime.reactor import Reactor


def setup_events() -> list:
    return [
        QueuePolicyChanged(id="q1", ts=1.0, source="operator", queue=QueueSpec(name="q", team="t", nominal_gpus=8),
                           version=1),
        NodeRegistered(id="n1", ts=1.0, source="node-telemetry",
                       node=NodeSpec(name="n1", gpus=tuple(GpuSpec(index=i, model="A100") for i in range(8)))),
    ]


def submit(i: int, gpus: int = 1) -> SubmitJob:
    return SubmitJob(id=f"s{i}", ts=2.0 + i, source="api", job_id=f"job-{i}",
                     spec=JobSpec(team="t", queue="q", gpus=gpus))


async def drain(reactor: Reactor, rounds: int = 3) -> None:
    for _ in range(rounds):
        await reactor.step()


async def log_of(bus: Bus) -> list[tuple[int, object]]:
    out: list[tuple[int, object]] = []
    for seq, raw in await read_log(bus):
        try:
            out.append((seq, decode(raw)))
        except msgspec.MsgspecError:
            out.append((seq, None))  # the poison messages stay in the log
    return out


async def test_a_batch_of_submissions_is_decided_and_published_once(bus: Bus) -> None:
    await bus.publish(setup_events() + [submit(i) for i in range(5)])
    reactor = Reactor(bus, DeciderHandler(AdmissionDecider()))
    await reactor.start()
    await drain(reactor)
    kinds = [type(e).__name__ for _, e in await log_of(bus)]
    assert kinds.count("JobSubmitted") == 5
    assert kinds.count("JobAdmitted") == 5


async def test_malformed_unknown_and_mislabelled_messages_go_to_the_dead_letter_stream(bus: Bus) -> None:
    await bus.publish(setup_events())
    subject = bus.subject_for_type(SubmitJob)
    await bus.js.publish(subject, b"{not json")
    await bus.js.publish(subject, b'{"type":"Bogus","id":"x","ts":1,"source":"y"}')
    await bus.js.publish(subject, encode(setup_events()[0]))  # a policy event on a command subject
    await bus.js.publish(subject, b'{"type":"SubmitJob","id":"x","ts":1,"source":"y","job_id":"j"}')
    await bus.publish([submit(1)])
    reactor = Reactor(bus, DeciderHandler(AdmissionDecider()))
    await reactor.start()
    await drain(reactor)

    dlq = await bus.js.pull_subscribe("", stream=bus.config.dlq_stream,
                                      config=ConsumerConfig(ack_policy=AckPolicy.NONE))
    dead = await dlq.fetch(10, timeout=2.0)
    reasons = [m.headers["Gpusched-Reason"].split(":")[0] for m in dead]
    assert reasons == ["malformed", "invalid", "type_mismatch", "invalid"]
    assert all(m.headers["Gpusched-Service"] == "admission" for m in dead)
    assert dead[0].data == b"{not json"  # the original payload is kept
    kinds = [type(e).__name__ for _, e in await log_of(bus)]
    assert kinds.count("JobAdmitted") == 1  # the consumer kept going past the poison


async def test_a_restarted_reactor_catches_up_without_republishing_and_continues(bus: Bus) -> None:
    await bus.publish(setup_events() + [submit(i) for i in range(3)])
    first = Reactor(bus, DeciderHandler(AdmissionDecider()))
    await first.start()
    await drain(first)
    before = await bus.last_seq()

    decider = AdmissionDecider()
    second = Reactor(bus, DeciderHandler(decider))
    await second.start()
    assert second.last_seq >= 5
    assert set(decider.state.jobs) == {"job-0", "job-1", "job-2"}  # state rebuilt from the log
    await drain(second, rounds=1)
    assert await bus.last_seq() == before  # nothing re-published

    await bus.publish([submit(3)])
    await drain(second)
    kinds = [type(e).__name__ for _, e in await log_of(bus)]
    assert kinds.count("JobAdmitted") == 4


async def test_redelivered_messages_are_skipped_and_re_derived_decisions_are_deduplicated(bus: Bus) -> None:
    await bus.publish([*setup_events(), submit(1)])
    reactor = Reactor(bus, DeciderHandler(AdmissionDecider()))
    await reactor.start()
    assert reactor._consumer is not None
    msgs = await reactor._consumer.fetch(10, timeout=1.0)
    await reactor.process(msgs)
    await reactor.process(msgs)  # as if the ack had been lost and the batch came again
    # A crashed process that re-derives the same decision publishes the same id: the server drops it.
    replayed = Reactor(bus, DeciderHandler(AdmissionDecider()), durable="other")
    await replayed.start()
    await drain(replayed)
    kinds = [type(e).__name__ for _, e in await log_of(bus)]
    assert kinds.count("JobSubmitted") == 1


async def test_the_log_is_append_only(bus: Bus) -> None:
    await bus.publish(setup_events())
    with pytest.raises(Exception, match=r"(?i)purge|not allowed|denied"):
        await bus.js.purge_stream(bus.config.stream)
    with pytest.raises(Exception, match=r"(?i)delete|not allowed|denied"):
        await bus.js.delete_msg(bus.config.stream, 1)


async def test_stream_setup_is_idempotent(bus: Bus) -> None:
    await bus.ensure_streams()
    await bus.ensure_streams()
    info = await bus.js.stream_info(bus.config.stream)
    assert info.config.deny_delete and info.config.deny_purge
    assert sorted(info.config.subjects or []) == sorted(bus.log_subjects())


def test_decisions_round_trip_through_the_codec() -> None:
    e = submit(1)
    assert decode(encode(e)) == e
    assert msgspec.json.decode(encode(e))["type"] == "SubmitJob"
    asyncio.get_event_loop_policy()  # keeps the module importable without a running loop


async def test_events_delivered_to_a_crashed_process_are_handled_first_and_in_order_after_restart(bus: Bus) -> None:
    await bus.publish([*setup_events(), submit(1)])
    crashed = Reactor(bus, DeciderHandler(AdmissionDecider()))
    await crashed.start()
    assert crashed._consumer is not None
    lost = await crashed._consumer.fetch(10, timeout=1.0)  # delivered, then the process "dies"
    assert len(lost) == 3
    await bus.publish([submit(2)])

    decider = AdmissionDecider()
    restarted = Reactor(bus, DeciderHandler(decider))
    await restarted.start()
    await drain(restarted)
    admitted = [e.job_id for _, e in await log_of(bus) if type(e).__name__ == "JobAdmitted"]
    assert admitted == ["job-1", "job-2"]


async def test_a_longer_rest_wait_gathers_what_comes_within_it_into_one_batch(bus: Bus) -> None:
    subjects = [bus.subject_for_type(SubmitJob)]

    async def batches(durable: str, wait: float | None, first: SubmitJob, second: SubmitJob) -> list[list[str]]:
        consumer = await bus.durable(durable, subjects, start_seq=await bus.last_seq() + 1, rest_wait_s=wait)
        assert consumer.rest_wait_s == (REST_WAIT_S if wait is None else wait)
        await bus.publish([first])

        async def later() -> None:
            await asyncio.sleep(0.3)
            await bus.publish([second])

        task = asyncio.create_task(later())
        out: list[list[str]] = []
        for _ in range(5):
            out += [[decode(m.data).id for m in await consumer.fetch(10, timeout=2.0)]]
            if sum(map(len, out)) == 2:
                break
        await task
        await consumer.close()
        return out

    # 5 ms: the second comes too late for the first's batch; 1 s: within the wait, in the same batch.
    assert await batches("short", None, submit(1), submit(2)) == [["s1"], ["s2"]]
    assert await batches("long", 1.0, submit(3), submit(4)) == [["s3", "s4"]]


async def test_a_hole_inside_a_batch_is_never_acknowledged_unseen(bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    await bus.publish([*setup_events(), submit(1), submit(2)])
    reactor = Reactor(bus, DeciderHandler(AdmissionDecider()), batch_wait_s=0.02)
    await reactor.start()
    consumer = reactor._consumer
    assert consumer is not None and consumer.rest_wait_s == 0.02
    fetch = consumer.fetch

    async def losing_one(batch: int, timeout: float) -> list:
        msgs = await fetch(batch, timeout)
        return [m for m in msgs if decode(m.data).id != "s1"]  # delivered, lost before the reactor saw it

    monkeypatch.setattr(consumer, "fetch", losing_one)
    assert await reactor.step() == 0  # the batch starts where it should, but has a hole: read again
    assert reactor._consumer is not consumer and reactor._consumer.rest_wait_s == 0.02
    await drain(reactor)
    admitted = [e.job_id for _, e in await log_of(bus) if type(e).__name__ == "JobAdmitted"]
    assert admitted == ["job-1", "job-2"]
