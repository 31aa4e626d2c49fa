"""What a command prints for scripts and for people: its --json and -o wide flags.

With --json a command prints exactly one JSON document on standard output (progress, statuses and notes go
to standard error); a command without a JSON form has no --json flag, so argparse refuses it. The flag is
added with SUPPRESS as its default and the top-level parser defaults `json` to False: a subcommand's own
default then never overwrites a --json given before it (`gpusched node --json cordon n1`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def add_json_flag(parser: argparse.ArgumentParser, help: str = "machine-readable output: one JSON document") -> None:
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=help)


def has_json_flag(parser: argparse.ArgumentParser) -> bool:
    return any(a.dest == "json" for a in parser._actions)


class _Output(argparse.Action):
    """-o wide | -o json (the latter is --json, for those used to kubectl)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        if values == "json":
            namespace.json = True
        else:
            namespace.output = values


def add_table_flags(parser: argparse.ArgumentParser) -> None:
    """--json, and -o wide / --wide: every column instead of the short set that fits 80 columns."""
    add_json_flag(parser)
    parser.add_argument("-o", "--output", choices=("wide", "json"), action=_Output, default="short",
                        help="wide: every column (the default is a short set that fits 80 columns); json: --json")
    parser.add_argument("--wide", dest="output", action="store_const", const="wide", default="short",
                        help="the same as -o wide")


def wide(args: argparse.Namespace) -> bool:
    return getattr(args, "output", "short") == "wide"
