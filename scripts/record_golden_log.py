"""Record tests/golden/demo-log.jsonl (and its audit key) from a real run of the six services on the demo
policy and cluster. Run it again when a decision rule changes on purpose:

    .venv/bin/python scripts/record_golden_log.py

The workload exercises borrowing within the demo cohort, a per-user limit, within-queue preemption and
reclaim of lent quota, so the golden log keeps every decider honest on replay.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

from libs.audit.log_reader import read_log
from libs.bus.jetstream import Bus, BusConfig
from libs.cli.client import Client
from libs.runtime.embedded import free_port
from libs.runtime.platform import start_platform
from libs.runtime.settings import DEFAULT_CLUSTER, DEFAULT_POLICY

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "golden"
FINAL = {"succeeded", "failed", "cancelled", "rejected"}

WORKLOAD: list[tuple[float, dict[str, object]]] = [
    # demo borrows beyond its 16 GPUs from the idle cohort
    (0.0, {"team": "demo", "queue": "demo", "gpus": 8, "priority": "batch", "duration_s": 20.0, "user": "ana"}),
    (0.0, {"team": "demo", "queue": "demo", "gpus": 8, "priority": "batch", "duration_s": 20.0, "user": "ana"}),
    (0.0, {"team": "demo", "queue": "demo", "gpus": 8, "priority": "batch", "duration_s": 20.0, "user": "bo",
            "checkpoint_interval_s": 5.0}),
    (0.0, {"team": "demo", "queue": "demo", "gpus": 4, "priority": "batch", "duration_s": 20.0, "user": "bo"}),
    # research: one user over the per-user limit waits while another user's job goes
    (1.0, {"team": "research", "queue": "research", "gpus": 8, "duration_s": 4.0, "user": "cy"}),
    (1.0, {"team": "research", "queue": "research", "gpus": 2, "duration_s": 4.0, "user": "cy"}),
    (1.0, {"team": "research", "queue": "research", "gpus": 4, "duration_s": 4.0, "user": "di"}),
    # product wants its guaranteed quota back from the borrowers: reclaim
    (2.0, {"team": "product", "queue": "product", "gpus": 8, "priority": "urgent", "duration_s": 3.0}),
    # within-queue preemption: an urgent demo job displaces demo's own batch work
    (3.0, {"team": "demo", "queue": "demo", "gpus": 8, "priority": "urgent", "duration_s": 3.0, "user": "ana"}),
    (3.5, {"team": "platform", "queue": "platform", "gpu_milli": 500, "gpus": 1, "duration_s": 2.0}),
    (3.5, {"team": "platform", "queue": "platform", "gpus": 2, "replicas": 2, "duration_s": 2.0}),
    (4.0, {"team": "product", "queue": "product", "gpus": 1, "priority": "batch", "duration_s": 2.0}),
    (4.0, {"team": "product", "queue": "product", "gpus": 1, "priority": "batch", "duration_s": 2.0}),
    (4.5, {"team": "platform", "queue": "platform", "gpu_milli": 250, "gpus": 1, "duration_s": 1.0}),
    (5.0, {"team": "research", "queue": "research", "gpus": 1, "priority": "experiment", "duration_s": 1.0}),
]


async def export(nats_url: str) -> list[tuple[int, bytes]]:
    bus = await Bus.connect(BusConfig(url=nats_url))
    try:
        return await read_log(bus)
    finally:
        await bus.close()


def main() -> None:
    data = Path(tempfile.mkdtemp(prefix="gpusched-golden-"))
    try:
        sup, servers, env = start_platform(data, DEFAULT_CLUSTER, DEFAULT_POLICY, free_port(), own_servers=True,
                                           extra_env={"GPUSCHED_AUDIT_EVERY": "8", "GPUSCHED_TICK_SECONDS": "1"})
        try:
            client = Client(f"http://127.0.0.1:{sup.ports['admission']}")
            while len(client.nodes()) < 9:
                time.sleep(0.2)
            ids, started = [], time.time()
            for at, spec in WORKLOAD:
                time.sleep(max(0.0, started + at - time.time()))
                ids.append(client.submit(spec)["id"])
            deadline = time.time() + 120
            while time.time() < deadline:
                states = [client.job(i)["state"] for i in ids]
                print("states:", " ".join(states), flush=True)
                if all(s in FINAL for s in states):
                    break
                time.sleep(1.0)
            time.sleep(2.0)  # let the last releases and checkpoints land
            log = asyncio.run(export(env["NATS_URL"]))
        finally:
            sup.stop()
            for s in servers:
                s.stop()
        lines = [b'{"seq":%d,"event":%s}' % (seq, raw) for seq, raw in log]
        (GOLDEN / "demo-log.jsonl").write_bytes(b"\n".join(lines) + b"\n")
        shutil.copy(env["GPUSCHED_AUDIT_KEY_FILE"], GOLDEN / "demo-audit.key")
        kinds = [raw.split(b'"type":"', 1)[1].split(b'"', 1)[0].decode() for _, raw in log]
        print(f"recorded {len(log)} events:", {k: kinds.count(k) for k in sorted(set(kinds))})
    finally:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
