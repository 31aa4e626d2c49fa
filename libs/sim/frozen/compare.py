"""A frozen run record against a fresh one: each service whose decisions differ, with the first checkpoint that
differs (the window of decisions holding the first difference), then the log's length and the inputs."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from libs.sim.frozen.digest import DECIDERS, RunRecord, ServiceRecord

NONE_DECIDED: ServiceRecord = {"count": 0, "sha256": hashlib.sha256().hexdigest(), "checkpoints": []}


@dataclass(frozen=True, slots=True)
class Difference:
    run: str
    what: str  # a service, "events" or "inputs"
    detail: str

    def __str__(self) -> str:
        return f"{self.run}: {self.what}: {self.detail}"


def first_window(frozen: list[str], fresh: list[str], every: int, most: int) -> str:
    """Where the first differing decision lies, as the checkpoints tell it; `most`: the larger count."""
    for i, (a, b) in enumerate(zip(frozen, fresh, strict=False)):
        if a != b:
            return (f"first differing checkpoint #{i + 1} of {len(frozen)} frozen: the first difference is in "
                    f"decisions {i * every + 1}-{min((i + 1) * every, most)}")
    agreed = min(len(frozen), len(fresh)) * every
    if agreed == 0:
        return f"no checkpoint to compare: the first difference is in decisions 1-{min(every, most)}"
    return f"every common checkpoint agrees: the first difference is after decision {agreed}"


def service_difference(run: str, service: str, frozen: ServiceRecord, fresh: ServiceRecord,
                       every: int) -> Difference | None:
    if frozen["count"] == fresh["count"] and frozen["sha256"] == fresh["sha256"]:
        return None
    counts = f"{frozen['count']} decisions frozen, {fresh['count']} now"
    where = first_window(frozen["checkpoints"], fresh["checkpoints"], every, max(frozen["count"], fresh["count"]))
    return Difference(run, service, f"{counts}; {where}")


def differences(run: str, frozen: RunRecord, fresh: RunRecord, every: int) -> list[Difference]:
    """Every way the fresh record differs from the frozen one: services first (in DECIDERS order), then the
    log's length, then the inputs."""
    out: list[Difference] = []
    services = [*DECIDERS, *sorted((set(frozen["decisions"]) | set(fresh["decisions"])) - set(DECIDERS))]
    for service in services:
        found = service_difference(run, service, frozen["decisions"].get(service, NONE_DECIDED),
                                   fresh["decisions"].get(service, NONE_DECIDED), every)
        if found is not None:
            out.append(found)
    if frozen["events"] != fresh["events"]:
        out.append(Difference(run, "events", f"{frozen['events']} events in the log frozen, {fresh['events']} now"))
    if frozen["inputs"] != fresh["inputs"]:
        out.append(Difference(run, "inputs", "the world's inputs differ: an input file or the sequence generator "
                                             "changed, or (in a sequence) a decision changed what came next"))
    return out
