"""Digests of many seeded pipeline sequences, to compare two revisions of the deciders beyond the frozen net:

    .venv/bin/python scripts/sequence_digests.py --seeds 100-699 --out after.json
    (in a checkout of the other revision)  python scripts/sequence_digests.py --seeds 100-699 --out before.json
    .venv/bin/python scripts/sequence_digests.py --compare before.json after.json

Each seed is one world of libs/sim/frozen/sequences.py, recorded as the frozen net records a run (a count and
a SHA-256 per decider). A refactoring that decides nothing differently gives the same file. Progress goes to
stderr."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from libs.sim.frozen.digest import record_of
from libs.sim.frozen.sequences import run_sequence

CHECKPOINT_EVERY = 50


def parse_seeds(text: str) -> range:
    first, _, last = text.partition("-")
    return range(int(first), int(last or first) + 1)


def record(seeds: range, out: Path) -> None:
    records = {}
    for i, seed in enumerate(seeds, start=1):
        records[str(seed)] = record_of(run_sequence(seed), CHECKPOINT_EVERY)
        if i % 50 == 0 or i == len(seeds):
            print(f"{i}/{len(seeds)} sequences", file=sys.stderr, flush=True)
    out.write_text(json.dumps(records, indent=1, sort_keys=True))


def compare(before: Path, after: Path) -> int:
    old, new = json.loads(before.read_text()), json.loads(after.read_text())
    differing = sorted((s for s in old.keys() & new.keys() if old[s] != new[s]), key=int)
    decisions = sum(sum(d["count"] for d in r["decisions"].values()) for r in new.values())
    print(f"{len(old.keys() & new.keys())} sequences compared ({decisions} decisions): {len(differing)} differ"
          + (f", first seeds {differing[:10]}" if differing else ""))
    return 1 if differing else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("100-699"), help="FIRST-LAST")
    parser.add_argument("--out", type=Path, help="write the digests of --seeds here")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        sys.exit(compare(*args.compare))
    if args.out is None:
        parser.error("--out or --compare")
    record(args.seeds, args.out)


if __name__ == "__main__":
    main()
