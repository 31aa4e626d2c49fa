"""How long the CLI's read commands take against a running API, this checkout against another revision, back to
back (the machine is shared and noisy: only figures of one run compare).

    .venv/bin/python scripts/cli_startup.py --api http://127.0.0.1:8080 [--base REV] [--rounds 7]

Without --base, only this checkout. The other revision is checked out in a temporary worktree and run with
this checkout's virtual environment.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMANDS = (["jobs"], ["nodes"], ["queues"], ["usage"])


def timed(cwd: Path, argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "libs.cli.main", *argv], cwd=cwd, env={**env, "PYTHONPATH": str(cwd)},
                   capture_output=True, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", required=True, help="a running platform's API")
    parser.add_argument("--base", help="a git revision to compare with")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    env = {**os.environ, "GPUSCHED_API": args.api}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this checkout": REPO}
        if args.base:
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", tmp, args.base], check=True)
            trees = {args.base: Path(tmp), **trees}
        try:
            bare = statistics.median(timed_bare() for _ in range(args.rounds))
            print(f"python itself: {bare:.3f} s")
            for argv in COMMANDS:
                times: dict[str, list[float]] = {name: [] for name in trees}
                for i in range(args.rounds):
                    print(f"\r{argv[0]}: round {i + 1}/{args.rounds}", end="", file=sys.stderr, flush=True)
                    for name, tree in trees.items():
                        times[name].append(timed(tree, argv, env))
                print("\r", end="", file=sys.stderr)
                print(f"gpusched {argv[0]}: " + ", ".join(f"{name} median {statistics.median(t):.3f} s"
                                                          for name, t in times.items()))
        finally:
            if args.base:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", tmp], check=False)


def timed_bare() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
