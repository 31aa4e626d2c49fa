"""Record what today's deciders decide on the frozen net's sets of runs (libs/sim/frozen/sets.py), or check
that they still decide exactly that:

    .venv/bin/python scripts/freeze_decisions.py                  # record every set
    .venv/bin/python scripts/freeze_decisions.py --set scenarios  # record one set
    .venv/bin/python scripts/freeze_decisions.py --check          # compare, exit 1 with where they part

Each set's record is tests/golden/frozen/<set>.json (libs/sim/frozen/store.py). A change to the decision core
that is meant to decide nothing differently must pass --check; one that is meant to re-records the sets it
changes and says in its commit message what changed and why. Progress goes to stderr."""

from __future__ import annotations

import argparse
import sys
import time

from libs.sim.frozen.compare import Difference, differences
from libs.sim.frozen.digest import RunRecord, record_of
from libs.sim.frozen.sets import SETS, RunSet
from libs.sim.frozen.store import frozen_path, read_frozen, rerecord_hint, write_frozen


def record_set(run_set: RunSet) -> dict[str, RunRecord]:
    """Every run of the set, made and recorded, with a line of progress each."""
    runs = run_set.runs()
    records: dict[str, RunRecord] = {}
    for i, (run_id, make) in enumerate(runs.items(), start=1):
        began = time.perf_counter()
        record = record_of(make(), run_set.every)
        records[run_id] = record
        decided = sum(s["count"] for s in record["decisions"].values())
        print(f"[{run_set.name} {i}/{len(runs)}] {run_id}: {record['events']} events, {decided} decisions, "
              f"{time.perf_counter() - began:.1f} s", file=sys.stderr, flush=True)
    return records


def set_differences(run_set: RunSet, fresh: dict[str, RunRecord]) -> list[Difference]:
    frozen = read_frozen(run_set.name)
    if frozen is None:
        return [Difference(run_set.name, "file", f"{frozen_path(run_set.name)} was never recorded")]
    out = [Difference(f"{run_set.name}/{r}", "run", "frozen, but the set no longer has it")
           for r in frozen["runs"] if r not in fresh]
    out += [Difference(f"{run_set.name}/{r}", "run", "in the set, but never frozen") for r in fresh
            if r not in frozen["runs"]]
    for run_id, record in fresh.items():
        if run_id in frozen["runs"]:
            out += differences(f"{run_set.name}/{run_id}", frozen["runs"][run_id], record, frozen["checkpoint_every"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", default="all", choices=["all", *SETS], help="the set to record or check")
    parser.add_argument("--check", action="store_true", help="compare with the frozen files instead of writing")
    args = parser.parse_args(argv)
    chosen = list(SETS.values()) if args.set == "all" else [SETS[args.set]]
    failed = False
    for run_set in chosen:
        fresh = record_set(run_set)
        if not args.check:
            path = write_frozen(run_set.name, run_set.every, fresh)
            print(f"{path}: {len(fresh)} runs, {path.stat().st_size:,} bytes")
            continue
        found = set_differences(run_set, fresh)
        if found:
            failed = True
            print(f"{run_set.name}: {len(found)} difference(s) from the frozen decisions:")
            print("\n".join(f"  {d}" for d in found))
            print(f"  {rerecord_hint(run_set.name)}")
        else:
            print(f"{run_set.name}: {len(fresh)} runs decide as frozen")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
