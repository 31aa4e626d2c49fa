"""The named sets of runs the frozen net records: each run a way to make a log through the deciders in virtual
time, made only when asked (a check may want one run of a set).

- scenarios: every file in tests/scenarios/, run as `gpusched sim scenario` runs it;
- sequences: seeded world sequences of the stateful pipeline test's kinds of steps (sequences.py);
- node-health: seeded sequences with node health deciding too (node_health.py);
- kueue: Kueue's generator format in virtual time (`gpusched bench kueue-baseline --virtual --generator ...`) on
  this checkout's own contention case (libs/bench/generators/mixed-priorities.yaml: three priorities and sizes,
  borrowing and reclaim), once as the benchmark shapes jobs and once shaped on nodes with no runtime declared
  (fragmentation and preemption);
- philly: three days of the Philly trace at a tenth of Helios's nodes (`gpusched sim trace`), shared quota with
  reclaim, with least attained service, and with noisy runtime declarations.

The Philly slice reads the reference data next to the checkout (../shared/data), in place, as the benchmarks
do: the trace is never copied into the checkout."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from libs.bench.kueue_virtual import scenario_inputs as kueue_inputs
from libs.paths import REPO_ROOT
from libs.sim.frozen.digest import Log
from libs.sim.frozen.node_health import run_node_health_sequence
from libs.sim.frozen.sequences import run_sequence
from libs.sim.pipeline import run_virtual
from libs.sim.scenario import run_inputs, scenario_end, scenario_inputs
from libs.sim.scenario_model import load_scenario
from libs.sim.trace_model import parse_time, read_teams, read_trace
from libs.sim.trace_outcome import TraceJob
from libs.sim.trace_run import TRACE_TICK_S, horizon_s, parse_setups, world_inputs

SCENARIOS = REPO_ROOT / "tests" / "scenarios"
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
KUEUE_GENERATOR = REPO_ROOT / "libs" / "bench" / "generators" / "mixed-priorities.yaml"
PHILLY = SHARED_DATA / "philly"
CHECKPOINT_EVERY = 50
SEQUENCES = 100
NODE_HEALTH_SEQUENCES = 30
# run id -> (scale, GPUs per replica (0: shaped on 8-GPU nodes), runtime declaration)
KUEUE_RUNS = {"as-benchmarked": (1.0, 1, "oracle"), "node-shaped-undeclared": (1.0, 0, "none")}
KUEUE_TICK_S = 1.0  # the benchmark's
PHILLY_WINDOW = ("2017-10-01", "2017-10-04")
PHILLY_SCALE = 0.1
# run id -> (set-up, runtime declaration)
PHILLY_RUNS = {"shared": ("shared", "none"), "shared-las": ("shared-las", "none"), "shared-noisy": ("shared", "noisy")}

Runs = dict[str, Callable[[], Log]]


@dataclass(frozen=True, slots=True)
class RunSet:
    name: str
    runs: Callable[[], Runs]  # run id -> how to make its log, in the order they are recorded
    every: int = CHECKPOINT_EVERY  # decisions per checkpoint


def scenario_log(path: Path) -> Log:
    scenario = load_scenario(path)
    return run_inputs(scenario_inputs(scenario, path.parent), scenario.settings, scenario_end(scenario))


def scenario_runs() -> Runs:
    return {path.stem: functools.partial(scenario_log, path) for path in sorted(SCENARIOS.glob("*.yaml"))}


def sequence_runs() -> Runs:
    return {f"seed-{seed:03d}": functools.partial(run_sequence, seed) for seed in range(SEQUENCES)}


def node_health_runs() -> Runs:
    return {f"seed-{seed:03d}": functools.partial(run_node_health_sequence, seed)
            for seed in range(NODE_HEALTH_SEQUENCES)}


def reference(path: Path) -> Path:
    """A reference data file; missing, the error says where it belongs (a frozen run is never skipped)."""
    if not path.exists():
        raise FileNotFoundError(f"reference data {path} is missing: the shared data folder belongs next to the "
                                f"checkout ({SHARED_DATA})")
    return path


def kueue_log(scale: float, replica_gpus: int, declare: str) -> Log:
    inputs = kueue_inputs(KUEUE_GENERATOR, scale, 8, replica_gpus, declare)
    return run_virtual(inputs, tick_s=KUEUE_TICK_S).log


def kueue_runs() -> Runs:
    return {name: functools.partial(kueue_log, *how) for name, how in KUEUE_RUNS.items()}


@functools.cache
def philly_slice() -> tuple[tuple[TraceJob, ...], dict[str, int]]:
    teams = read_teams(reference(PHILLY / "helios_philly_vc.csv"), PHILLY_SCALE)
    start, end = (parse_time(t, "window") for t in PHILLY_WINDOW)
    return tuple(read_trace(reference(PHILLY / "philly_pollux_jobs.csv"), teams, start, end).jobs), teams


def philly_log(setup_name: str, declare: str) -> Log:
    """The slice through one platform set-up, as libs/sim/trace_run.py's run_platform steps it."""
    jobs, teams = philly_slice()
    setup = parse_setups([setup_name], [declare])[0]
    inputs, _ = world_inputs(list(jobs), dict(teams), setup)
    return run_virtual(inputs, tick_s=TRACE_TICK_S, horizon_s=horizon_s(list(jobs))).log


def philly_runs() -> Runs:
    return {name: functools.partial(philly_log, *how) for name, how in PHILLY_RUNS.items()}


SETS = {s.name: s for s in (RunSet("scenarios", scenario_runs), RunSet("sequences", sequence_runs),
                            RunSet("node-health", node_health_runs), RunSet("kueue", kueue_runs),
                            RunSet("philly", philly_runs))}
