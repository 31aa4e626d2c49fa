"""Idempotency keys: one key of a team names one submission, whichever way it arrives.

A producer that retries a submission (a lost answer, a restart) sends the same key and the same spec: it gets
the job the first attempt made. The same key with another spec is a mistake (a key reused for a new job, or a
retry that changed its mind): it is refused with `idempotency_key_reused`, naming the fields that differ, and
the job that holds the key is left as it is. Silently answering with the old job would run something other
than what the caller now asks for.

Over HTTP the job id is derived from team and key, so a key's job has one id. Over the bus the producer
chooses the id: the book also remembers which job holds each (team, key), so that a keyed submission under
another id is recognised too.

The book keeps a fingerprint of each keyed job's spec rather than the spec itself: the jobs of a long-lived
platform are many, and the decider's live specs (or the read model, for the API) still name what differs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Container
from dataclasses import dataclass, field

import msgspec

from contracts import JobSpec
from libs.core.admission.rejection import Rejection
from libs.core.kernel.decider import derived_id

KEY_REUSED = "idempotency_key_reused"
_FIELDS = tuple(f.name for f in msgspec.structs.fields(JobSpec))
_VALUE_CHARS = 40  # a differing value is shown up to this long (commands and labels can be long)


# Each field's default value: a field equal to it is left out of the fingerprint, however it was written.
_DEFAULTS = {f.name: f.default if f.default is not msgspec.NODEFAULT else
             f.default_factory() if f.default_factory is not msgspec.NODEFAULT else msgspec.NODEFAULT
             for f in msgspec.structs.fields(JobSpec)}


def job_id_for_key(team: str, idempotency_key: str) -> str:
    """Same team and key, same job id: a retried submission is recognised, never duplicated. The team's length
    goes first, so that no other team and key join into the same name ("ml/nlp" + "k" is not "ml" + "nlp/k")."""
    return derived_id("job", len(team), team, idempotency_key)


def spec_fingerprint(spec: JobSpec) -> str:
    """Equal for equal specs however they were built: a field equal to its default counts as absent (a job
    file that writes `priority: training` out is the spec that leaves it out), values are compared in their
    wire form (5 and 5.0 are one duration) and labels in any order are the same labels."""
    wire = msgspec.json.decode(msgspec.json.encode(spec), type=JobSpec)  # 5 becomes the 5.0 a float field holds
    fields = {name: msgspec.to_builtins(value) for name in _FIELDS
              if (value := getattr(wire, name)) != _DEFAULTS[name]}
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(canonical.encode(), digest_size=16).hexdigest()


def spec_differences(stored: JobSpec, sent: JobSpec) -> list[str]:
    """The fields whose values differ, in the order JobSpec declares them."""
    return [name for name in _FIELDS if getattr(stored, name) != getattr(sent, name)]


def _shown(value: object) -> str:
    text = json.dumps(msgspec.to_builtins(value), sort_keys=True, separators=(",", ":"))
    return text if len(text) <= _VALUE_CHARS else text[:_VALUE_CHARS - 1] + "…"


def describe_differences(stored: JobSpec, sent: JobSpec) -> str:
    """`gpus (stored 1, sent 2), duration_s (stored 60.0, sent 90.0)`."""
    return ", ".join(f"{name} (stored {_shown(getattr(stored, name))}, sent {_shown(getattr(sent, name))})"
                     for name in spec_differences(stored, sent))


@dataclass(frozen=True, slots=True)
class Resubmission:
    """A submission for a job id or key already taken: `job_id` holds it; `same`: with the same spec."""

    job_id: str
    same: bool


def key_reused(again: Resubmission, stored: JobSpec | None, sent: JobSpec) -> Rejection:
    """The refusal of a submission whose key (or job id) another spec holds, or whose key another job id holds."""
    key = f"idempotency key {sent.idempotency_key!r} of team {sent.team!r}"
    if again.same:
        return Rejection(KEY_REUSED, f"{key} belongs to job {again.job_id}, submitted with this same spec: that "
                         "job is this submission (follow it, or use a new key for a new job)")
    if stored is None:
        what = "another spec (the job is over; its record in the log holds the spec)"
    else:
        what = f"another spec; fields that differ: {describe_differences(stored, sent) or 'none'}"
    return Rejection(KEY_REUSED, f"{key} was used for job {again.job_id} with {what}. That job is unchanged; "
                     "submit a new job with a new key")


def refused_id(job_id: str, spec: JobSpec) -> str:
    """The id under which a refused resubmission of `job_id` is recorded as rejected: the job that holds the id
    must not be touched, and the same refused spec always gets the same record."""
    return derived_id("job", job_id, "refused", spec_fingerprint(spec))


@dataclass(slots=True)
class KeyBook:
    """Which job holds each (team, key), and the fingerprint of each keyed job's spec; folded from JobSubmitted
    and JobRejected (a rejected job holds its key too: its outcome is the answer to a retry)."""

    holders: dict[tuple[str, str], str] = field(default_factory=dict)
    fingerprints: dict[str, str] = field(default_factory=dict)

    def decided(self, job_id: str, spec: JobSpec, holds: bool = True) -> None:
        """`holds`: the decision made a job of this key (a refusal of a reused key did not: it holds nothing,
        or the key's first real submission would be answered with that refusal)."""
        if not spec.idempotency_key:
            return
        self.fingerprints[job_id] = spec_fingerprint(spec)
        if holds:
            self.holders.setdefault((spec.team, spec.idempotency_key), job_id)  # the first job keeps its key

    def resubmission(self, job_id: str, spec: JobSpec, known: Container[str]) -> Resubmission | None:
        """For a keyed spec: the job that already holds its id (`known`: the ids decided) or its key, and whether
        that job's spec is this one; None for a new submission, or one without a key (those are de-duplicated by
        job id alone, the first outcome standing)."""
        if not spec.idempotency_key:
            return None
        holder = job_id if job_id in known else self.holders.get((spec.team, spec.idempotency_key))
        if holder is None:
            return None
        return Resubmission(holder, self.fingerprints.get(holder) == spec_fingerprint(spec))
