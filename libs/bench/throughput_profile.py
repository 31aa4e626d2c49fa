"""Where each service's CPU goes during a throughput step: py-spy samples every service process (without
pausing it) and writes collapsed stacks; the summary names the functions that were on CPU most, by their
own time (the leaf of a stack) and with their callees (anywhere in it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libs.runtime.embedded import EmbeddedServer
from libs.runtime.supervisor import Supervisor

RATE_HZ = 100
TOP = 15
Activities = tuple[tuple[str, tuple[str, ...]], ...]
# Work that is one activity whatever it calls (the metrics a GPU sample sets are part of the sampling).
UMBRELLAS: Activities = (
    ("GPU samples", ("sample_forever (",)),
    ("snapshot", ("(libs/runtime/state_image.py)", "(libs/runtime/snapshots.py)", "(libs/bus/snapshot_store.py)")),
)
# Otherwise, what a service is doing, by the innermost frame of a stack that names it (first match in this
# order wins at that frame). "event loop" is uvloop's own C code, where Python's stack ends at Runner.run.
ACTIVITIES: Activities = (
    ("metrics", ("(prometheus_client/", "Projector._gpu_gauges", "Projector._usage_metrics",
                 "Projector._service_metrics")),
    ("decode", ("decode (contracts/codec.py)",)),
    ("encode", ("encode (contracts/codec.py)",)),
    ("ack", ("Msg.ack",)),
    ("views (Redis)", ("after_batch (libs/views/projector",)),
    # The client's flusher writes whatever is pending to the socket: decisions, acks and fetch requests.
    ("socket writes", ("_flusher (nats/",)),
    ("publish", ("Bus.publish", "Bus._publish", "publish_async (nats/", "Bus.dead_letter")),
    ("receive", ("Consumer.fetch", "(nats/protocol/parser.py)", "_process_msg (nats/", "_from_reply (nats/",
                 "(nats/aio/subscription.py)", "_handle_async_reply (nats/", "_read_loop (nats/")),
    ("decide", ("on_event (",)),
    ("HTTP", ("(aiohttp/",)),
)


def py_spy() -> str:
    """The py-spy next to this interpreter, else one on PATH."""
    candidate = Path(sys.executable).parent / "py-spy"
    found = str(candidate) if candidate.exists() else shutil.which("py-spy")
    if found is None:
        raise FileNotFoundError("py-spy not found: .venv/bin/pip install -e \".[profile]\"")
    return found


@dataclass
class Profiler:
    out_dir: Path
    procs: dict[str, subprocess.Popen[bytes]]

    @classmethod
    def start(cls, sup: Supervisor, servers: list[EmbeddedServer], out_dir: Path, duration_s: float) -> Profiler:
        """Sample every service for `duration_s` (the Go NATS server and Redis are left to their CPU time)."""
        binary = py_spy()
        out_dir.mkdir(parents=True, exist_ok=True)
        procs = {}
        for name, child in sup.children.items():
            if child.proc is None:
                continue
            # --gil: only samples holding the GIL, i.e. running Python or uvloop's C, not waiting for the
            # network (an idle thread is not told apart otherwise).
            argv = [binary, "record", "--pid", str(child.proc.pid), "--duration", str(max(1, round(duration_s))),
                    "--rate", str(RATE_HZ), "--nonblocking", "--gil", "--nolineno", "--format", "raw",
                    "--output", str(out_dir / f"{name}.collapsed")]
            with open(out_dir / f"{name}.py-spy.log", "wb") as log:
                procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        return cls(out_dir, procs)

    def finish(self, timeout_s: float = 30.0) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.terminate()
                proc.wait()
            path = self.out_dir / f"{name}.collapsed"
            out[name] = summarise(path.read_text()) if path.exists() else {"error": f"see {name}.py-spy.log"}
        return out


def summarise(collapsed: str, top: int = TOP) -> dict[str, Any]:
    """From py-spy's collapsed stacks ("outer;...;inner count" per line): samples, and the `top` functions
    by own time and by time with their callees, in % of the samples."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    doing: Counter[str] = Counter()
    samples = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f.strip() for f in stack.split(";")]
        frames = [f for f in frames if not f.startswith("process ") and not f.startswith("thread ")]
        if not frames:
            continue
        samples += n
        own[frames[-1]] += n
        for f in set(frames):
            total[f] += n
        doing[activity(frames)] += n

    def pct(c: Counter[str]) -> list[tuple[str, float]]:
        return [(f, round(100 * n / samples, 1)) for f, n in c.most_common(top)]

    if not samples:
        return {"samples": 0}
    return {"samples": samples, "activity_pct": dict(pct(doing)), "self_pct": pct(own), "total_pct": pct(total)}


def activity(frames: list[str]) -> str:
    """The umbrella activity a stack is part of, else the activity of the innermost frame that names one;
    "event loop" for a stack ending in the loop."""
    for name, markers in UMBRELLAS:
        if any(m in frame for frame in frames for m in markers):
            return name
    for frame in reversed(frames):
        for name, markers in ACTIVITIES:
            if any(m in frame for m in markers):
                return name
    return "event loop" if frames[-1].startswith("Runner.run ") else "other"
