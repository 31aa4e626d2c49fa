"""What one event costs the reactor shell, step by step, measured in this process with CPU time: decoding,
encoding, a derived decision id, a labelled metric, reading a delivered message's JetStream metadata, and,
on a nats-server of its own, publishing pipelined (Bus.publish) and fetching a batch then acknowledging it
once (as a service does), with the server's CPU per message beside each.

`python -m libs.bench.throughput_costs [--json]`: a few seconds; numbers in microseconds per event."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nats.aio.msg import Msg

from contracts import EventBase, JobPlaced, ReplicaPlacement, SubmitJob
from contracts.codec import decode, encode
from libs.bench.kueue_run import proc_cpu
from libs.bench.throughput_run import ThroughputOptions, plan_step
from libs.bus.jetstream import Bus, BusConfig
from libs.core.kernel.decider import derived_id
from libs.runtime.embedded import start_nats
from libs.telemetry import metrics

BATCHES = (1, 10, 100, 500)
ROUNDS = 5


def _cpu_us(fn: Callable[[], object], n: int) -> float:
    """CPU microseconds per call of `fn`, the best of ROUNDS rounds of `n` calls (the least disturbed)."""
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, time.process_time() - start)
    return round(1e6 * best / n, 2)


def sample_events(n: int, step: int = 0) -> list[EventBase]:
    """Half the throughput bench's submissions, half their placements (an openb node, one GPU); ids (and so
    the de-duplication keys) differ from one `step` to another."""
    out: list[EventBase] = []
    for p in plan_step(step, n // 2, ThroughputOptions()):
        out.append(SubmitJob(id=derived_id("costs", "submit", p.job_id), ts=time.time(), source="costs",
                             correlation_id=p.job_id, job_id=p.job_id, spec=p.spec))
        out.append(JobPlaced(id=derived_id("placement", p.job_id, 0), ts=time.time(), source="placement",
                             trigger_seq=1234, causation_id=p.job_id, correlation_id=p.job_id, job_id=p.job_id,
                             chain="f" * 64, policy="packing",
                             placements=(ReplicaPlacement(replica=0, node="openb-node-0042", gpu_indices=(3,),
                                                          gpu_milli=p.spec.gpu_milli or 1000, model="G2"),)))
    return out


def in_process() -> dict[str, float]:
    submit, placed = sample_events(2)
    raw_submit, raw_placed = encode(submit), encode(placed)
    reply = "$JS.ACK.GPUSCHED.placement.1.123456.123400.1767225600000000000.42"
    counter = metrics.EVENTS.labels("costs", "JobPlaced")

    def metadata() -> object:
        return Msg(None, "gs.e.JobPlaced", reply, raw_placed).metadata  # type: ignore[arg-type]

    return {
        "decode SubmitJob": _cpu_us(lambda: decode(raw_submit), 20_000),
        "decode JobPlaced": _cpu_us(lambda: decode(raw_placed), 20_000),
        "encode JobPlaced": _cpu_us(lambda: encode(placed), 20_000),
        "derived id (uuid5)": _cpu_us(lambda: derived_id("placement", "job", 0), 20_000),
        "metric labels().inc()": _cpu_us(lambda: metrics.EVENTS.labels("costs", "JobPlaced").inc(), 20_000),
        "metric, child kept": _cpu_us(counter.inc, 20_000),
        "JetStream metadata of a delivery": _cpu_us(metadata, 20_000),
    }


async def on_the_bus(messages: int = 4000) -> dict[str, float]:
    """Bus.publish in batches of each size, then one service-like consumer per batch size fetching the log in
    batches of that size and acknowledging each batch once: this process's and the server's CPU per message.
    Under light load a service's batches are small, and what a batch costs once is paid for few events."""
    folder = Path(tempfile.mkdtemp(prefix="gpusched-costs-"))
    server = start_nats(folder / "nats")
    out: dict[str, float] = {}

    def server_cpu() -> float:
        return proc_cpu(server.proc.pid) or 0.0

    try:
        bus = await Bus.connect(BusConfig(url=server.url), name="costs")
        try:
            for size in BATCHES:
                events = sample_events(messages, step=size)
                own, srv = time.process_time(), server_cpu()
                for i in range(0, len(events), size):
                    await bus.publish(events[i:i + size])
                out[f"publish, batches of {size} (client / server)"] = _per(own, srv, server_cpu(), len(events))
            total = await bus.last_seq()
            for size in BATCHES:
                consumer = await bus.durable(f"costs-{size}", bus.log_subjects())
                own, srv = time.process_time(), server_cpu()
                got = 0
                while got < min(total, messages):
                    msgs = await consumer.fetch(size, timeout=2.0)
                    if not msgs:
                        break
                    for m in msgs:
                        _ = m.metadata.sequence.stream
                    await msgs[-1].ack()
                    got += len(msgs)
                out[f"fetch + one ack, batches of {size} (client / server)"] = _per(own, srv, server_cpu(), got)
        finally:
            await bus.close()
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return out


def _per(own: float, srv: float, srv_now: float, n: int) -> Any:
    """(client, server) CPU microseconds per message."""
    return (round(1e6 * (time.process_time() - own) / n, 1), round(1e6 * (srv_now - srv) / n, 1))


def measure() -> dict[str, Any]:
    return {"us_per_event": {**in_process(), **asyncio.run(on_the_bus())}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m libs.bench.throughput_costs", description=__doc__)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = measure()
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for name, us in result["us_per_event"].items():
        shown = " / ".join(f"{u:.1f}" for u in us) if isinstance(us, list | tuple) else f"{us:.2f}"
        print(f"{shown:>13} us  {name}")


if __name__ == "__main__":
    main()
