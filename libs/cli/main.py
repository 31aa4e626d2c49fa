"""The `gpusched` command."""

from __future__ import annotations

import argparse
import importlib
import sys

from libs.cli import audit, bench, jobs, nats_config, nodes, queues, report, services, sim, snapshots, tokens, up
from libs.cli.client import ApiError
from libs.runtime.settings import SERVICES
from libs.runtime.supervisor import MODULES


def cmd_service(args: argparse.Namespace) -> None:
    importlib.import_module(f"{MODULES[args.name]}.app").main()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpusched", description="GPU scheduling platform")
    sub = parser.add_subparsers(dest="command", required=True)
    up.add_command(sub)
    p = sub.add_parser("service", help="run one service in the foreground")
    p.add_argument("name", choices=SERVICES)
    p.set_defaults(func=cmd_service)
    jobs.add_commands(sub)
    queues.add_commands(sub)
    audit.add_command(sub)
    report.add_command(sub)
    nodes.add_commands(sub)
    services.add_commands(sub)
    sim.add_command(sub)
    bench.add_command(sub)
    snapshots.add_command(sub)
    nats_config.add_command(sub)
    tokens.add_command(sub)
    for action in sub.choices.values():
        if not any(a.dest == "json" for a in action._actions):
            action.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except ApiError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2 if err.status and err.status < 500 else 1)
    except (FileNotFoundError, TimeoutError, RuntimeError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
