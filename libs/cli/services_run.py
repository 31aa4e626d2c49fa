"""`gpusched service NAME`: one service in the foreground."""

from __future__ import annotations

import argparse
import importlib

from libs.runtime.settings import SERVICES
from libs.runtime.supervisor import MODULES


def cmd_service(args: argparse.Namespace) -> None:
    importlib.import_module(f"{MODULES[args.name]}.app").main()


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("service", help="run one service in the foreground")
    p.add_argument("name", choices=SERVICES)
    p.set_defaults(func=cmd_service)
