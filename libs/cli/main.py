"""The `gpusched` command."""

from __future__ import annotations

import argparse
import importlib
import sys

from libs.cli.client import ApiError
from libs.cli.output import add_json_flag, has_json_flag

# Each command's module, in the order `gpusched --help` lists them. A command imports only its own module (and
# what that imports): a read command starts in a fraction of a second instead of loading every decision core.
COMMANDS: dict[str, str] = {
    "up": "up", "service": "services_run", "submit": "submit",
    **dict.fromkeys(("jobs", "job", "cancel", "explain", "wait", "usage"), "jobs"),
    **dict.fromkeys(("queues", "queue"), "queues"),
    **dict.fromkeys(("audit", "whatif"), "audit"),
    "report": "report",
    **dict.fromkeys(("nodes", "node", "logs", "checkpoint"), "nodes"),
    "agent": "agent",
    "inference": "services", "sim": "sim", "bench": "bench", "snapshots": "snapshots",
    **dict.fromkeys(("nats-config", "nats-setup"), "nats_config"),
    "token": "tokens",
    **dict.fromkeys(("kube", "dev-cluster"), "kube"),
}


def _add_module(sub: argparse._SubParsersAction, module: str) -> None:
    mod = importlib.import_module(f"libs.cli.{module}")
    (getattr(mod, "add_commands", None) or mod.add_command)(sub)


def _command_of(argv: list[str]) -> str | None:
    """The command named on the line (its first word that is no option), if it is one."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in COMMANDS else None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser of the command `argv` names (only its module is loaded), or of every command (help, a typo,
    or argv None: the whole CLI, as tests and docs read it)."""
    parser = argparse.ArgumentParser(prog="gpusched", description="GPU scheduling platform")
    sub = parser.add_subparsers(dest="command", required=True)
    command = _command_of(argv) if argv is not None else None
    for module in dict.fromkeys([COMMANDS[command]] if command else COMMANDS.values()):
        _add_module(sub, module)
    parser.set_defaults(json=False)
    for choice in sub.choices.values():
        _json_before_subcommand(choice)
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
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
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
