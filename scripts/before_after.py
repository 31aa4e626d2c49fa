"""Run one gpusched command on the code before a change and on the code now, back to back, and print what moved.

    scripts/before_after.py --base REV --out DIR [--rounds N] -- sim trace ... --json

The machine this runs on is shared and noisy, so figures of two revisions compare only when measured in the same
run: the rounds alternate (before, now, before, now...). The code before is a detached git worktree of REV
(made once, under the system's temp folder); both revisions run with this checkout's Python environment. Each
run's JSON goes to DIR/<before|now>.<round>.json; the table shows every number of the last round that
differs between the two (per team, in the order the JSON has them), and, for `sim trace`, each team's role.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLI = "import sys;sys.argv[0]='gpusched';from libs.cli.main import main;sys.exit(main())"


def worktree(rev: str) -> Path:
    """A detached worktree of `rev`, made once and kept for later runs."""
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    path = Path(tempfile.gettempdir()) / f"gpusched-before-{sha[:12]}"
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=ROOT, check=True,
                       capture_output=True)
    return path


def run(code: Path, args: list[str], out: Path) -> float:
    """Run the CLI from `code`, its JSON to `out`; the wall seconds it took."""
    began = time.monotonic()
    with out.open("w") as sink:
        done = subprocess.run([sys.executable, "-c", CLI, *args], cwd=code, stdout=sink,
                              env={**os.environ, "PYTHONPATH": str(code)})
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(args)} at {code} exited {done.returncode}")
    return time.monotonic() - began


def numbers(value: Any, path: str = "") -> dict[str, float]:
    """Every number of a JSON value, by its dotted path."""
    if isinstance(value, bool):
        return {}
    if isinstance(value, int | float):
        return {path: float(value)}
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in numbers(item, f"{path}.{key}" if path else key).items()}
    return {}


def roles(result: dict[str, Any]) -> dict[str, str]:
    """Each team's role in a `sim trace` result (the trace's, the same in every set-up)."""
    for setup in result.get("setups", {}).values():
        found = {team: t["role"] for team, t in setup.get("teams", {}).items() if "role" in t}
        if found:
            return found
    return {}


def by_role(result: dict[str, Any], team_role: dict[str, str]) -> dict[str, dict[str, float]]:
    """Per set-up, the mean queueing delay of the lenders' jobs and of the borrowers' (teams' means weighted by
    their jobs)."""
    out: dict[str, dict[str, float]] = {}
    for name, setup in result.get("setups", {}).items():
        for role in ("lender", "borrower"):
            teams = [t for team, t in setup.get("teams", {}).items()
                     if team_role.get(team) == role and t.get("mean_queueing_delay_s") is not None]
            jobs = sum(t["jobs"] for t in teams)
            if jobs:
                out.setdefault(name, {})[role] = sum(t["mean_queueing_delay_s"] * t["jobs"] for t in teams) / jobs
    return out


def report(before: dict[str, Any], now: dict[str, Any]) -> None:
    old, new = numbers(before), numbers(now)
    team_role = roles(now) or roles(before)
    width = max((len(k) for k in new), default=10)
    print(f"{'figure':<{width}}  {'before':>14}  {'now':>14}  {'now/before':>10}")
    for key, value in new.items():
        was = old.get(key)
        if was is None or was == value:
            continue  # the same, or a figure the code before did not have
        ratio = f"{value / was:.3f}" if was else "-"
        team = next((t for t in team_role if f".teams.{t}." in key), None)
        label = key + (f" [{team_role[team]}]" if team is not None else "")
        print(f"{label:<{width}}  {was:>14g}  {value:>14g}  {ratio:>10}")
    old_roles, new_roles = by_role(before, team_role), by_role(now, team_role)
    for setup, waits in new_roles.items():
        for role, wait in waits.items():
            was = old_roles.get(setup, {}).get(role)
            print(f"{setup}: mean queueing delay of the {role}s' jobs: "
                  f"{'-' if was is None else f'{was:.1f}'} s -> {wait:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the revision before the change")
    parser.add_argument("--out", required=True, type=Path, help="folder for each run's JSON")
    parser.add_argument("--rounds", type=int, default=1, help="before/now pairs, alternating")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the gpusched arguments (with --json)")
    opts = parser.parse_args()
    args = opts.command[1:] if opts.command[:1] == ["--"] else opts.command
    if not args:
        parser.error("no gpusched command after --")
    opts.out.mkdir(parents=True, exist_ok=True)
    before_code = worktree(opts.base)
    for round_ in range(1, opts.rounds + 1):
        for name, code in (("before", before_code), ("now", ROOT)):
            print(f"round {round_}/{opts.rounds}: {name} ({code}) ...", file=sys.stderr, flush=True)
            took = run(code, args, opts.out / f"{name}.{round_}.json")
            print(f"round {round_}/{opts.rounds}: {name} took {took:.1f} s", file=sys.stderr, flush=True)
    last = opts.rounds
    report(json.loads((opts.out / f"before.{last}.json").read_text()),
           json.loads((opts.out / f"now.{last}.json").read_text()))


if __name__ == "__main__":
    main()
