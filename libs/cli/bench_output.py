"""What every `gpusched bench` command shares: stopping cleanly on Ctrl-C or SIGTERM, and printing the figures
as JSON or a table."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console(stderr=True)


def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def interruptible(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run a benchmark; Ctrl-C or SIGTERM stops it (its platform is stopped on the way out) with status 130."""
    try:
        return run()
    except KeyboardInterrupt:
        console.print("interrupted: the platform and its servers are stopped")
        sys.exit(130)


def report(args: argparse.Namespace, result: dict[str, Any], table: Callable[[dict[str, Any]], Table],
            failed: bool) -> None:
    """The figures as JSON (--json) or a table; status 1 when the run failed its own checks."""
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        console.print(table(result))
    if failed:
        sys.exit(1)


def fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}{unit}" if isinstance(value, float) else f"{value:,}{unit}"
