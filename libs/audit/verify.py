"""Tamper evidence: check every decision's link in its service's hash chain, the canonical form of every
event, the order of the log, and (with the platform's audit key) the keyed checkpoints."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field

import msgspec

from contracts import AuditCheckpoint, EventBase
from contracts.codec import decode, encode
from libs.core.kernel.decider import GENESIS, chain_hash

CHAINED = ("admission", "quota", "placement", "preemption", "node-health")


def checkpoint_mac(key: bytes, service: str, head: str, decisions: int) -> str:
    return hmac.new(key, f"{service}:{head}:{decisions}".encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class BadEvent:
    seq: int
    source: str
    reason: str

    def as_json(self) -> dict[str, object]:
        return {"seq": self.seq, "source": self.source, "reason": self.reason}


@dataclass(slots=True)
class VerifyReport:
    events: int = 0
    decisions: int = 0
    checkpoints: int = 0
    heads: dict[str, str] = field(default_factory=dict)
    first_bad: BadEvent | None = None

    @property
    def ok(self) -> bool:
        return self.first_bad is None

    def as_json(self) -> dict[str, object]:
        return {"events": self.events, "decisions": self.decisions, "checkpoints_verified": self.checkpoints,
                "ok": self.ok, "first_bad": self.first_bad.as_json() if self.first_bad else None,
                "heads": self.heads}


def verify(log: list[tuple[int, bytes]], key: bytes | None = None) -> VerifyReport:
    """Walk the log once; stop at the first event that breaks a rule and say which and why."""
    report = VerifyReport()
    heads: dict[str, str] = dict.fromkeys(CHAINED, GENESIS)
    lengths: dict[str, int] = dict.fromkeys(CHAINED, 0)
    last_seq = 0
    for seq, raw in log:
        report.events += 1
        bad = _check(seq, raw, last_seq, heads, lengths, key)
        if bad is not None:
            report.first_bad = bad
            break
        last_seq = seq
    report.decisions = sum(lengths[s] for s in CHAINED)
    report.checkpoints = lengths.get("_checkpoints", 0)
    report.heads = {s: heads[s] for s in CHAINED}
    return report


def _check(seq: int, raw: bytes, last_seq: int, heads: dict[str, str], lengths: dict[str, int],
           key: bytes | None) -> BadEvent | None:
    if seq <= last_seq:
        return BadEvent(seq, "", f"out of order: sequence {seq} after {last_seq}")
    try:
        event = decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        return BadEvent(seq, "", f"not a valid event: {err}")
    if encode(event) != raw:
        return BadEvent(seq, event.source, "not in canonical form: the bytes were edited")
    if isinstance(event, AuditCheckpoint):
        return _check_checkpoint(seq, event, heads, lengths, key)
    if event.source not in heads:
        return None if not event.chain else BadEvent(seq, event.source, "a chained event from an unchained source")
    expected = chain_hash(heads[event.source], encode(msgspec.structs.replace(event, chain="")))
    if event.chain != expected:
        return BadEvent(seq, event.source,
                        f"broken chain: link {event.chain or 'missing'} does not follow {heads[event.source]} "
                        "(this decision, or one before it of the same service, was altered, removed, inserted or "
                        "moved)")
    heads[event.source] = expected
    lengths[event.source] += 1
    return None


def _check_checkpoint(seq: int, cp: AuditCheckpoint, heads: dict[str, str], lengths: dict[str, int],
                      key: bytes | None) -> BadEvent | None:
    if cp.service not in heads:
        return BadEvent(seq, cp.source, f"checkpoint for unknown service {cp.service}")
    if cp.head != heads[cp.service] or cp.decisions != lengths[cp.service]:
        return BadEvent(seq, cp.source, f"checkpoint of {cp.service} does not match the chain before it "
                                        f"({cp.decisions} decisions at {cp.head}, log has {lengths[cp.service]} "
                                        f"at {heads[cp.service]})")
    if key is not None:
        if not hmac.compare_digest(cp.mac, checkpoint_mac(key, cp.service, cp.head, cp.decisions)):
            return BadEvent(seq, cp.source, f"checkpoint of {cp.service} has a wrong signature")
        lengths["_checkpoints"] = lengths.get("_checkpoints", 0) + 1
    return None


def make_checkpoint(service: str, head: str, decisions: int, key: bytes, ts: float, event_id: str
                    ) -> EventBase:
    return AuditCheckpoint(id=event_id, ts=ts, source=f"{service}.audit", service=service, head=head,
                           decisions=decisions, mac=checkpoint_mac(key, service, head, decisions))
