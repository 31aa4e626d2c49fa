"""What a simulated job's user tells the platform of its runtime, apart from how long it really runs.

The simulated executor runs a job for its actual runtime (the label `sim/runtime-s`, a property of the
simulated world that no decider reads); the deciders believe only the declaration:
- `oracle`: `duration_s` is the actual runtime (an estimate that happens to be exact; for comparison only);
- `none`: nothing is declared (most users, and every job of a trace that records no limit);
- `noisy`: a limit `max_runtime_s` = runtime x a factor uniform in [1, 1 + NOISY_F], seeded per job: the
  "f-model" of user runtime estimates in the backfilling literature (Mu'alem & Feitelson, IEEE TPDS 12(6),
  2001; Tsafrir & Feitelson, "The dynamics of backfilling", IPDPS 2006, which also shows real estimates are
  modal, a few round values, so this is the kind model of them). f = 3: limits from 1x to 4x the runtime, 2.5x
  on average; never under the runtime, so no job hits its limit.

Every benchmark that runs simulated jobs says which declaration it gave the deciders.
"""

from __future__ import annotations

import random

import msgspec

from contracts import JobSpec
from libs.sim.executor import SIM_RUNTIME_S

DECLARATIONS = ("none", "oracle", "noisy")
NOISY_F = 3.0


def check_declaration(declare: str) -> str:
    """The declaration, or ValueError naming the ones there are."""
    if declare not in DECLARATIONS:
        raise ValueError(f"unknown declaration {declare!r}: use {', '.join(DECLARATIONS)}")
    return declare


def redeclared(spec: JobSpec, declare: str, seed: int, key: str) -> JobSpec:
    """A spec that declares its exact runtime (`duration_s`, as a benchmark's jobs do) as `declare` would
    instead: unchanged for `oracle` (or one that declares none), else through `declared`."""
    if check_declaration(declare) == "oracle" or spec.duration_s is None:
        return spec
    return declared(spec, spec.duration_s, declare, seed, key)


def declared(spec: JobSpec, runtime_s: float, declare: str, seed: int, key: str) -> JobSpec:
    """`spec` as a user who runs for `runtime_s` declares it (`key` seeds its noisy limit, with `seed`): the
    actual runtime goes into the simulated world's label, the declaration into `duration_s`/`max_runtime_s`."""
    duration: float | None = None
    limit: float | None = None
    if check_declaration(declare) == "oracle":
        duration = runtime_s
    elif declare == "noisy":
        factor = random.Random(f"{seed}/{key}").uniform(1.0, 1.0 + NOISY_F)
        limit = round(runtime_s * factor, 3)
    labels = {SIM_RUNTIME_S: repr(float(runtime_s)), **{k: v for k, v in spec.labels.items() if k != SIM_RUNTIME_S}}
    return msgspec.structs.replace(spec, duration_s=duration, max_runtime_s=limit, labels=labels)
