"""The `gpusched` command."""

from __future__ import annotations

import argparse
import importlib
import sys

from libs.cli import (
    audit,
    bench,
    jobs,
    kube,
    nats_config,
    nodes,
    queues,
    report,
    services,
    sim,
    snapshots,
    submit,
    tokens,
    up,
)
from libs.cli.client import ApiError
from libs.cli.output import add_json_flag, has_json_flag
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
    submit.add_command(sub)
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
    kube.add_commands(sub)
    parser.set_defaults(json=False)
    for command in sub.choices.values():
        _json_before_subcommand(command)
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    return [p for a in parser._actions if isinstance(a, argparse._SubParsersAction) for p in a.choices.values()]


def _json_before_subcommand(parser: argparse.ArgumentParser) -> bool:
    """Whether every command under `parser` prints JSON with --json; a group of such commands takes the flag
    before the subcommand as well (`gpusched node --json cordon n1`). A command without a JSON form has no
    --json at all (argparse refuses it), so the flag never promises what a command does not do."""
    children = _subcommands(parser)
    if not children:
        for action in parser._actions:
            if action.dest == "json":  # however a command declared it: absent unless given (see output.py)
                action.default = argparse.SUPPRESS
        return has_json_flag(parser)
    every = all([_json_before_subcommand(child) for child in children])  # a list: every group gets its flag
    if every and not has_json_flag(parser):
        add_json_flag(parser, help="machine-readable output (also accepted after the subcommand)")
    return every


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except ApiError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2 if err.status and err.status < 500 else 1)
    except (OSError, TimeoutError, RuntimeError, ValueError) as err:  # OSError: files, connections
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
