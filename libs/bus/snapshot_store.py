"""Where services keep their snapshots: a stream of its own next to the log, `<STREAM>_SNAPSHOTS`.

Per service, a snapshot is chunks on one of two slot subjects (`<prefix>.snap.<service>.a` / `.b`) and a
manifest on `<prefix>.snap.<service>.manifest` that names the slot, every chunk's sequence and the
payload's SHA-256. A new snapshot goes to the slot the current manifest does not use (its first chunk rolls
the slot up, dropping what it held), then its manifest rolls up the previous one: the current snapshot
stays whole until the manifest of the next is stored, so a crash while writing leaves the previous one
usable. The manifest is written only if the previous manifest is still the one the writer saw (expected
last subject sequence), so of two writers racing, one wins and the other's chunks are never referenced.

A JetStream object store would do the chunking too, but nats-py reads an object by concatenating bytes
chunk by chunk (quadratic in its size) and cleans up by purging the stream; this layout reads the chunks
in parallel, by sequence, and needs only publish rights on the service's own subjects.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging

import msgspec
import nats.js.errors
from nats.errors import NoRespondersError
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StoreCompression, StreamConfig
from nats.js.errors import NotFoundError

from libs.bus.jetstream import Bus
from libs.bus.pipelined import PipelinedPublisher

log = logging.getLogger(__name__)

# Below the server's default 1 MiB message limit, headers included.
CHUNK_BYTES = 512 * 1024
SLOTS = ("a", "b")
# How many chunks are asked for at once when reading.
READ_WINDOW = 32


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """What a snapshot is: written after its chunks, read before them."""

    format: int  # the snapshot format (libs/runtime/snapshots.py), not this layout's
    service: str
    stream: str  # the log it reflects
    stream_created: str  # when that stream was created: a log deleted and made again is another log
    seq: int  # the last log sequence folded into the state
    chain_head: str
    chain_length: int
    code: str  # fingerprint of the code that made the state (libs/runtime/snapshots.py)
    sha256: str  # of the payload
    size: int
    slot: str = ""
    chunks: tuple[int, ...] = ()  # stream sequences of the payload's chunks, in order
    taken_at: float = 0.0  # wall clock, for operators only


class SnapshotMissing(Exception):
    """The manifest names chunks the store no longer holds, or holds otherwise."""


def snapshot_stream_name(stream: str) -> str:
    return f"{stream}_SNAPSHOTS"


def snapshot_stream(bus: Bus) -> str:
    return snapshot_stream_name(bus.config.stream)


def snapshot_subjects(prefix: str, service: str) -> list[str]:
    """Everything one service writes in the snapshot stream (its NATS permissions grant exactly these)."""
    return [f"{prefix}.snap.{service}.manifest", *(f"{prefix}.snap.{service}.{slot}" for slot in SLOTS)]


def snapshot_stream_config(bus: Bus) -> StreamConfig:
    return StreamConfig(
        name=snapshot_stream(bus), subjects=[f"{bus.config.subject_prefix}.snap.>"],
        retention=RetentionPolicy.LIMITS, storage=StorageType.FILE, discard=DiscardPolicy.OLD,
        allow_rollup_hdrs=True, allow_direct=True, compression=StoreCompression.S2,
        num_replicas=bus.config.replicas,
    )


async def ensure_snapshot_stream(bus: Bus) -> None:
    """Create the snapshot stream if missing (idempotent; `gpusched nats-setup` calls it as the operator)."""
    cfg = snapshot_stream_config(bus)
    try:
        await bus.js.stream_info(cfg.name or "")
    except NotFoundError:
        try:
            await bus.js.add_stream(cfg)
        except nats.js.errors.BadRequestError as err:
            if "already in use" not in str(err):
                raise


class SnapshotStore:
    def __init__(self, bus: Bus, service: str) -> None:
        self.bus = bus
        self.service = service
        self.stream = snapshot_stream(bus)
        prefix = bus.config.subject_prefix
        self.manifest_subject, *slots = snapshot_subjects(prefix, service)
        self.slot_subjects = dict(zip(SLOTS, slots, strict=True))
        self._publisher = PipelinedPublisher(bus.nc)

    async def manifest(self) -> tuple[Manifest, int] | None:
        """The current manifest and its sequence in the snapshot stream; None when there is none."""
        try:
            msg = await self.bus.js.get_msg(self.stream, subject=self.manifest_subject, direct=True)
        except (NotFoundError, NoRespondersError):  # no such snapshot, or no snapshot stream yet
            return None
        return msgspec.json.decode(msg.data or b"", type=Manifest), int(msg.seq or 0)

    async def put(self, manifest: Manifest, payload: bytes) -> Manifest:
        """Store a snapshot; returns its manifest as stored (slot and chunks filled in)."""
        current = await self.manifest()
        slot = SLOTS[1] if current is not None and current[0].slot == SLOTS[0] else SLOTS[0]
        subject = self.slot_subjects[slot]
        view = memoryview(payload)
        parts = [bytes(view[i:i + CHUNK_BYTES]) for i in range(0, len(payload), CHUNK_BYTES)] or [b""]
        # The first chunk empties the slot of the snapshot before the current one.
        acks = await self._publisher.publish([(subject, part, {"Nats-Rollup": "sub"} if i == 0 else None)
                                              for i, part in enumerate(parts)])
        stored = msgspec.structs.replace(manifest, slot=slot, chunks=tuple(a.seq for a in acks))
        expected = str(current[1]) if current is not None else "0"
        await self._publisher.publish([(self.manifest_subject, msgspec.json.encode(stored),
                                        {"Nats-Rollup": "sub", "Nats-Expected-Last-Subject-Sequence": expected})])
        return stored

    async def get(self) -> tuple[Manifest, bytes] | None:
        """The current snapshot: its manifest and payload (checked against neither; the caller verifies)."""
        found = await self.manifest()
        if found is None:
            return None
        manifest = found[0]
        subject = self.slot_subjects.get(manifest.slot)
        if subject is None:
            raise SnapshotMissing(f"unknown slot {manifest.slot!r}")
        parts: list[bytes] = []
        for i in range(0, len(manifest.chunks), READ_WINDOW):
            window = manifest.chunks[i:i + READ_WINDOW]
            try:
                msgs = await asyncio.gather(*(self.bus.js.get_msg(self.stream, seq=seq, direct=True)
                                              for seq in window))
            except NotFoundError as err:
                raise SnapshotMissing("a chunk is gone") from err
            for seq, msg in zip(window, msgs, strict=True):
                if msg.subject != subject or int(msg.seq or 0) != seq:
                    raise SnapshotMissing(f"chunk {seq} is not on {subject}")
                parts.append(msg.data or b"")
        return manifest, b"".join(parts)

    async def close(self) -> None:
        await self._publisher.close()


def sha256_hex(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()
