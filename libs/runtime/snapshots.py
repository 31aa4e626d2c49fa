"""Snapshots: a service's state with the log sequence it reflects, so a restart replays only the tail.

Taking one: every `every_events` handled events (or `every_s` seconds with anything new), once a batch's
acknowledgement is confirmed, the reactor calls `take`; under heavy traffic no sooner than keeps snapshots
within `MAX_SHARE` of the service's time. Encoding the state (libs/runtime/state_image.py) must see
one consistent state, so it runs there and then, between two batches; hashing and storing (chunked, in the
`<STREAM>_SNAPSHOTS` stream, libs/bus/snapshot_store.py) run in the background while the service goes on.
One write at a time: a snapshot due while the previous is still being stored waits for the next batch.

Loading one, at start: the latest snapshot is used only if
- its format is this code's (`FORMAT`) and it was made by this very code (`code_fingerprint`: the sources of
  the contracts, the deciders and the handler's state; other code could have folded the same log otherwise),
- it is this service's, of this log (stream name and creation time),
- it reflects no more than the durable consumer acknowledged (its sequence <= the ack floor; a snapshot
  ahead of the floor would skip events whose decisions may never have been published),
- its payload has the SHA-256 and size its manifest says,
- it loads, and the loaded decision chain has the head and length its manifest says.
Otherwise it is logged, counted (`gpusched_snapshots_rejected_total{reason}`) and ignored: the service
replays the whole log, as without snapshots.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib.util
import logging
import os
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import msgspec
import numpy as np

from libs.bus.jetstream import Bus
from libs.bus.snapshot_store import Manifest, SnapshotMissing, SnapshotStore, ensure_snapshot_stream, sha256_hex
from libs.core.kernel.decider import Chain
from libs.runtime import state_image
from libs.telemetry import metrics

log = logging.getLogger(__name__)

FORMAT = 1
# A snapshot after this many handled events, or this many seconds with anything handled, whichever comes first.
EVERY_EVENTS = 10_000
EVERY_S = 60.0
# At most this share of a service's time goes to snapshots: after one that took 50 ms to encode and store,
# the next comes 2.5 s later at the earliest, however many events come meanwhile (the tail to replay after a
# restart is then at most what the service handled in those seconds).
MAX_SHARE = 0.02
REPO_ROOT = Path(__file__).resolve().parents[2]
# Sources every service's state depends on, on top of the modules of its handler and state roots.
SHARED_SOURCES = ("contracts", "libs/core", "libs/runtime/state_image.py")


@runtime_checkable
class Snapshottable(Protocol):
    name: str

    def snapshot_roots(self) -> Mapping[str, object]:
        """The objects holding the handler's whole state, by name (restored in place)."""
        ...


@dataclass(frozen=True, slots=True)
class SnapshotPolicy:
    enabled: bool = True
    every_events: int = EVERY_EVENTS
    every_s: float = EVERY_S

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SnapshotPolicy:
        env = os.environ if env is None else env
        return cls(
            enabled=env.get("GPUSCHED_SNAPSHOTS", "1").strip().lower() not in ("0", "false", "no", "off"),
            every_events=int(env.get("GPUSCHED_SNAPSHOT_EVERY_EVENTS", EVERY_EVENTS)),
            every_s=float(env.get("GPUSCHED_SNAPSHOT_EVERY_S", EVERY_S)),
        )


def _module_file(name: str) -> Path | None:
    """The source of a module of this code base (None for the standard library's and the builtins)."""
    spec = importlib.util.find_spec(name)
    path = Path(spec.origin) if spec is not None and spec.origin else None
    ours = path is not None and path.suffix == ".py" and path.is_relative_to(REPO_ROOT) and ".venv" not in path.parts
    return path if ours else None


def _sources(paths: Iterable[Path]) -> list[Path]:
    out: set[Path] = set()
    for path in paths:
        out.update(path.rglob("*.py") if path.is_dir() else [path])
    return sorted(out)


@functools.lru_cache(maxsize=16)
def _fingerprint(modules: tuple[str, ...]) -> str:
    digest = hashlib.sha256(f"{sys.version_info[:2]} numpy {np.__version__} msgspec {msgspec.__version__}".encode())
    files = [REPO_ROOT / p for p in SHARED_SOURCES] + [f for m in modules if (f := _module_file(m)) is not None]
    for path in _sources(files):
        digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:32]


def code_fingerprint(handler: Snapshottable) -> str:
    """A hash of the code that makes this handler's state: a snapshot of other code is not loaded."""
    modules = {type(handler).__module__, *(type(obj).__module__ for obj in handler.snapshot_roots().values())}
    return _fingerprint(tuple(sorted(modules)))


def _chain(handler: object) -> Chain | None:
    chain = getattr(handler, "chain", None)
    return chain if isinstance(chain, Chain) else None


class Rejected(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class Snapshotter:
    def __init__(self, bus: Bus, handler: Snapshottable, policy: SnapshotPolicy | None = None) -> None:
        self.bus = bus
        self.handler = handler
        self.policy = policy or SnapshotPolicy()
        self.store = SnapshotStore(bus, handler.name)
        self.fingerprint = code_fingerprint(handler)
        self._stream_created = ""
        self._taken_seq = 0  # sequence of the last snapshot taken (or loaded)
        self._taken_at = time.monotonic()
        self._since = 0  # events handled since
        self._writing: asyncio.Task[None] | None = None
        self._cost_s = 0.0  # what the last snapshot took: encoding it, hashing and storing it
        # What the last `load` restored: the sequence (0: nothing) and how long loading took.
        self.restored_seq = 0
        self.load_s = 0.0

    async def _prepare(self) -> None:
        if not self._stream_created:
            await ensure_snapshot_stream(self.bus)
            info = await self.bus.js.stream_info(self.bus.config.stream)
            self._stream_created = info.created.isoformat() if info.created else ""

    # --- loading -------------------------------------------------------------------------------------

    async def load(self, floor: int) -> int:
        """Restore the latest usable snapshot; returns the sequence it reflects (0: none, replay it all)."""
        name = self.handler.name
        started = time.perf_counter()
        try:
            await self._prepare()
            found = await self.store.get()
        except SnapshotMissing as err:
            return self._reject("missing", str(err))
        except Exception as err:  # no store, no rights, a server away: without a snapshot, replay is right
            log.warning("%s: snapshot store unavailable (%s); replaying the log", name, err)
            return 0
        if found is None:
            log.info("%s: no snapshot yet; replaying the log", name)
            return 0
        manifest, payload = found
        try:
            self._check(manifest, payload, floor)
            self._restore(manifest, payload)
        except Rejected as err:
            return self._reject(err.reason, str(err))
        self._taken_seq, self._taken_at, self._since = manifest.seq, time.monotonic(), 0
        self.restored_seq, self.load_s = manifest.seq, time.perf_counter() - started
        metrics.SNAPSHOT_SEQ.labels(name).set(manifest.seq)
        log.info("%s: restored the snapshot at sequence %d (%d bytes, chain length %d) in %.2fs", name, manifest.seq,
                 manifest.size, manifest.chain_length, self.load_s)
        return manifest.seq

    def _check(self, m: Manifest, payload: bytes, floor: int) -> None:
        if m.format != FORMAT:
            raise Rejected("format", f"format {m.format}, this code reads {FORMAT}")
        if m.service != self.handler.name or m.stream != self.bus.config.stream:
            raise Rejected("other_log", f"made by {m.service} on {m.stream}")
        if m.stream_created != self._stream_created:
            raise Rejected("other_log", f"of a stream created {m.stream_created}, this one {self._stream_created}")
        if m.code != self.fingerprint:
            raise Rejected("code_changed", f"made by code {m.code}, this is {self.fingerprint}")
        if m.seq > floor:
            raise Rejected("ahead_of_ack_floor", f"reflects sequence {m.seq}, acknowledged only {floor}")
        if len(payload) != m.size or sha256_hex(payload) != m.sha256:
            raise Rejected("checksum", f"{len(payload)} bytes do not hash to the manifest's {m.sha256[:12]}")

    def _restore(self, m: Manifest, payload: bytes) -> None:
        roots = self.handler.snapshot_roots()
        fresh = state_image.capture(roots)  # to go back to if what loads is not what the manifest says
        try:
            state_image.restore(roots, payload)
        except Exception as err:
            state_image.restore(roots, fresh)
            raise Rejected("unreadable", f"{type(err).__name__}: {err}") from err
        chain = _chain(self.handler)
        head, length = (chain.head, chain.length) if chain is not None else ("", 0)
        if (head, length) != (m.chain_head, m.chain_length):
            state_image.restore(roots, fresh)
            raise Rejected("chain_mismatch", f"state holds chain {head[:12]}/{length}, manifest says "
                                             f"{m.chain_head[:12]}/{m.chain_length}")

    def _reject(self, reason: str, detail: str) -> int:
        metrics.SNAPSHOTS_REJECTED.labels(self.handler.name, reason).inc()
        log.warning("%s: snapshot ignored (%s); replaying the log", self.handler.name, detail)
        return 0

    # --- taking --------------------------------------------------------------------------------------

    def due(self, last_seq: int, handled: int) -> bool:
        """Count a batch of `handled` events; is a snapshot at `last_seq` due once it is acknowledged?"""
        self._since += handled
        if last_seq <= self._taken_seq or (self._writing is not None and not self._writing.done()):
            return False
        # A handler whose state runs ahead of the log (reports it made but has not stored yet) says so: a
        # snapshot then would hold what a crash could keep from ever reaching the log.
        settled = getattr(self.handler, "snapshot_settled", None)
        if settled is not None and not settled():
            return False
        waited = time.monotonic() - self._taken_at
        if waited >= self.policy.every_s:
            return True
        # Under heavy traffic the events come fast: a snapshot no sooner than its cost allows.
        return self._since >= self.policy.every_events and waited * MAX_SHARE >= self._cost_s

    def take(self, last_seq: int) -> None:
        """Encode the state now (it reflects `last_seq`); store it in the background."""
        started = time.perf_counter()
        image = state_image.capture(self.handler.snapshot_roots())
        chain = _chain(self.handler)
        self._cost_s = time.perf_counter() - started
        metrics.SNAPSHOT_SECONDS.labels(self.handler.name).set(self._cost_s)
        self._taken_seq, self._taken_at, self._since = last_seq, time.monotonic(), 0
        head, length = (chain.head, chain.length) if chain is not None else ("", 0)
        self._writing = asyncio.create_task(self._store(last_seq, head, length, image), name="snapshot")

    async def _store(self, seq: int, head: str, length: int, image: bytes) -> None:
        name = self.handler.name
        started = time.perf_counter()
        try:
            await self._prepare()
            digest = await asyncio.to_thread(sha256_hex, image)  # hashlib lets go of the GIL on large inputs
            manifest = Manifest(format=FORMAT, service=name, stream=self.bus.config.stream,
                                stream_created=self._stream_created, seq=seq, chain_head=head, chain_length=length,
                                code=self.fingerprint, sha256=digest, size=len(image), taken_at=time.time())
            await self.store.put(manifest, image)
        except Exception as err:  # the next one will try again; replay covers the gap meanwhile
            metrics.SNAPSHOTS_FAILED.labels(name).inc()
            log.warning("%s: could not store the snapshot at sequence %d: %s", name, seq, err)
            return
        self._cost_s += time.perf_counter() - started
        metrics.SNAPSHOTS_TAKEN.labels(name).inc()
        metrics.SNAPSHOT_SEQ.labels(name).set(seq)
        metrics.SNAPSHOT_BYTES.labels(name).set(len(image))
        log.debug("%s: snapshot at sequence %d stored (%d bytes)", name, seq, len(image))

    async def flush(self) -> None:
        """Wait for the snapshot being stored, if any."""
        if self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)

    async def close(self) -> None:
        await self.flush()
        await self.store.close()
